// Integer arguments of the core bindings taken as Python objects and converted here, so that a
// wrong type or a value outside the C++ type is a TypeError / ValueError naming the argument
// instead of nanobind's "incompatible function arguments" dump of the whole signature (which
// names neither the argument nor the reason).
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <limits>
#include <string>

#include "pagedkv/error.h"

namespace pagedkv::python {

// `obj` as a T: any object with __index__ (int, numpy / torch integer scalar; not float, not
// str), in T's range.
template <typename T>
T int_arg(nanobind::handle obj, const char* name) {
  PyObject* index = PyNumber_Index(obj.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    throw TypeError(
        detail::concat(name, " must be an integer, got ", nanobind::type_name(obj.type()).c_str()));
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
  Py_DECREF(index);
  if (overflow != 0 || v < static_cast<long long>(std::numeric_limits<T>::min()) ||
      v > static_cast<long long>(std::numeric_limits<T>::max())) {
    throw ValueError(detail::concat(
        name, " = ", nanobind::str(obj).c_str(), " is out of range: it must fit in [",
        std::numeric_limits<T>::min(), ", ", std::numeric_limits<T>::max(), "]"));
  }
  return static_cast<T>(v);
}

}  // namespace pagedkv::python
