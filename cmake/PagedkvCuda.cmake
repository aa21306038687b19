# CUDA detection and per-target settings.
#
# PAGEDKV_CUDA=AUTO builds the kernels when a CUDA compiler is found, ON requires one, OFF skips
# them. The architectures must be set before enable_language(CUDA), and only when the caller did
# not pass CMAKE_CUDA_ARCHITECTURES (then PAGEDKV_CUDA_ARCHS is the default).
include(CheckLanguage)

set(PAGEDKV_WITH_CUDA OFF)
if(NOT PAGEDKV_CUDA STREQUAL "OFF")
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${PAGEDKV_CUDA_ARCHS})
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(PAGEDKV_WITH_CUDA ON)
    message(STATUS "pagedkv: CUDA kernels ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                   "archs ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(PAGEDKV_CUDA STREQUAL "ON")
    message(FATAL_ERROR "PAGEDKV_CUDA=ON but no CUDA compiler was found (set CUDACXX)")
  else()
    message(STATUS "pagedkv: no CUDA compiler found, building the CPU-only library")
  endif()
endif()

function(pagedkv_configure_cuda_target target)
  string(REPLACE ";" "," archs "${CMAKE_CUDA_ARCHITECTURES}")  # a ';' would split the define
  set_target_properties(${target} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  target_compile_definitions(${target} PUBLIC PAGEDKV_WITH_CUDA)
  target_compile_definitions(${target} PRIVATE
    PAGEDKV_CUDA_ARCHS="${archs}"
    PAGEDKV_CUDA_VERSION="${CMAKE_CUDA_COMPILER_VERSION}")
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -O3 -lineinfo>)
  # Static runtime: importing the module never needs libcudart.so, and a machine without a
  # driver just reports zero devices.
  target_link_libraries(${target} PUBLIC CUDA::cudart_static)
endfunction()
