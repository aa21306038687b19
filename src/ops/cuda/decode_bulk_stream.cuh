// The Hopper decode's loads (decode_bulk.cuh): how one warp streams its 16-key chunks of K and V
// rows into the stages of its shared-memory ring, and where a staged row's bytes lie.
//
// A stage holds a chunk's 16 K rows, then its 16 V rows, in one of two forms (BulkDecodeParams):
// tensor copies (tma: one TMA box of 16 rows per 128-byte column slice, landing with the 128-byte
// swizzle) or row copies (one 1-D bulk copy per row). Lanes 0-15 copy K rows and lanes 16-31 V
// rows (row copies), or the first 2 * slices lanes one box each (tensor copies); every copy is
// counted on the stage's mbarrier.
#pragma once

#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/decode_bulk_shape.cuh"

namespace pagedkv::cuda_ops::bulk_decode {

// Where the bytes of a staged K or V tile lie. The byte of (row j, 16-byte unit u, offset o) is
// at (u / 8) * box_bytes + j * row_stride + ((u % 8) ^ (j & swz)) * 16 + o.
// The row stride and swizzle mask are read once, at the kernel's start (BulkDecodeParams).
struct StageLayout {
  const BulkDecodeParams& bp;
  int rs, swz;

  // Byte of (row j, 16-byte unit u) of a staged tile.
  __device__ __forceinline__ unsigned char* at(unsigned char* tile, int j, int u) const {
    return tile + (u >> 3) * bp.box_bytes + j * rs + (((u & 7) ^ (j & swz)) << 4);
  }

  // The row a lane supplies to an ldmatrix.x4: row `row` of unit U + hi for an even unit U (a
  // constant once unrolled). at(tile, row, U + hi) is then the per-lane base plus
  // (U / 8) box_bytes + ((U % 8) * 16 ^ x), which is all the chunk loop computes per ldmatrix.
  struct LdLane {
    int base, x;
  };
  __device__ __forceinline__ LdLane ld_lane(int row, int hi) const {
    return LdLane{row * rs, (hi ^ (row & swz)) << 4};
  }
  __device__ __forceinline__ unsigned char* ld_at(unsigned char* tile, const LdLane& l,
                                                  int u) const {
    return tile + l.base + (u >> 3) * bp.box_bytes + (((u & 7) << 4) ^ l.x);
  }
};

// Where a lane's copies of a chunk find their block: the sequence's block-table row.
struct BlockIds {
  const BulkDecodeParams& bp;
  const int* bt;  // the sequence's block-table row
  int lane;

  // The table entry of key tok, clamped into the table's row.
  __device__ __forceinline__ int block_of(int tok) const {
    const AttnParams& p = bp.a;
    const int bi = p.bs_shift >= 0 ? tok >> p.bs_shift : tok / p.block_size;
    return bt[min(bi, p.max_blocks - 1)];
  }
  // The key whose block a lane's copies of chunk c read: key c * 16 + lane % 16 (row copies:
  // lanes l and l + 16 copy its K and V rows), or the chunk's first key at or after lo (tensor
  // copies: the chunk's keys share one block).
  __device__ __forceinline__ int key_of(int c, int lo) const {
    return bp.tma ? max(c * kKeys, lo) : c * kKeys + (lane & 15);
  }
};

// One warp's chunk stream over the CTA's keys [k_lo, k_hi): block ids, copies into the ring.
template <typename SH>
struct ChunkStream {
  using CT = typename SH::CT;
  const BulkDecodeParams& bp;
  BlockIds ids;
  StageLayout sl;
  int lane, kvh, k_lo, k_hi;
  uint64_t* bars;       // the stages' mbarriers
  unsigned char* ring;  // the warp's stages
  const CT* kc;         // the KV head's caches
  const CT* vc;
  // The copies carry an L2 evict-first policy: the rows are read once and should not push what
  // is read again (queries, block tables, other CTAs' rows) out of L2 (1-7 % faster, RESULTS.md).
  uint64_t policy;

