// Decode attention (one query token per sequence) over a paged KV cache: paged_attention_v1
// (one pass over the whole context) and paged_attention_v2 (context split into partitions whose
// partial results are merged with their log-sum-exp in fp32).
//
// Work item = (sequence, KV head[, partition]): the G = num_heads / num_kv_heads query heads of
// a KV head share every K/V tile they read (GQA reuse), the tile is converted to fp32 once.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/attention_common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/parallel.h"
#include "pagedkv/decode_plan.h"

namespace pagedkv::cpu_ops {
namespace {

struct DecodeProblem {
  RowArray query, out;
  PagedCache k, v;
  BlockTable tables;
  IntArray seq_lens;
  LogitTransform transform;
  float scale = 1.0f;
  int num_heads = 0, num_kv_heads = 0, group = 0, head_size = 0, window = -1;
  // v2 only: [num_seqs, num_heads, max_partitions] and [.., head_size]
  float* exp_sums = nullptr;
  float* max_logits = nullptr;
  char* tmp_out = nullptr;
  DType tmp_dtype = DType::kFloat32;
  int max_partitions = 1, partition_size = 0;  // 0: v1
  float* lse = nullptr;  // balanced, optional: [num_heads, num_seqs] log-sum-exps
  int64_t num_seqs = 0;
};

// Result of one (sequence, KV head, token range) item: per query head of the group, the max
// logit, the sum of exp(logit - max) and the un-normalised output sum_t exp(..) * v_t.
struct PartialState {
  float* max;  // [G]
  float* sum;  // [G]
  float* acc;  // [G, D]
};

PAGEDKV_MULTIVERSION
void attend_range(const DecodeProblem& p, int64_t seq, int kh, int64_t t_begin, int64_t t_end,
                  int64_t seq_len, PartialState st) {
  thread_local std::vector<float> q_buf, logit_buf, tile_buf, w_buf;
  const int G = p.group, D = p.head_size, bs = p.k.block_size;
  const int64_t L = std::max<int64_t>(t_end - t_begin, 0);
  float* q = scratch(q_buf, static_cast<size_t>(G) * D);
  float* logits = scratch(logit_buf, static_cast<size_t>(G) * std::max<int64_t>(L, 1));
  float* tile = scratch(tile_buf, static_cast<size_t>(bs) * D);
  for (int g = 0; g < G; ++g) {
    st.max[g] = kNegInf;
    st.sum[g] = 0.0f;
    std::fill(st.acc + g * D, st.acc + (g + 1) * D, 0.0f);
  }
  if (L == 0) return;
  for (int g = 0; g < G; ++g) {
    load_row(p.query.row(seq, kh * G + g), p.query.dtype, q + g * D, D);
    scale_row(p.scale, q + g * D, D);
  }
  // Pass 1: logits [G, L] of every key in the range, one block (tile) at a time.
  for (int64_t t = t_begin; t < t_end;) {
    const int off = static_cast<int>(t % bs);
    const int n = static_cast<int>(std::min<int64_t>(bs - off, t_end - t));
    const int64_t block = p.tables(seq, t / bs);
    if (t + n < t_end)
      p.k.prefetch(p.tables(seq, (t + n) / bs), kh, 0,
                   static_cast<int>(std::min<int64_t>(bs, t_end - t - n)));
    int64_t ld = D;
    const float* k = p.k.rows(block, kh, off, &ld);
    if (!k) {
      p.k.load(block, kh, off, n, tile);
      k = tile;
    }
    dot_tile<false>(q, D, G, k, ld, n, D, logits + (t - t_begin), L);
    t += n;
  }
  // Softmax numerators in place.
  for (int g = 0; g < G; ++g) {
    float* s = logits + g * L;
    p.transform.apply(s, static_cast<int>(L), p.transform.slope(kh * G + g), t_begin, seq_len - 1);
    st.max[g] = max_of(s, static_cast<int>(L), kNegInf);
    st.sum[g] = exp_sub_sum(s, static_cast<int>(L), st.max[g]);
  }
  // Pass 2: weighted sum of the values.
  const bool transposed = p.v.layout == KVLayout::kVLLM;
  float* w = transposed ? scratch(w_buf, static_cast<size_t>(G) * bs) : nullptr;
  for (int64_t t = t_begin; t < t_end;) {
    const int off = static_cast<int>(t % bs);
    const int n = static_cast<int>(std::min<int64_t>(bs - off, t_end - t));
    const int64_t block = p.tables(seq, t / bs);
    if (t + n < t_end)
      p.v.prefetch(p.tables(seq, (t + n) / bs), kh, 0,
                   static_cast<int>(std::min<int64_t>(bs, t_end - t - n)));
    if (transposed) {
      // acc[g, d] += sum_j w[g, j] * vt[d, j] over the whole (zero-padded) block.
      p.v.load_transposed(block, kh, off, n, tile);
      for (int g = 0; g < G; ++g) {
        std::fill(w + g * bs, w + (g + 1) * bs, 0.0f);
        std::copy(logits + g * L + (t - t_begin), logits + g * L + (t - t_begin) + n,
                  w + g * bs + off);
      }
      dot_tile<true>(w, bs, G, tile, bs, D, bs, st.acc, D);
    } else {
      int64_t ld = D;
      const float* v = p.v.rows(block, kh, off, &ld);
      if (!v) {
        p.v.load(block, kh, off, n, tile);
        v = tile;
      }
      pv_tile(logits + (t - t_begin), L, G, v, ld, n, D, st.acc, D);
    }
    t += n;
  }
}

// First visible key of a sequence under the sliding window (0 without one).
int64_t window_start(const DecodeProblem& p, int64_t seq_len) {
  return p.window > 0 ? std::max<int64_t>(0, seq_len - p.window) : 0;
}

// Multiply-adds of a decode call, for parallel_for's serial cut-off.
int64_t decode_work(const DecodeProblem& p, int64_t num_seqs) {
  int64_t keys = 0;
  for (int64_t s = 0; s < num_seqs; ++s) keys += p.seq_lens[s];
  return 2 * keys * p.num_heads * p.head_size;
}

void run_v1(const DecodeProblem& p, int64_t num_seqs) {
  parallel_for(
      num_seqs * p.num_kv_heads,
      [&](int64_t item) {
        thread_local std::vector<float> state;
        const int64_t seq = item / p.num_kv_heads;
        const int kh = static_cast<int>(item % p.num_kv_heads);
        const int G = p.group, D = p.head_size;
        float* buf = scratch(state, static_cast<size_t>(G) * (D + 2));
        PartialState st{buf, buf + G, buf + 2 * G};
        const int64_t seq_len = p.seq_lens[seq];
        attend_range(p, seq, kh, window_start(p, seq_len), seq_len, seq_len, st);
        for (int g = 0; g < G; ++g) {
          // A sequence with no visible key (seq_len 0) gets a zero output, not NaN.
          const float inv = st.sum[g] > 0.0f ? 1.0f / st.sum[g] : 0.0f;
          scale_row(inv, st.acc + g * D, D);
          store_row(st.acc + g * D, p.out.dtype, p.out.row(seq, kh * G + g), D);
        }
      },
      decode_work(p, num_seqs));
}

// Stores a (sequence, KV head, key range) state as the partials of its G query heads: workspace
// rows row0, row0 + stride, ... (normalised output, exp-sum, max logit).
void store_partials(const DecodeProblem& p, const PartialState& st, int64_t row0, int64_t stride) {
  const int D = p.head_size;
  const int64_t tmp_elem = static_cast<int64_t>(dtype_size(p.tmp_dtype));
  for (int g = 0; g < p.group; ++g) {
    const int64_t idx = row0 + g * stride;
    p.exp_sums[idx] = st.sum[g];
    p.max_logits[idx] = st.max[g];
    const float inv = st.sum[g] > 0.0f ? 1.0f / st.sum[g] : 0.0f;
    scale_row(inv, st.acc + g * D, D);
    store_row(st.acc + g * D, p.tmp_dtype, p.tmp_out + idx * D * tmp_elem, D);
  }
}

// Merges `count` partials of query head h of sequence seq (workspace rows first, first + stride,
// ...) in fp32 by their log-sum-exp into the output; no partial (no visible key) gives zeros.
void merge_partials(const DecodeProblem& p, int64_t first, int64_t count, int64_t stride,
                    int64_t seq, int h) {
  thread_local std::vector<float> buf;
  const int D = p.head_size;
  const int64_t tmp_elem = static_cast<int64_t>(dtype_size(p.tmp_dtype));
  float* acc = scratch(buf, 2 * static_cast<size_t>(D));
  float* row = acc + D;
  float gmax = kNegInf;
  for (int64_t i = 0; i < count; ++i) gmax = std::max(gmax, p.max_logits[first + i * stride]);
  std::fill(acc, acc + D, 0.0f);
  float total = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = first + i * stride;
    const float m = p.max_logits[r];
    if (m == kNegInf) continue;  // partition fully outside the sliding window
    const float w = p.exp_sums[r] * std::exp(m - gmax);
    load_row(p.tmp_out + r * D * tmp_elem, p.tmp_dtype, row, D);
    axpy(w, row, acc, D);
    total += w;
  }
  scale_row(total > 0.0f ? 1.0f / total : 0.0f, acc, D);
  store_row(acc, p.out.dtype, p.out.row(seq, h), D);
  if (p.lse != nullptr)
    p.lse[h * p.num_seqs + seq] = total > 0.0f ? gmax + std::log(total) : kNegInf;
}

void run_v2(const DecodeProblem& p, int64_t num_seqs) {
  const int P = p.max_partitions, H = p.num_heads, D = p.head_size;
  // Phase 1: one item per (sequence, KV head, partition).
  parallel_for(
      num_seqs * p.num_kv_heads * P,
      [&](int64_t item) {
        const int part = static_cast<int>(item % P);
        const int64_t seq = item / P / p.num_kv_heads;
        const int kh = static_cast<int>(item / P % p.num_kv_heads);
        const int64_t seq_len = p.seq_lens[seq];
        const int64_t t0 = static_cast<int64_t>(part) * p.partition_size;
        if (t0 >= seq_len) return;  // beyond this sequence: left untouched, as in vLLM
        const int64_t t1 = std::min<int64_t>(t0 + p.partition_size, seq_len);
        thread_local std::vector<float> state;
        const int G = p.group;
        float* buf = scratch(state, static_cast<size_t>(G) * (D + 2));
        PartialState st{buf, buf + G, buf + 2 * G};
        attend_range(p, seq, kh, std::max(t0, window_start(p, seq_len)), t1, seq_len, st);
        store_partials(p, st, (seq * H + kh * G) * P + part, P);
      },
      decode_work(p, num_seqs));
  // Phase 2: merge the partitions of each (sequence, head) in fp32.
  parallel_for(
      num_seqs * H,
      [&](int64_t item) {
        const int64_t seq = item / H;
        const int h = static_cast<int>(item % H);
        const int64_t seq_len = p.seq_lens[seq];
        const int64_t parts = (seq_len + p.partition_size - 1) / p.partition_size;
        merge_partials(p, (seq * H + h) * P, parts, 1, seq, h);
      },
      num_seqs * H * P * D);
}

// Work-balanced decode (ops::paged_attention_balanced): one task per (used work item, KV head)
// writes the item's partial at workspace row * num_heads + head, then each sequence's rows merge.
void run_balanced(const DecodeProblem& p, int64_t num_seqs, int64_t capacity,
                  const int32_t* work_items, const int32_t* seq_offsets) {
  const int H = p.num_heads, D = p.head_size, G = p.group;
  const int64_t items = seq_offsets[num_seqs];
  parallel_for(
      capacity * p.num_kv_heads,
      [&](int64_t task) {
        const int32_t* w = work_items + task / p.num_kv_heads * kBalancedItemInts;
        if (w[0] < 0) return;  // unused item
        const int kh = static_cast<int>(task % p.num_kv_heads);
        const int64_t seq = w[0], seq_len = p.seq_lens[seq], row = w[3];
        thread_local std::vector<float> state;
        float* buf = scratch(state, static_cast<size_t>(G) * (D + 2));
        PartialState st{buf, buf + G, buf + 2 * G};
        attend_range(p, seq, kh, w[1], w[2], seq_len, st);
        store_partials(p, st, row * H + kh * G, 1);
      },
      decode_work(p, num_seqs));
  parallel_for(
      num_seqs * H,
      [&](int64_t task) {
        const int64_t seq = task / H;
        const int h = static_cast<int>(task % H);
        const int64_t first = seq_offsets[seq];
        merge_partials(p, first * H + h, seq_offsets[seq + 1] - first, H, seq, h);
      },
      items * H * D);
}

DecodeProblem make_problem(const TensorView& out, const TensorView& query,
                           const TensorView& key_cache, const TensorView& value_cache,
                           int num_kv_heads, const TensorView& block_tables,
                           const TensorView& seq_lens, const AttentionOptions& opts) {
  DecodeProblem p;
  const bool vllm = key_cache.ndim() == 5;
  p.query = RowArray(query);
  p.out = RowArray(out);
  p.k = PagedCache::make(key_cache, true, vllm, opts.kv_cache_dtype, host_scale(opts.k_scale));
  p.v = PagedCache::make(value_cache, false, vllm, opts.kv_cache_dtype, host_scale(opts.v_scale));
  p.tables = BlockTable(block_tables);
  p.seq_lens = IntArray(seq_lens);
  p.transform = make_transform(opts);
  p.scale = opts.scale;
  p.num_heads = static_cast<int>(query.size(1));
  p.num_kv_heads = num_kv_heads;
  p.group = p.num_heads / num_kv_heads;
  p.head_size = static_cast<int>(query.size(2));
  p.window = opts.sliding_window;
  return p;
}

}  // namespace

