// Placeholder: filled in by the allocator work.
#include "python/bindings.h"

namespace pagedkv::python {

void bind_allocator(nanobind::module_&) {}

}  // namespace pagedkv::python
