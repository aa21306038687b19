// Version and build information.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "pagedkv/version.h"
#include "python/bindings.h"

namespace nb = nanobind;

namespace pagedkv::python {

void bind_info(nb::module_& m) {
  m.attr("__version__") = version();
  m.def("cuda_available", &cuda_available,
        "True when pagedkv was built with CUDA and a CUDA device is usable now.");
  m.def("cuda_device_count", &cuda_device_count, "Number of usable CUDA devices.");
  m.def(
      "build_info",
      [] {
        BuildInfo info = build_info();
        nb::dict d;
        d["version"] = info.version;
        d["with_cuda"] = info.with_cuda;
        d["cuda_archs"] = info.cuda_archs;
        d["cuda_version"] = info.cuda_version;
        d["compiler"] = info.compiler;
        d["build_type"] = info.build_type;
        return d;
      },
      "How this copy of pagedkv was built: version, CUDA or not, architectures, compiler.");
}

}  // namespace pagedkv::python