void paged_attention_v1(const TensorView& out, const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens,
                        int /*max_seq_len*/, const AttentionOptions& opts) {
  const DecodeProblem p =
      make_problem(out, query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens, opts);
  run_v1(p, query.size(0));
}

void paged_attention_v2(const TensorView& out, const TensorView& exp_sums,
                        const TensorView& max_logits, const TensorView& tmp_out,
                        const TensorView& query, const TensorView& key_cache,
                        const TensorView& value_cache, int num_kv_heads,
                        const TensorView& block_tables, const TensorView& seq_lens,
                        int /*max_seq_len*/, const AttentionOptions& opts, int partition_size) {
  DecodeProblem p =
      make_problem(out, query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens, opts);
  p.exp_sums = exp_sums.data_as<float>();
  p.max_logits = max_logits.data_as<float>();
  p.tmp_out = static_cast<char*>(tmp_out.data());
  p.tmp_dtype = tmp_out.dtype();
  p.max_partitions = static_cast<int>(exp_sums.size(2));
  p.partition_size = partition_size;
  run_v2(p, query.size(0));
}

void paged_attention_balanced(const TensorView& out, const TensorView& exp_sums,
                              const TensorView& max_logits, const TensorView& tmp_out,
                              const TensorView& query, const TensorView& key_cache,
                              const TensorView& value_cache, int num_kv_heads,
                              const TensorView& block_tables, const TensorView& seq_lens,
                              const TensorView& work_items, const TensorView& seq_offsets,
                              const AttentionOptions& opts, const std::optional<TensorView>& lse) {
  DecodeProblem p =
      make_problem(out, query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens, opts);
  p.exp_sums = exp_sums.data_as<float>();
  p.max_logits = max_logits.data_as<float>();
  p.tmp_out = static_cast<char*>(tmp_out.data());
  p.tmp_dtype = tmp_out.dtype();
  p.lse = lse ? lse->data_as<float>() : nullptr;
  p.num_seqs = query.size(0);
  run_balanced(p, query.size(0), work_items.size(0), work_items.data_as<const int32_t>(),
               seq_offsets.data_as<const int32_t>());
}

}  // namespace pagedkv::cpu_ops
