// Library version and a description of how this copy was built.
#pragma once

#include <string>
#include <vector>

namespace pagedkv {

// "MAJOR.MINOR.PATCH" of the library, e.g. "0.1.0".
const char* version();

struct BuildInfo {
  std::string version;
  bool with_cuda = false;               // CUDA kernels compiled in
  std::vector<std::string> cuda_archs;  // e.g. {"80", "90a"}; empty without CUDA
  std::string cuda_version;             // nvcc version used, empty without CUDA
  std::string compiler;                 // C++ compiler id and version
  std::string build_type;               // CMake build type
};

BuildInfo build_info();

// True when the library has CUDA kernels and at least one CUDA device is usable right now.
bool cuda_available();
// Number of usable CUDA devices (0 without CUDA or without a driver).
int cuda_device_count();

}  // namespace pagedkv
