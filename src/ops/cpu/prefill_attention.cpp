// Prefill / extend attention (context_attention_fwd): the new query tokens of each sequence
// attend causally to the sequence's cached context (read from the paged cache) and to the new
// keys/values themselves (read from `key` / `value`). Chunked prefill and prefix reuse are the
// same computation with a non-empty context. Non-causal calls (encoders) let every query token
// see all of its sequence's keys: each row's last visible key is the sequence's last.
//
// Work item = (sequence, KV head, chunk of query tokens); the chunk's G * chunk query rows share
// every K/V tile, which is converted to fp32 once. Softmax is computed online (running max and
// sum per row), so memory stays O(rows * head_size) whatever the sequence length.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/attention_common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/parallel.h"

namespace pagedkv::cpu_ops {
namespace {

constexpr int kNewKeyTile = 64;  // keys per tile when reading the new tokens
constexpr int kMaxTile = 64;     // keys per tile at most (bounds the logit buffer)

struct PrefillProblem {
  RowArray query, out, key, value;
  PagedCache k, v;
  BlockTable tables;
  IntArray query_start, seq_lens;
  LogitTransform transform;
  float scale = 1.0f;
  int num_heads = 0, num_kv_heads = 0, group = 0, head_size = 0, window = -1;
  bool causal = true;
  int chunk = 16;  // query tokens per work item
};

struct WorkItem {
  int64_t seq;
  int64_t q_begin;  // first query token of the chunk, relative to the sequence
};

struct RowState {
  float* q;    // [R, D] scaled queries
  float* m;    // [R] running max
  float* l;    // [R] running sum
  float* acc;  // [R, D]
};

PAGEDKV_MULTIVERSION
void load_cache_tile(const PagedCache& c, int64_t block, int kh, int off, int n, float* dst) {
  c.load(block, kh, off, n, dst);
}

// Folds one K/V tile (keys at positions kpos0 .. kpos0 + n - 1; K and V row-major with row
// strides ldk / ldv) into the running state of the chunk's rows (query token i -> rows
// (i - i0) * G + g): S = Q K^T for all rows at once, per-row masking and online softmax, then
// acc += P V for all rows at once.
PAGEDKV_MULTIVERSION
void fold_tile(const PrefillProblem& p, int kh, int64_t ctx, int64_t i0, int64_t i1, int64_t kpos0,
               int n, const float* ktile, int64_t ldk, const float* vtile, int64_t ldv,
               RowState st) {
  thread_local std::vector<float> s_buf, kt_buf;
  const int G = p.group, D = p.head_size;
  const int R = static_cast<int>((i1 - i0) * G);
  float* S = scratch(s_buf, static_cast<size_t>(R) * kMaxTile);
  // S = Q K^T as a broadcast-FMA GEMM over K^T [D, n] (accumulators stay in registers over
  // all of D); the transpose costs D * n moves, amortised over the R query rows.
  float* kt = scratch(kt_buf, static_cast<size_t>(D) * kMaxTile);
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < D; ++d) kt[d * kMaxTile + j] = ktile[j * ldk + d];
  std::fill(S, S + static_cast<size_t>(R) * kMaxTile, 0.0f);
  pv_tile(st.q, D, R, kt, kMaxTile, D, n, S, kMaxTile);
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t qpos = ctx + i;
    // Visible keys of this query inside the tile: causal and sliding-window bounds (the tiles
    // of a non-causal call never pass the sequence's end).
    const int j_end =
        p.causal ? static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(n, qpos - kpos0 + 1)))
                 : n;
    int j_begin = 0;
    if (p.window > 0) j_begin = static_cast<int>(std::max<int64_t>(0, qpos - p.window + 1 - kpos0));
    j_begin = std::min(j_begin, j_end);
    for (int g = 0; g < G; ++g) {
      const int64_t r = (i - i0) * G + g;
      float* s = S + r * kMaxTile;
      std::fill(s, s + j_begin, 0.0f);
      std::fill(s + j_end, s + n, 0.0f);
      if (j_begin == j_end) continue;  // nothing visible: P row stays 0
      const int m = j_end - j_begin;
      float* sv = s + j_begin;
      p.transform.apply(sv, m, p.transform.slope(kh * G + g), kpos0 + j_begin, qpos);
      const float m_old = st.m[r];
      const float m_new = max_of(sv, m, m_old);
      if (m_new > m_old && m_old != kNegInf) {
        const float corr = std::exp(m_old - m_new);
        st.l[r] *= corr;
        scale_row(corr, st.acc + r * D, D);
      }
      st.m[r] = m_new;
      st.l[r] += exp_sub_sum(sv, m, m_new);
    }
  }
  pv_tile(S, kMaxTile, R, vtile, ldv, n, D, st.acc, D);
}

PAGEDKV_MULTIVERSION
void load_new_rows(const RowArray& a, int64_t token0, int kh, int n, int D, float* dst) {
  for (int j = 0; j < n; ++j) load_row(a.row(token0 + j, kh), a.dtype, dst + j * D, D);
}

// K or V rows of the new tokens: read in place when fp32 with a float-aligned row stride.
const float* new_rows(const RowArray& a, int64_t token0, int kh, int n, int D, float* buf,
                      int64_t* ld) {
  if (a.dtype == DType::kFloat32 && a.s0 % static_cast<int64_t>(sizeof(float)) == 0) {
    *ld = a.s0 / static_cast<int64_t>(sizeof(float));
    return reinterpret_cast<const float*>(a.row(token0, kh));
  }
  load_new_rows(a, token0, kh, n, D, buf);
  *ld = D;
  return buf;
}

