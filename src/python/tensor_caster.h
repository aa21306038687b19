// Conversion of Python array arguments (any __dlpack__ / buffer-protocol object) into
// TensorViews.
//
// Bindings take arrays as InArray (arrays the op only reads) or OutArray (arrays it writes).
// Their casters never reject an object: nanobind's own rejection is a TypeError listing the
// whole signature ("incompatible function arguments"), naming neither the argument nor the
// reason. Instead the caster records what it got and to_view() raises an error naming the
// argument: TypeError for something that is not an array, ValueError for a read-only output.
// Arrays are imported with no dtype / device constraint, so nanobind never copies them (caches
// are written in place); TensorView validation reports everything else by name.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "pagedkv/error.h"
#include "pagedkv/tensor.h"

namespace pagedkv::python {

enum class ArrayStatus : uint8_t { kOk, kReadOnly, kNotArray, kBigEndian };

// An array argument as received from Python. `Writable`: the op writes it, so a read-only
// array (numpy setflags(write=False), np.broadcast_to, a read-only memmap, a DLPack >= 1.0
// capsule flagged read-only) is an error; inputs accept read-only arrays.
template <bool Writable>
struct ArrayArg {
  // Set when status == kOk: `rw` for a writable argument, `ro` for an input.
  nanobind::ndarray<> rw;
  nanobind::ndarray<nanobind::ro> ro;
  ArrayStatus status = ArrayStatus::kNotArray;
  std::string type_name;  // of the Python object, for the error message
};
using InArray = ArrayArg<false>;
using OutArray = ArrayArg<true>;

template <typename... Args>
TensorView view_of(const nanobind::ndarray<Args...>& a, std::string_view arg) {
  DLTensor t{};
  // nanobind's data() already includes the DLPack byte_offset. Read-only inputs are never
  // written by the ops (their TensorViews are simply not const-qualified).
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
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

template <bool Writable>
TensorView to_view(const ArrayArg<Writable>& a, std::string_view arg) {
  if (a.status == ArrayStatus::kNotArray) {
    throw TypeError(::pagedkv::detail::concat(
        arg,
        " must be an array (numpy, torch, cupy, jax or any __dlpack__ / buffer-protocol "
        "object), got ",
        a.type_name, " (it could not be imported through DLPack or the buffer protocol)"));
  }
  if (a.status == ArrayStatus::kBigEndian) {
    // DLPack has no byte order, so such an array cannot be imported; say so rather than
    // "must be an array".
    throw TypeError(
        ::pagedkv::detail::concat(arg, " is a big-endian array (dtype ", a.type_name,
                                  "): the ops take native byte order; convert it first, e.g. "
                                  "arr.astype(arr.dtype.newbyteorder('='))"));
  }
  if (a.status == ArrayStatus::kReadOnly) {
    throw ValueError(::pagedkv::detail::concat(arg,
                                               " is read-only: the op writes into it (pass "
                                               "a writable array)"));
  }
  if constexpr (Writable) {
    return view_of(a.rw, arg);
  } else {
    return view_of(a.ro, arg);
  }
}

template <bool Writable>
std::optional<TensorView> to_view(const std::optional<ArrayArg<Writable>>& a,
                                  std::string_view arg) {
  if (!a) return std::nullopt;
  return to_view(*a, arg);
}

// A CUDA stream passed from Python as an integer handle (0 = the legacy default stream).
inline Stream to_stream(uintptr_t handle) { return reinterpret_cast<Stream>(handle); }

}  // namespace pagedkv::python

namespace nanobind::detail {

template <bool Writable>
struct type_caster<pagedkv::python::ArrayArg<Writable>> {
  using Arg = pagedkv::python::ArrayArg<Writable>;
  // Same stub type as a plain nb::ndarray<> argument.
  NB_TYPE_CASTER(Arg, make_caster<ndarray<>>::Name)

  // `Flags` is uint8_t or uint32_t depending on the nanobind version.
  template <typename Flags>
  bool from_python(handle src, Flags flags, cleanup_list* cleanup) noexcept {
    using pagedkv::python::ArrayStatus;
    // Never convert (a converted copy of an output would be written and thrown away).
    const Flags no_convert = static_cast<Flags>(flags & ~static_cast<Flags>(cast_flags::convert));
    value = Arg{};
    if constexpr (Writable) {
      // A writable import first: nanobind refuses read-only arrays there, which is how we
      // learn that an output is read-only (torch tensors are never read-only).
      make_caster<ndarray<>> rw;
      if (rw.from_python(src, no_convert, cleanup)) {
        value.rw = std::move(rw.value);
        value.status = ArrayStatus::kOk;
        return true;
      }
      PyErr_Clear();
    }
    make_caster<ndarray<ro>> ro_caster;
    if (ro_caster.from_python(src, no_convert, cleanup)) {
      value.ro = std::move(ro_caster.value);
      value.status = Writable ? ArrayStatus::kReadOnly : ArrayStatus::kOk;
      return true;
    }
    PyErr_Clear();
    if (big_endian_dtype(src.ptr(), &value.type_name)) {
      value.status = ArrayStatus::kBigEndian;
      return true;
    }
    value.status = ArrayStatus::kNotArray;
    PyObject* name =
        PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(src.ptr())), "__name__");
    const char* s = name ? PyUnicode_AsUTF8AndSize(name, nullptr) : nullptr;
    value.type_name = s ? s : "an unknown object";
    Py_XDECREF(name);
    PyErr_Clear();
    return true;
  }

  static handle from_cpp(const Arg&, rv_policy, cleanup_list*) noexcept { return handle(); }

  // True if `obj` has a numpy-style dtype whose byteorder is '>' (big-endian); `dtype_str`
  // gets the dtype's str() ('>i4'). Never raises: any failure means "no".
  static bool big_endian_dtype(PyObject* obj, std::string* dtype_str) noexcept {
    PyObject* dtype = PyObject_GetAttrString(obj, "dtype");
    PyObject* order = dtype ? PyObject_GetAttrString(dtype, "byteorder") : nullptr;
    const char* o =
        order && PyUnicode_Check(order) ? PyUnicode_AsUTF8AndSize(order, nullptr) : nullptr;
    const bool big = o != nullptr && o[0] == '>' && o[1] == '\0';
    if (big) {
      PyObject* text = PyObject_Str(dtype);
      const char* s = text ? PyUnicode_AsUTF8AndSize(text, nullptr) : nullptr;
      *dtype_str = s ? s : ">";
      Py_XDECREF(text);
    }
    Py_XDECREF(order);
    Py_XDECREF(dtype);
    PyErr_Clear();
    return big;
  }
};

}  // namespace nanobind::detail
