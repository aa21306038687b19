// The work-balanced decode plan (ops::paged_attention_balanced): every sequence's visible keys
// cut into pieces of near-equal length, listed as work items for a fixed grid.
//
// Why: the partition split of paged_attention_v2 depends on the batch size and the longest
// sequence, so in a batch of skewed lengths one long sequence keeps its CTAs busy while the rest
// of the GPU idles (benchmarks/RESULTS.md). Here the piece length comes from the total work: the
// batch's visible keys over the number of items the GPU runs at once, so every item costs about
// the same, whatever the lengths.
//
// A plan is two int32 arrays the engine refills each step (one host -> device copy with the other
// step metadata; their sizes, and so a captured CUDA graph's launch shapes, never change):
//   work_items  [capacity, 4]: item i = (seq, key_lo, key_hi, row): keys [key_lo, key_hi) of
//               sequence seq, whose partial result (normalised output, exp-sum, max logit of each
//               query head) lands in workspace row `row`. Items are listed longest first (the
//               grid runs them in that order, so the short ones fill the tail of the long ones:
//               longest-processing-time-first scheduling); unused items are (-1, 0, 0, -1) and
//               run nothing.
//   seq_offsets [num_seqs + 1]: sequence s's pieces write rows offsets[s] .. offsets[s + 1] - 1,
//               in key order (none for a sequence without visible keys: its output is zero, as
//               paged_attention_v1's); a reduction merges each sequence's rows.
#pragma once

#include <cstdint>

namespace pagedkv {

// Keys per piece are multiples of this (the decode kernels read keys in chunks of 16, so a piece
// boundary inside a chunk would make two CTAs read it).
inline constexpr int kBalancedKeyUnit = 16;

// Default shortest piece: shorter ones cost more in the partial write and the merge than they gain
// in balance.
inline constexpr int kBalancedMinChunk = 128;

inline constexpr int kBalancedItemInts = 4;  // (seq, key_lo, key_hi, row)

// Items a plan may need for `num_seqs` sequences and `target_items` wanted: each sequence adds at
// most one item to total / chunk (the rounding up of its piece count).
inline int64_t balanced_plan_capacity(int64_t target_items, int64_t num_seqs) {
  return (target_items > 0 ? target_items : 1) + num_seqs;
}

// Fills a plan for sequences of lengths seq_lens[0 .. num_seqs) (keys of sequence s visible to its
// query: [max(0, len - sliding_window), len) with a window > 0, else [0, len)). The piece length is
// the smallest multiple of kBalancedKeyUnit, at least min_chunk, with total keys / length <=
// target_items; it grows where the items would not fit `capacity`. Each sequence is then cut into
// ceil(visible / length) pieces of near-equal length, boundaries on multiples of kBalancedKeyUnit.
// work_items [capacity * 4] and seq_offsets [num_seqs + 1] are written whole. Returns the number of
// items used. Throws ValueError on negative lengths, target_items < 1, min_chunk < 32, or a
// capacity below the number of sequences with visible keys.
int plan_balanced_decode(const int32_t* seq_lens, int num_seqs, int sliding_window,
                         int target_items, int min_chunk, int capacity, int32_t* work_items,
                         int32_t* seq_offsets);

}  // namespace pagedkv