// K or V rows of cached tokens: in place for fp32 NHD caches, else converted into buf.
const float* cache_rows(const PagedCache& c, int64_t block, int kh, int off, int n, float* buf,
                        int64_t* ld) {
  if (const float* r = c.rows(block, kh, off, ld)) return r;
  load_cache_tile(c, block, kh, off, n, buf);
  *ld = c.head_size;
  return buf;
}

void run_item(const PrefillProblem& p, const WorkItem& w, int kh) {
  thread_local std::vector<float> state_buf, k_buf, v_buf;
  const int G = p.group, D = p.head_size;
  const int64_t qs = p.query_start[w.seq];
  const int64_t q_len = p.query_start[w.seq + 1] - qs;
  const int64_t ctx = p.seq_lens[w.seq] - q_len;
  const int64_t i0 = w.q_begin, i1 = std::min<int64_t>(i0 + p.chunk, q_len);
  const int64_t R = (i1 - i0) * G;
  float* buf = scratch(state_buf, static_cast<size_t>(R) * (2 * D + 2));
  RowState st{buf, buf + R * D, buf + R * D + R, buf + R * D + 2 * R};
  for (int64_t i = i0; i < i1; ++i)
    for (int g = 0; g < G; ++g) {
      float* q = st.q + ((i - i0) * G + g) * D;
      load_row(p.query.row(qs + i, kh * G + g), p.query.dtype, q, D);
      for (int d = 0; d < D; ++d) q[d] *= p.scale;
    }
  std::fill(st.m, st.m + R, kNegInf);
  std::fill(st.l, st.l + R + R * D, 0.0f);  // l and acc are adjacent

  float* kt = scratch(k_buf, static_cast<size_t>(kMaxTile) * D);
  float* vt = scratch(v_buf, static_cast<size_t>(kMaxTile) * D);
  // Keys any row of the chunk can see: [lo, hi).
  const int64_t hi = p.causal ? ctx + i1 : ctx + q_len;
  const int64_t lo = p.window > 0 ? std::max<int64_t>(0, ctx + i0 - p.window + 1) : 0;
  const int bs = p.k.block_size;
  for (int64_t t = lo; t < std::min(hi, ctx);) {  // cached context, one block at a time
    const int off = static_cast<int>(t % bs);
    const int n = static_cast<int>(std::min<int64_t>({bs - off, ctx - t, kMaxTile}));
    const int64_t block = p.tables(w.seq, t / bs);
    int64_t ldk = D, ldv = D;
    const float* k = cache_rows(p.k, block, kh, off, n, kt, &ldk);
    const float* v = cache_rows(p.v, block, kh, off, n, vt, &ldv);
    fold_tile(p, kh, ctx, i0, i1, t, n, k, ldk, v, ldv, st);
    t += n;
  }
  for (int64_t t = std::max(lo, ctx); t < hi;) {  // the new tokens
    const int n = static_cast<int>(std::min<int64_t>(kNewKeyTile, hi - t));
    int64_t ldk = D, ldv = D;
    const float* k = new_rows(p.key, qs + (t - ctx), kh, n, D, kt, &ldk);
    const float* v = new_rows(p.value, qs + (t - ctx), kh, n, D, vt, &ldv);
    fold_tile(p, kh, ctx, i0, i1, t, n, k, ldk, v, ldv, st);
    t += n;
  }
  for (int64_t i = i0; i < i1; ++i)
    for (int g = 0; g < G; ++g) {
      const int64_t r = (i - i0) * G + g;
      float* acc = st.acc + r * D;
      scale_row(st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f, acc, D);
      store_row(acc, p.out.dtype, p.out.row(qs + i, kh * G + g), D);
    }
}

}  // namespace

void context_attention_fwd(const TensorView& out, const TensorView& query, const TensorView& key,
                           const TensorView& value, const TensorView& key_cache,
                           const TensorView& value_cache, const TensorView& block_tables,
                           const TensorView& query_start_loc, const TensorView& seq_lens,
                           int /*max_query_len*/, const AttentionOptions& opts) {
  PrefillProblem p;
  const bool vllm = key_cache.ndim() == 5;
  p.query = RowArray(query);
  p.out = RowArray(out);
  p.key = RowArray(key);
  p.value = RowArray(value);
  p.k = PagedCache::make(key_cache, true, vllm, opts.kv_cache_dtype, host_scale(opts.k_scale));
  p.v = PagedCache::make(value_cache, false, vllm, opts.kv_cache_dtype, host_scale(opts.v_scale));
  p.tables = BlockTable(block_tables);
  p.query_start = IntArray(query_start_loc);
  p.seq_lens = IntArray(seq_lens);
  p.transform = make_transform(opts);
  p.scale = opts.scale;
  p.num_heads = static_cast<int>(query.size(1));
  p.num_kv_heads = static_cast<int>(key.size(1));
  p.group = p.num_heads / p.num_kv_heads;
  p.head_size = static_cast<int>(query.size(2));
  p.window = opts.sliding_window;
  p.causal = opts.causal;
  // About 64 query rows per item: enough to amortise each K/V tile conversion.
  p.chunk = std::max(4, 64 / p.group);

  std::vector<WorkItem> items;
  const int64_t num_seqs = seq_lens.size(0);
  int64_t work = 0;  // multiply-adds, for parallel_for's serial cut-off
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = p.query_start[s + 1] - p.query_start[s];
    for (int64_t i = 0; i < q_len; i += p.chunk) items.push_back({s, i});
    work += 2 * q_len * p.seq_lens[s] * p.num_heads * p.head_size;
  }
  const int64_t n_items = static_cast<int64_t>(items.size());
  parallel_for(
      n_items * p.num_kv_heads,
      [&](int64_t k) { run_item(p, items[k % n_items], static_cast<int>(k / n_items)); }, work);
}

}  // namespace pagedkv::cpu_ops
