// Shared helpers of the CUDA kernels: error checks, the device guard, element conversions
// (fp32 / fp16 / bf16 / fp8 e4m3 / e5m2) and vector loads and stores of 8 or 16 elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "pagedkv/error.h"
#include "pagedkv/ops.h"
#include "pagedkv/tensor.h"

namespace pagedkv::cuda_ops {

inline cudaStream_t to_cuda(Stream s) { return static_cast<cudaStream_t>(s); }

// A failed CUDA call is a runtime error (not the caller's argument): report the op and the cause.
inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the next op starts clean
    throw std::runtime_error(std::string("pagedkv CUDA error in ") + what + ": " +
                             cudaGetErrorString(err));
  }
}
// After a launch: catches bad launch configurations without synchronising.
inline void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

// Launches `kernel` with `smem` bytes of dynamic shared memory on `s`, first raising the kernel's
// limit to that (always: the 48 KB default bounds static + dynamic shared memory, so a dynamic
// size just under 48 KB can need it too); `what` names the op in errors. With `pdl` (compute
// 9.x; cudaLaunchAttributeProgrammaticStreamSerialization) it launches as a programmatic
// dependent of the stream's previous kernel: its CTAs may start once that kernel triggers
// (pdl_trigger) or its CTAs exit, so the launch latency overlaps that kernel's tail; the kernel
// must then pdl_wait() before it reads anything an earlier kernel wrote.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, int smem, cudaStream_t s,
                      bool pdl, const char* what, const Args&... args) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), what);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, args...), what);
}

// launch_dependent without the programmatic dependency: an ordinary launch.
template <typename... Params, typename... Args>
void launch_with_smem(void (*kernel)(Params...), dim3 grid, dim3 block, int smem, cudaStream_t s,
                      const char* what, const Args&... args) {
  launch_dependent(kernel, grid, block, smem, s, false, what, args...);
}

// Makes `device` current for the scope of an op, so tensors on another GPU than the current one
// get their kernels launched there (the caller's stream must belong to that device).
class DeviceGuard {
 public:
  explicit DeviceGuard(const Device& device) {
    if (!device.is_cuda()) return;
    check_cuda(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device.id) {
      check_cuda(cudaSetDevice(device.id), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

// The caller's stream for an op whose arrays are on `device`, called under the op's DeviceGuard
// (the default streams, 0 and per-thread, then resolve to that device). A stream of another GPU
// raises a ValueError naming `stream`: a launch on it would fail with "invalid resource handle",
// and an asynchronous copy would run unordered with the caller's work on the arrays' GPU. A
// capturing stream is not asked (cudaStreamGetDevice is not permitted during a capture, which
// the same op's eager warm-up call has normally checked).
inline cudaStream_t op_stream(Stream stream, const Device& device) {
  const cudaStream_t s = to_cuda(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(s, &capture), "stream");
  if (capture != cudaStreamCaptureStatusNone) return s;
  int owner = -1;
  check_cuda(cudaStreamGetDevice(s, &owner), "stream");
  PAGEDKV_CHECK(owner == device.id, "stream: belongs to cuda:", owner,
                " but the arrays are on cuda:", device.id);
  return s;
}

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }
inline bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
inline int log2_int(int64_t v) {
  int s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return s;
}
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// An fp8 scale as the kernels receive it (ops.h's Scale): a number, or a device pointer to the
// float32 the kernel reads itself (no host synchronisation; a CUDA graph reads it at each replay).
// A kernel launched as a programmatic dependent reads it after pdl_wait(), like any input.
struct DeviceScale {
  const float* ptr = nullptr;  // when set, the scale (value unused)
  float value = 1.0f;

  __device__ __forceinline__ float get() const { return ptr != nullptr ? __ldg(ptr) : value; }
};

// The kernels' form of a scale (an array is one the dispatcher checked: 1-element float32 on the
// op's device); 1 when `used` is false ("auto" caches ignore their scales).
inline DeviceScale device_scale(const Scale& s, bool used) {
  if (!used) return {};
  if (s.array) return {s.array->data_as<const float>(), 1.0f};
  return {nullptr, s.value};
}

// fp8 formats of a uint8 cache (0 = the cache holds the query dtype itself).
enum Fp8Kind : int { kNoFp8 = 0, kE4M3 = 1, kE5M2 = 2 };
inline int fp8_kind(KVCacheDType d) {
  return d == KVCacheDType::kFp8E4M3 ? kE4M3 : d == KVCacheDType::kFp8E5M2 ? kE5M2 : kNoFp8;
}

// Calls f(kind, kd) with std::integral_constant arguments for a cache's fp8 kind and the 16-wide
// head-dimension steps a tensor-core kernel provisions for `head_size` (4: <= 64, 8: <= 128,
// 16: <= 256): the instantiations every tensor-core decode launcher dispatches over.
template <typename F>
void dispatch_kind_steps(int cache_fp8, int head_size, F&& f) {
  auto steps = [&](auto kind) {
    if (head_size <= 64) {
      f(kind, std::integral_constant<int, 4>{});
    } else if (head_size <= 128) {
      f(kind, std::integral_constant<int, 8>{});
    } else {
      f(kind, std::integral_constant<int, 16>{});
    }
  };
  if (cache_fp8 == kE4M3) {
    steps(std::integral_constant<int, kE4M3>{});
  } else if (cache_fp8 == kE5M2) {
    steps(std::integral_constant<int, kE5M2>{});
  } else {
    steps(std::integral_constant<int, kNoFp8>{});
  }
}

// ---- scalar conversions ---------------------------------------------------------------------

// 2^x as one SFU instruction: exp2f wraps it in a denormal-range fix-up, which a softmax weight
// does not need (below 2^-126 of the row's maximum it flushes to 0). Inputs are <= 0 or -inf.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float fp8_to_float(uint8_t v, int kind) {
  const __nv_fp8_interpretation_t f = kind == kE5M2 ? __NV_E5M2 : __NV_E4M3;
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, f)));
}
// Saturating, like vLLM: values past the format's range become its largest finite value.
__device__ __forceinline__ uint8_t float_to_fp8(float x, int kind) {
  const __nv_fp8_interpretation_t f = kind == kE5M2 ? __NV_E5M2 : __NV_E4M3;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, f));
}

// Two fp8 values (low byte first) to two floats; hardware cvt on sm_89+.
template <int KIND>
__device__ __forceinline__ float2 fp8x2_to_float2(uint16_t v) {
  constexpr __nv_fp8_interpretation_t f = KIND == kE5M2 ? __NV_E5M2 : __NV_E4M3;
  const __half2 h(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), f));
  return __half22float2(h);
}

// ---- vector loads: N elements of type T starting at p into floats ---------------------------

__device__ __forceinline__ uint4 ldg16(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// 8 x 16-bit elements held in a uint4 -> 8 floats.
__device__ __forceinline__ void unpack8(const uint4& r, const __half*, float* f) {
  const __half2* h = reinterpret_cast<const __half2*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __half22float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}
__device__ __forceinline__ void unpack8(const uint4& r, const __nv_bfloat16*, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

// Stores 8 floats as T at p (16-byte aligned for 16-bit T, 32 bytes for float).
template <typename T>
__device__ __forceinline__ void store8(T* p, const float* f) {
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
  } else {
    uint4 r;
    T* h = reinterpret_cast<T*>(&r);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = from_float<T>(f[i]);
    *reinterpret_cast<uint4*>(p) = r;
  }
}

}  // namespace pagedkv::cuda_ops
