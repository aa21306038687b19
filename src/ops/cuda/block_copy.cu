// copy_blocks (whole blocks within each layer's GPU caches, e.g. copy-on-write of a shared block)
// and swap_blocks (blocks between two caches on different devices: GPU <-> pinned host).
//
// copy_blocks passes the layers' cache pointers by value in the kernel parameters (chunks of
// kLayersPerLaunch layers), so it needs no device-side pointer table and no allocation: the op
// stays CUDA-graph safe. swap_blocks issues one cudaMemcpyAsync per block on the stream.
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace pagedkv::cuda_ops {
namespace {

constexpr int kLayersPerLaunch = 32;

struct CopyBlocksParams {
  char* caches[2 * kLayersPerLaunch];  // keys of each layer, then values
  int64_t block_stride_bytes[2 * kLayersPerLaunch];
  int64_t block_bytes[2 * kLayersPerLaunch];
  int64_t num_blocks[2 * kLayersPerLaunch];
  const int64_t* mapping;  // [num_pairs, 2] int64 (src, dst), device memory
  int64_t mapping_row_stride, mapping_col_stride;
};

// grid: (num_pairs, 2 * layers); each CTA copies one block of one cache.
__global__ void copy_blocks_kernel(CopyBlocksParams p) {
  const int64_t pair = blockIdx.x;
  const int c = blockIdx.y;
  const int64_t src = p.mapping[pair * p.mapping_row_stride];
  const int64_t dst = p.mapping[pair * p.mapping_row_stride + p.mapping_col_stride];
  const int64_t n = p.block_bytes[c];
  if (src < 0 || dst < 0 || src >= p.num_blocks[c] || dst >= p.num_blocks[c]) return;  // bad id
  const char* s = p.caches[c] + src * p.block_stride_bytes[c];
  char* d = p.caches[c] + dst * p.block_stride_bytes[c];
  const bool vec =
      ((reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d) | n) & 15) == 0;
  if (vec) {
    const uint4* s4 = reinterpret_cast<const uint4*>(s);
    uint4* d4 = reinterpret_cast<uint4*>(d);
    for (int64_t i = threadIdx.x; i < n / 16; i += blockDim.x) d4[i] = s4[i];
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) d[i] = s[i];
  }
}

// Bytes of one block's contents (the cache is contiguous within a block).
int64_t block_bytes(const TensorView& t) {
  int64_t n = 1;
  for (int i = 1; i < t.ndim(); ++i) n *= t.size(i);
  return n * static_cast<int64_t>(t.element_size());
}

}  // namespace

void copy_blocks(const std::vector<TensorView>& key_caches,
                 const std::vector<TensorView>& value_caches, const TensorView& block_mapping,
                 Stream stream) {
  const int64_t pairs = block_mapping.size(0);
  if (key_caches.empty() || pairs == 0) return;
  DeviceGuard guard(key_caches[0].device());
  const cudaStream_t s = op_stream(stream, key_caches[0].device());
  const int layers = static_cast<int>(key_caches.size());
  if (!block_mapping.device().is_cuda()) {
    // A host mapping: one device-to-device copy per block (no kernel needs the ids on the GPU).
    const int64_t* m = block_mapping.data_as<const int64_t>();
    for (int64_t i = 0; i < pairs; ++i) {
      const int64_t src = m[i * block_mapping.stride(0)];
      const int64_t dst = m[i * block_mapping.stride(0) + block_mapping.stride(1)];
      for (int l = 0; l < layers; ++l) {
        for (const TensorView* t : {&key_caches[l], &value_caches[l]}) {
          const int64_t bs = t->stride(0) * static_cast<int64_t>(t->element_size());
          char* base = static_cast<char*>(t->data());
          check_cuda(cudaMemcpyAsync(base + dst * bs, base + src * bs, block_bytes(*t),
                                     cudaMemcpyDeviceToDevice, s),
                     "copy_blocks");
        }
      }
    }
    return;
  }
  PAGEDKV_CHECK(pairs <= 0x7fffffff, "block_mapping: too many pairs");
  for (int l0 = 0; l0 < layers; l0 += kLayersPerLaunch) {
    const int nl = std::min(kLayersPerLaunch, layers - l0);
    CopyBlocksParams p{};
    for (int i = 0; i < nl; ++i) {
      const TensorView& k = key_caches[l0 + i];
      const TensorView& v = value_caches[l0 + i];
      p.caches[i] = static_cast<char*>(k.data());
      p.caches[nl + i] = static_cast<char*>(v.data());
      p.block_stride_bytes[i] = k.stride(0) * static_cast<int64_t>(k.element_size());
      p.block_stride_bytes[nl + i] = v.stride(0) * static_cast<int64_t>(v.element_size());
      p.block_bytes[i] = block_bytes(k);
      p.block_bytes[nl + i] = block_bytes(v);
      p.num_blocks[i] = k.size(0);
      p.num_blocks[nl + i] = v.size(0);
    }
    p.mapping = block_mapping.data_as<const int64_t>();
    p.mapping_row_stride = block_mapping.stride(0);
    p.mapping_col_stride = block_mapping.stride(1);
    copy_blocks_kernel<<<dim3(static_cast<unsigned>(pairs), 2 * nl), 256, 0, s>>>(p);
    check_launch("copy_blocks");
  }
}

void swap_blocks(const TensorView& src, const TensorView& dst, const TensorView& block_mapping,
                 Stream stream) {
  const int64_t pairs = block_mapping.size(0);
  if (pairs == 0) return;
  const Device& gpu = src.device().is_cuda() ? src.device() : dst.device();
  DeviceGuard guard(gpu);
  // Pageable host memory would make cudaMemcpyAsync synchronous (and break CUDA graphs): ask
  // for pinned memory instead of silently stalling the stream.
  for (const TensorView* t : {&src, &dst}) {
    if (t->device().is_cuda()) continue;
    cudaPointerAttributes attr{};
    const cudaError_t err = cudaPointerGetAttributes(&attr, t->data());
    if (err != cudaSuccess) cudaGetLastError();
    PAGEDKV_CHECK(err == cudaSuccess && attr.type == cudaMemoryTypeHost, t == &src ? "src" : "dst",
                  ": host memory for swap_blocks must be pinned (page-locked), e.g. "
                  "torch.empty(..., pin_memory=True)");
  }
  PAGEDKV_CHECK(!block_mapping.device().is_cuda(), "block_mapping: must be on the CPU");
  const int64_t src_bs = src.stride(0) * static_cast<int64_t>(src.element_size());
  const int64_t dst_bs = dst.stride(0) * static_cast<int64_t>(dst.element_size());
  const int64_t n = block_bytes(src);
  const int64_t* m = block_mapping.data_as<const int64_t>();
  const char* sb = static_cast<const char*>(src.data());
  char* db = static_cast<char*>(dst.data());
  const cudaStream_t s = op_stream(stream, gpu);
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t a = m[i * block_mapping.stride(0)];
    const int64_t b = m[i * block_mapping.stride(0) + block_mapping.stride(1)];
    check_cuda(cudaMemcpyAsync(db + b * dst_bs, sb + a * src_bs, n, cudaMemcpyDefault, s),
               "swap_blocks");
  }
}

}  // namespace pagedkv::cuda_ops
