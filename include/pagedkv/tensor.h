// TensorView: a non-owning view of a strided n-d array (data pointer, dtype, device, shape,
// strides), built from a DLTensor or from a raw pointer + shape. Every op takes its arrays as
// TensorViews, so the same kernels serve numpy, torch, cupy and jax callers and C++ programs.
//
// Strides are in elements (as in DLPack). Validation helpers throw ValueError / TypeError with
// a message that names the argument, so a bad call is an exception, never a crash.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "pagedkv/dlpack.h"
#include "pagedkv/error.h"

namespace pagedkv {

enum class DType : uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat64,
  kUInt8,  // also the storage type of fp8 KV caches
  kInt8,
  kInt32,
  kInt64,
  kBool,
};

std::string_view dtype_name(DType dtype);
size_t dtype_size(DType dtype);
// Maps a DLPack dtype to ours; throws TypeError naming `arg` for anything we do not support.
DType dtype_from_dlpack(DLDataType dt, std::string_view arg = "tensor");
DLDataType dtype_to_dlpack(DType dtype);

enum class DeviceType : uint8_t { kCPU, kCUDA, kCUDAHost };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int id = 0;

  bool is_cpu() const { return type != DeviceType::kCUDA; }  // pinned host memory is CPU memory
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && id == o.id; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

// A CUDA stream handle as an opaque pointer (cudaStream_t), so headers need no CUDA include.
using Stream = void*;

class TensorView {
 public:
  static constexpr int kMaxDims = 8;

  TensorView() = default;
  // Raw pointer + shape (+ strides in elements; empty means row-major contiguous).
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {},
             std::initializer_list<int64_t> strides = {});
  TensorView(void* data, DType dtype, const int64_t* shape, int ndim, Device device = {},
             const int64_t* strides = nullptr);
  // Views a DLTensor (byte_offset applied); throws for unsupported dtypes or devices.
  static TensorView from_dlpack(const DLTensor& t, std::string_view arg = "tensor");

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return ndim_; }
  int64_t size(int dim) const { return shape_[wrap(dim)]; }
  int64_t stride(int dim) const { return strides_[wrap(dim)]; }
  const int64_t* shape() const { return shape_.data(); }
  const int64_t* strides() const { return strides_.data(); }
  int64_t numel() const;
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool defined() const { return ndim_ >= 0 && (data_ != nullptr || numel() == 0); }
  // Row-major contiguous. An array with no elements is contiguous whatever its strides (numpy
  // and torch give size-0 arrays arbitrary strides, e.g. all 0).
  bool is_contiguous() const;
  // True when the last dimension is contiguous (stride 1 or size 1), or there are no elements.
  bool is_last_dim_contiguous() const {
    return ndim_ == 0 || size(-1) == 1 || stride(-1) == 1 || numel() == 0;
  }
  std::string shape_str() const;

 private:
  int wrap(int dim) const { return dim < 0 ? dim + ndim_ : dim; }

  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  Device device_{};
  int ndim_ = -1;  // -1: undefined (e.g. an absent optional argument)
  std::array<int64_t, kMaxDims> shape_{};
  std::array<int64_t, kMaxDims> strides_{};
};

// ---- validation helpers: each throws with `arg` in the message ----------------------------

void check_ndim(const TensorView& t, std::string_view arg, int ndim);
void check_dtype(const TensorView& t, std::string_view arg, std::initializer_list<DType> allowed);
void check_contiguous(const TensorView& t, std::string_view arg);
// Each entry of `shape` is a required size, or -1 for "any".
void check_shape(const TensorView& t, std::string_view arg, std::initializer_list<int64_t> shape);
void check_same_device(const TensorView& a, std::string_view arg_a, const TensorView& b,
                       std::string_view arg_b);

}  // namespace pagedkv
