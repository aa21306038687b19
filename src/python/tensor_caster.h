// Conversion of nanobind ndarrays (any __dlpack__ / buffer-protocol object) into TensorViews.
// Bindings take arrays as `nb::ndarray<>` (no dtype/device constraint, so no silent copy) and
// validate through TensorView, which reports errors naming the argument.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string_view>

#include "pagedkv/tensor.h"

namespace pagedkv::python {

using Array = nanobind::ndarray<>;

inline TensorView to_view(const Array& a, std::string_view arg) {
  DLTensor t{};
  t.data = a.data();  // nanobind's data() already includes the DLPack byte_offset
  t.device.device_type = static_cast<DLDeviceType>(a.device_type());
  t.device.device_id = a.device_id();
  t.ndim = static_cast<int32_t>(a.ndim());
  const auto dt = a.dtype();
  t.dtype = DLDataType{dt.code, dt.bits, dt.lanes};
  t.shape = const_cast<int64_t*>(a.shape_ptr());
  t.strides = const_cast<int64_t*>(a.stride_ptr());
  t.byte_offset = 0;
  return TensorView::from_dlpack(t, arg);
}

inline std::optional<TensorView> to_view(const std::optional<Array>& a, std::string_view arg) {
  if (!a) return std::nullopt;
  return to_view(*a, arg);
}

// A CUDA stream passed from Python as an integer handle (0 = the legacy default stream).
inline Stream to_stream(uintptr_t handle) { return reinterpret_cast<Stream>(handle); }

}  // namespace pagedkv::python