  __device__ __forceinline__ ChunkStream(const BlockIds& block_ids, const StageLayout& layout,
                                         int head, int lo, int hi, uint64_t* barriers,
                                         unsigned char* warp_ring)
      : bp(block_ids.bp),
        ids(block_ids),
        sl(layout),
        lane(block_ids.lane),
        kvh(head),
        k_lo(lo),
        k_hi(hi),
        bars(barriers),
        ring(warp_ring),
        kc(static_cast<const CT*>(bp.a.k_cache) + int64_t(head) * bp.a.kl.s_head),
        vc(static_cast<const CT*>(bp.a.v_cache) + int64_t(head) * bp.a.vl.s_head),
        policy(make_evict_first_policy()) {}

  __device__ __forceinline__ bool valid(int tok) const { return tok >= k_lo && tok < k_hi; }
  __device__ __forceinline__ int slot_of(int tok) const {
    const AttnParams& p = bp.a;
    return p.bs_shift >= 0 ? tok & (p.block_size - 1) : tok % p.block_size;
  }
  __device__ __forceinline__ const StageLayout& layout() const { return sl; }
  __device__ __forceinline__ unsigned char* stage(int s) const { return ring + s * bp.stage_bytes; }

  // Block id of chunk c's key (key_of); 0 outside the range (a row of block 0 is copied and
  // ignored). The id is loaded a chunk ahead of its copies and checked only when they are issued
  // (issue: bad ids read block 0, never wild memory): a check here would wait for the load at
  // once, and ncu showed that wait as the fp8 kernel's top stall.
  __device__ __forceinline__ int lookup(int c) const {
    const int tok = ids.key_of(c, k_lo);
    return valid(tok) ? ids.block_of(tok) : 0;
  }

  // Chunk c's copies into stage `st`. Every copy lands whole (keys outside the range too: the
  // chunk's math zeroes their V rows), so a stage always expects 2 * 16 * row_bytes.
  __device__ __forceinline__ void issue(int c, int st, int looked_up) const {
    const AttnParams& p = bp.a;
    const int blk = unsigned(looked_up) < unsigned(p.num_blocks) ? looked_up : 0;
    unsigned char* dst_stage = stage(st);
    uint64_t* bar = bars + st;
    if (lane == 0) mbar_arrive_expect(bar, 32u * bp.row_bytes);
    const int key0 = c * kKeys;
    if (bp.tma) {
      const int slices = bp.row_bytes / 128, box_elems = 128 / int(sizeof(CT));
      if (lane < 2 * slices) {  // lane: K slices, then V slices
        const bool is_v = lane >= slices;
        const int h = is_v ? lane - slices : lane;
        tma_load_4d(dst_stage + (is_v ? bp.v_off : 0) + h * bp.box_bytes,
                    is_v ? &bp.v_map : &bp.k_map, h * box_elems, kvh, slot_of(key0), blk, bar,
                    policy, true);
      }
    } else {
      const int64_t slot = slot_of(key0 + (lane & 15));
      const CT* src = lane < 16 ? kc + int64_t(blk) * p.kl.s_block + slot * p.kl.s_slot
                                : vc + int64_t(blk) * p.vl.s_block + slot * p.vl.s_slot;
      unsigned char* dst = dst_stage + (lane < 16 ? 0 : bp.v_off) + (lane & 15) * sl.rs;
      bulk_copy_g2s_hint(dst, src, bp.row_bytes, bar, policy);
    }
  }

  // Zeroes the V rows of keys outside the range in an edge chunk (0 * a stale NaN would be NaN).
  __device__ __forceinline__ void clear_edge(unsigned char* vt, int key0) const {
    const int j = lane & 15, half = bp.row_bytes / 2;
    if (!valid(key0 + j)) {
      for (int b = (lane >> 4) * half; b < (lane >> 4) * half + half; b += 16) {
        // Whole 16-byte units of row j: the swizzle only permutes units within the row.
        *reinterpret_cast<uint4*>(sl.at(vt, j, b >> 4)) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    fence_proxy_async();  // before a later copy rewrites these bytes
    __syncwarp();
  }
};

}  // namespace pagedkv::cuda_ops::bulk_decode
