"""The installed C++ package: headers (include/), the static library and its CMake config
(lib/cmake/pagedkv). Named by the ``cmake.root`` entry point so that scikit-build-core projects
can ``find_package(pagedkv)``; holds no Python code."""
