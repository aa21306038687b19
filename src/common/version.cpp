// Version and build description. The PAGEDKV_* macros come from CMake (see CMakeLists.txt).
#include "pagedkv/version.h"

#include <sstream>

#ifndef PAGEDKV_VERSION
#define PAGEDKV_VERSION "0.0.0"
#endif
#ifndef PAGEDKV_CUDA_ARCHS
#define PAGEDKV_CUDA_ARCHS ""
#endif
#ifndef PAGEDKV_CUDA_VERSION
#define PAGEDKV_CUDA_VERSION ""
#endif
#ifndef PAGEDKV_BUILD_TYPE
#define PAGEDKV_BUILD_TYPE ""
#endif
#ifndef PAGEDKV_CXX_COMPILER
#define PAGEDKV_CXX_COMPILER ""
#endif

namespace pagedkv {

#ifdef PAGEDKV_WITH_CUDA
// Defined in src/ops/cuda/device.cu: queries the runtime without throwing.
int cuda_device_count_impl();
#endif

const char* version() { return PAGEDKV_VERSION; }

BuildInfo build_info() {
  BuildInfo info;
  info.version = PAGEDKV_VERSION;
#ifdef PAGEDKV_WITH_CUDA
  info.with_cuda = true;
  std::istringstream archs(PAGEDKV_CUDA_ARCHS);
  for (std::string a; std::getline(archs, a, ',');)
    if (!a.empty()) info.cuda_archs.push_back(a);
  info.cuda_version = PAGEDKV_CUDA_VERSION;
#endif
  info.compiler = PAGEDKV_CXX_COMPILER;
  info.build_type = PAGEDKV_BUILD_TYPE;
  return info;
}

int cuda_device_count() {
#ifdef PAGEDKV_WITH_CUDA
  return cuda_device_count_impl();
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

}  // namespace pagedkv
