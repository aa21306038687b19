// TensorView construction from DLPack and the argument-validation helpers.
#include "pagedkv/tensor.h"

namespace pagedkv {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kUInt8:
    case DType::kInt8:
    case DType::kBool: return 1;
  }
  return 0;
}

DType dtype_from_dlpack(DLDataType dt, std::string_view arg) {
  PAGEDKV_CHECK_TYPE(dt.lanes == 1, arg, ": vector dtypes (lanes=", dt.lanes,
                     ") are not supported");
  const int code = dt.code, bits = dt.bits;
  if (code == kDLFloat && bits == 32) return DType::kFloat32;
  if (code == kDLFloat && bits == 16) return DType::kFloat16;
  if (code == kDLFloat && bits == 64) return DType::kFloat64;
  if (code == kDLBfloat && bits == 16) return DType::kBFloat16;
  if (code == kDLUInt && bits == 8) return DType::kUInt8;
  if (code == kDLInt && bits == 8) return DType::kInt8;
  if (code == kDLInt && bits == 32) return DType::kInt32;
  if (code == kDLInt && bits == 64) return DType::kInt64;
  if (code == kDLBool && bits == 8) return DType::kBool;
  // DLPack >= 1.1's fp8 codes (torch.float8_e4m3fn is kDLFloat8_e4m3fn = 10). By number when an
  // older <dlpack/dlpack.h> on the include path replaced the vendored v1.3 header.
#if defined(DLPACK_MAJOR_VERSION) && (DLPACK_MAJOR_VERSION > 1 || DLPACK_MINOR_VERSION >= 1)
  constexpr int kFirstFp8 = kDLFloat8_e3m4, kLastFp8 = kDLFloat8_e8m0fnu;
#else
  constexpr int kFirstFp8 = 7, kLastFp8 = 14;
#endif
  if (bits == 8 && code >= kFirstFp8 && code <= kLastFp8) {
    throw TypeError(detail::concat(
        arg, ": fp8 arrays (DLPack code ", code,
        ") are not accepted as such: fp8 KV caches are uint8 arrays holding the fp8 bytes "
        "(torch: cache.view(torch.uint8)) with kv_cache_dtype 'fp8', 'fp8_e4m3' or 'fp8_e5m2'"));
  }
  throw TypeError(
      detail::concat(arg, ": unsupported dtype (DLPack code ", code, ", ", bits, " bits)"));
}

DLDataType dtype_to_dlpack(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return {kDLFloat, 32, 1};
    case DType::kFloat16: return {kDLFloat, 16, 1};
    case DType::kBFloat16: return {kDLBfloat, 16, 1};
    case DType::kFloat64: return {kDLFloat, 64, 1};
    case DType::kUInt8: return {kDLUInt, 8, 1};
    case DType::kInt8: return {kDLInt, 8, 1};
    case DType::kInt32: return {kDLInt, 32, 1};
    case DType::kInt64: return {kDLInt, 64, 1};
    case DType::kBool: return {kDLBool, 8, 1};
  }
  return {kDLFloat, 32, 1};
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::kCPU: return "cpu";
    case DeviceType::kCUDAHost: return "cuda_host";
    case DeviceType::kCUDA: return "cuda:" + std::to_string(id);
  }
  return "unknown";
}

TensorView::TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device,
                       std::initializer_list<int64_t> strides)
    : TensorView(data, dtype, shape.begin(), static_cast<int>(shape.size()), device,
                 strides.size() == 0 ? nullptr : strides.begin()) {
  PAGEDKV_CHECK(strides.size() == 0 || strides.size() == shape.size(),
                "strides must have one entry per dimension");
}

TensorView::TensorView(void* data, DType dtype, const int64_t* shape, int ndim, Device device,
                       const int64_t* strides)
    : data_(data), dtype_(dtype), device_(device), ndim_(ndim) {
  PAGEDKV_CHECK(ndim >= 0 && ndim <= kMaxDims, "tensor rank ", ndim, " is not in [0, ", kMaxDims,
                "]");
  PAGEDKV_CHECK(shape != nullptr || ndim == 0, "tensor of rank ", ndim, " has a null shape");
  int64_t running = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    PAGEDKV_CHECK(shape[d] >= 0, "negative dimension ", shape[d]);
    shape_[d] = shape[d];
    strides_[d] = strides ? strides[d] : running;
    running *= shape[d];
  }
}

TensorView TensorView::from_dlpack(const DLTensor& t, std::string_view arg) {
  Device device;
  switch (t.device.device_type) {
    case kDLCPU: device = {DeviceType::kCPU, 0}; break;
    case kDLCUDAHost: device = {DeviceType::kCUDAHost, 0}; break;
    case kDLCUDA: device = {DeviceType::kCUDA, t.device.device_id}; break;
    default:
      throw TypeError(detail::concat(arg, ": unsupported device type ",
                                     static_cast<int>(t.device.device_type),
                                     " (expected CPU or CUDA)"));
  }
  PAGEDKV_CHECK(t.ndim >= 0 && t.ndim <= kMaxDims, arg, ": rank ", t.ndim, " is not in [0, ",
                kMaxDims, "]");
  PAGEDKV_CHECK(t.shape != nullptr || t.ndim == 0, arg, ": DLTensor of rank ", t.ndim,
                " has a null shape pointer");
  for (int d = 0; d < t.ndim; ++d)
    PAGEDKV_CHECK(t.shape[d] >= 0, arg, ": dimension ", d, " has negative size ", t.shape[d]);
  char* data = static_cast<char*>(t.data) + t.byte_offset;
  return TensorView(data, dtype_from_dlpack(t.dtype, arg), t.shape, t.ndim, device, t.strides);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= shape_[d];
  return n;
}

bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (int d = 0; d < ndim_; ++d) detail::append(s, d ? ", " : ""), detail::append(s, shape_[d]);
  return s + "]";
}

void check_ndim(const TensorView& t, std::string_view arg, int ndim) {
  PAGEDKV_CHECK(t.ndim() == ndim, arg, " must have rank ", ndim, ", got shape ", t.shape_str());
}

void check_dtype(const TensorView& t, std::string_view arg, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::string msg = detail::concat(arg, " has dtype ", dtype_name(t.dtype()), ", expected ");
  bool first = true;
  for (DType d : allowed) {
    msg += detail::concat(first ? "" : " or ", dtype_name(d));
    first = false;
  }
  throw TypeError(msg);
}

void check_contiguous(const TensorView& t, std::string_view arg) {
  PAGEDKV_CHECK(t.is_contiguous(), arg, " must be contiguous (shape ", t.shape_str(), ")");
}

void check_shape(const TensorView& t, std::string_view arg, std::initializer_list<int64_t> shape) {
  bool ok = t.ndim() == static_cast<int>(shape.size());
  int d = 0;
  for (int64_t s : shape) {
    if (ok && s >= 0 && t.size(d) != s) ok = false;
    ++d;
  }
  if (ok) return;
  std::string msg = detail::concat(arg, " has shape ", t.shape_str(), ", expected [");
  d = 0;
  for (int64_t s : shape) {
    msg += d++ ? ", " : "";
    msg += s >= 0 ? std::to_string(s) : std::string("*");
  }
  throw ValueError(msg + "]");
}

void check_same_device(const TensorView& a, std::string_view arg_a, const TensorView& b,
                       std::string_view arg_b) {
  PAGEDKV_CHECK(a.device() == b.device(), arg_a, " is on ", a.device().str(), " but ", arg_b,
                " is on ", b.device().str());
}

}  // namespace pagedkv
