// Placeholder: filled in by the ops work.
#include "python/bindings.h"

namespace pagedkv::python {

void bind_ops(nanobind::module_&) {}

}  // namespace pagedkv::python
