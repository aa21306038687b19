// Placeholder: filled in by the scheduler work.
#include "python/bindings.h"

namespace pagedkv::python {

void bind_scheduler(nanobind::module_&) {}

}  // namespace pagedkv::python
