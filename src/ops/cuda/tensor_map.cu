// Host side of TMA tensor maps (tensor_map.h).
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "ops/cuda/tensor_map.h"

namespace pagedkv::cuda_ops {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

bool tensor_maps_available() { return encode_fn() != nullptr; }

namespace {

// encode_sw128 and encode_cache_rows: the same encoding with the 128-byte swizzle or none.
bool encode_tiled(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                  const int64_t* strides, const uint32_t* box, int esz, CUtensorMapSwizzle swz) {
  const auto fn = encode_fn();
  if (fn == nullptr || rank < 2 || rank > 5) return false;
  cuuint64_t d[5];
  cuuint64_t st[4];
  cuuint32_t b[5], steps[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = dims[i];
    b[i] = box[i];
    steps[i] = 1;
    if (dims[i] == 0) return false;  // the driver refuses empty dimensions
  }
  for (int i = 0; i + 1 < rank; ++i) {
    if (strides[i] <= 0 || strides[i] % 16 != 0 || strides[i] >= (int64_t(1) << 40)) return false;
    st[i] = cuuint64_t(strides[i]);
  }
  return fn(map, esz == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16,
            cuuint32_t(rank), const_cast<void*>(base), d, st, b, steps,
            CU_TENSOR_MAP_INTERLEAVE_NONE, swz, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

bool encode_sw128(CUtensorMap* map, const void* base, int rank, const uint64_t* dims,
                  const int64_t* strides, const uint32_t* box, int esz) {
  return box[0] * esz == 128 &&
         encode_tiled(map, base, rank, dims, strides, box, esz, CU_TENSOR_MAP_SWIZZLE_128B);
}

bool encode_cache_map(CUtensorMap* map, const void* base, const CacheLayout& l, const AttnParams& a,
                      int esz, int rows) {
  const uint64_t dims[4] = {uint64_t(a.head_size), uint64_t(a.num_kv_heads), uint64_t(a.block_size),
                            uint64_t(a.num_blocks)};
  const int64_t strides[3] = {l.s_head * esz, l.s_slot * esz, l.s_block * esz};
  const uint32_t box[4] = {uint32_t(128 / esz), 1, uint32_t(rows), 1};
  return encode_sw128(map, base, 4, dims, strides, box, esz);
}

bool encode_cache_rows(CUtensorMap* map, const void* base, const CacheLayout& l,
                       const AttnParams& a) {
  const uint64_t dims[4] = {uint64_t(a.head_size), uint64_t(a.num_kv_heads), uint64_t(a.block_size),
                            uint64_t(a.num_blocks)};
  const int64_t strides[3] = {l.s_head, l.s_slot, l.s_block};
  const uint32_t box[4] = {uint32_t(a.head_size), 1, 16, 1};
  return a.head_size % 16 == 0 && a.head_size <= 256 &&
         encode_tiled(map, base, 4, dims, strides, box, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
}

}  // namespace pagedkv::cuda_ops
