// pagedkv._C: the extension module. Maps pagedkv's C++ errors to Python exceptions and calls
// each concept's registration function.
#include <nanobind/nanobind.h>

#include "pagedkv/error.h"
#include "python/bindings.h"

namespace nb = nanobind;

NB_MODULE(_C, m) {
  m.doc() = "pagedkv C++ core: block allocator, scheduler and paged-attention ops";
  // std::invalid_argument -> ValueError, std::out_of_range -> IndexError and std::bad_alloc ->
  // MemoryError are nanobind's defaults; TypeError needs its own translator.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const pagedkv::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    }
  });
  pagedkv::python::bind_info(m);
  pagedkv::python::bind_allocator(m);
  pagedkv::python::bind_scheduler(m);
  pagedkv::python::bind_ops(m);
  pagedkv::python::bind_moe(m);
  pagedkv::python::bind_lora(m);
  pagedkv::python::bind_quant(m);
  pagedkv::python::bind_layer_ops(m);
  pagedkv::python::bind_sampling_ops(m);
}
