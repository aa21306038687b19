// Misuse of the public C++ API found by the 2026-11-24 audit: each is an exception naming the
// argument, never a crash and never a silent wrong answer.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "error_of.h"
#include "pagedkv/pagedkv.h"

namespace pagedkv {
namespace {

using testing::error_of;

bool has(const std::string& msg, const char* part) { return msg.find(part) != std::string::npos; }

// Null pointers into entry points that read through them used to segfault.
TEST(ApiMisuse, NullPointersAreErrorsNotCrashes) {
  EXPECT_TRUE(has(error_of([] { hash_block(kRootHash, nullptr, 4); }), "tokens"));
  EXPECT_EQ(error_of([] { hash_block(kRootHash, nullptr, 0); }), "");  // nothing to read

  SchedulerConfig cfg;
  cfg.num_blocks = 16;
  cfg.block_size = 4;
  Scheduler s(cfg);
  EXPECT_TRUE(
      has(error_of([&] { s.add_request("a", nullptr, 4, RequestParams{}); }), "prompt_token_ids"));
  EXPECT_FALSE(s.has_request("a"));
  s.add_request("b", std::vector<int32_t>{1, 2}, RequestParams{});
  const StepPlan& plan = s.schedule();
  ASSERT_EQ(plan.num_seqs, 1);
  EXPECT_TRUE(has(error_of([&] { s.update(plan, nullptr, 1); }), "sampled_token_ids"));
  EXPECT_EQ(s.update(plan, std::vector<int64_t>{7}).size(), 0u);  // still usable

  DLTensor t{};
  float x = 0.0f;
  t.data = &x;
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.device = {kDLCPU, 0};
  EXPECT_TRUE(has(error_of([&] { TensorView::from_dlpack(t, "query"); }), "query"));  // no shape
  t.ndim = -1;
  EXPECT_TRUE(has(error_of([&] { TensorView::from_dlpack(t, "query"); }), "query: rank -1"));
  int64_t shape[2] = {2, -3};
  t.ndim = 2;
  t.shape = shape;
  EXPECT_TRUE(
      has(error_of([&] { TensorView::from_dlpack(t, "query"); }), "query: dimension 1 has "));
}

// A decode call's small arrays, on a "GPU": the views are only validated (host memory marked
// CUDA must never reach a kernel, so every call below fails validation).
struct FakeCudaDecode {
  static constexpr int kD = 64;
  Device gpu{DeviceType::kCUDA, 0};
  std::vector<float> kc = std::vector<float>(4 * 16 * 2 * kD), vc = kc;
  std::vector<float> q = std::vector<float>(2 * 8 * kD), out = q;
  std::vector<int32_t> ints = std::vector<int32_t>(16, 1);
  std::vector<float> slopes = std::vector<float>(16, 0.5f);
  TensorView cache(std::vector<float>& v) const {
    return TensorView(v.data(), DType::kFloat32, {4, 16, 2, kD}, gpu);
  }
  TensorView rows(std::vector<float>& v) const {
    return TensorView(v.data(), DType::kFloat32, {2, 8, kD}, gpu);
  }
  std::string v1(const TensorView& block_tables, const TensorView& seq_lens,
                 const AttentionOptions& o = {}) {
    return error_of([&] {
      ops::paged_attention_v1(rows(out), rows(q), cache(kc), cache(vc), 2, block_tables, seq_lens,
                              16, o);
    });
  }
};

// The CUDA kernels read seq_lens / query_start_loc / slot_mapping / alibi_slopes densely and
// block-table rows with unit stride; a strided one was accepted and silently misread.
TEST(ApiMisuse, StridedMetadataOnCudaIsRefused) {
  FakeCudaDecode f;
  const TensorView dense_lens(f.ints.data(), DType::kInt32, {2}, f.gpu);
  const TensorView strided_lens(f.ints.data(), DType::kInt32, {2}, f.gpu, {2});
  const TensorView table(f.ints.data(), DType::kInt32, {2, 2}, f.gpu);
  const TensorView column_table(f.ints.data(), DType::kInt32, {2, 2}, f.gpu, {1, 2});
  const std::string strided = f.v1(table, strided_lens);
  EXPECT_TRUE(has(strided, "seq_lens must be contiguous")) << strided;
  const std::string col = f.v1(column_table, dense_lens);
  EXPECT_TRUE(has(col, "block_tables must be contiguous")) << col;
  AttentionOptions o;
  o.alibi_slopes = TensorView(f.slopes.data(), DType::kFloat32, {8}, f.gpu, {2});
  const std::string alibi = f.v1(table, dense_lens, o);
  EXPECT_TRUE(has(alibi, "alibi_slopes must be contiguous")) << alibi;
  // (No dense call here: it would pass validation and reach the kernels, which in a CUDA
  // build query the driver and, on a GPU, would read this host memory. The CUDA tests run
  // dense metadata on real device arrays.)

  std::vector<int64_t> slots(8, 0);
  std::vector<float> key(4 * 2 * FakeCudaDecode::kD);
  const TensorView k(key.data(), DType::kFloat32, {4, 2, FakeCudaDecode::kD}, f.gpu);
  const std::string write = error_of([&] {
    ops::reshape_and_cache_flash(k, k, f.cache(f.kc), f.cache(f.vc),
                                 TensorView(slots.data(), DType::kInt64, {4}, f.gpu, {2}),
                                 KVCacheDType::kAuto, 1.0f, 1.0f);
  });
  EXPECT_TRUE(has(write, "slot_mapping must be contiguous")) << write;
  // Host arrays keep any stride (the CPU kernels honour it).
  std::vector<int32_t> host_lens = {3, 0, 5, 0};
  std::vector<int32_t> host_table = {0, 1};
  std::vector<float> host_kc(f.kc.size()), host_vc(f.kc.size()), host_q(f.q.size()),
      host_out(f.q.size());
  EXPECT_EQ(error_of([&] {
              ops::paged_attention_v1(
                  TensorView(host_out.data(), DType::kFloat32, {2, 8, FakeCudaDecode::kD}),
                  TensorView(host_q.data(), DType::kFloat32, {2, 8, FakeCudaDecode::kD}),
                  TensorView(host_kc.data(), DType::kFloat32, {4, 16, 2, FakeCudaDecode::kD}),
                  TensorView(host_vc.data(), DType::kFloat32, {4, 16, 2, FakeCudaDecode::kD}), 2,
                  TensorView(host_table.data(), DType::kInt32, {2, 1}),
                  TensorView(host_lens.data(), DType::kInt32, {2}, {}, {2}), 5, AttentionOptions{});
            }),
            "");
}

// An output that shares memory with an input, or repeats its own elements, was written
// silently wrong (prefill over a view of its own keys, an expanded out or cache).
TEST(ApiMisuse, OutputsMustNotOverlap) {
  constexpr int kD = 64;
  std::vector<float> kc(4 * 16 * 2 * kD), vc(kc.size()), buf(3 * 2 * 8 * kD);
  std::vector<int32_t> table = {0}, lens = {3};
  const TensorView k(kc.data(), DType::kFloat32, {4, 16, 2, kD});
  const TensorView v(vc.data(), DType::kFloat32, {4, 16, 2, kD});
  const TensorView q(buf.data(), DType::kFloat32, {1, 8, kD});
  const TensorView bt(table.data(), DType::kInt32, {1, 1});
  const TensorView sl(lens.data(), DType::kInt32, {1});
  const std::string in_place =
      error_of([&] { ops::paged_attention_v1(q, q, k, v, 2, bt, sl, 3, AttentionOptions{}); });
  EXPECT_TRUE(has(in_place, "out overlaps query")) << in_place;
  const TensorView expanded(buf.data() + 8 * kD, DType::kFloat32, {2, 8, kD}, {}, {0, kD, 1});
  std::vector<int32_t> table2 = {0, 0}, lens2 = {3, 3};
  const std::string exp = error_of([&] {
    ops::paged_attention_v1(expanded, TensorView(buf.data() + 16 * kD, DType::kFloat32, {2, 8, kD}),
                            k, v, 2, TensorView(table2.data(), DType::kInt32, {2, 1}),
                            TensorView(lens2.data(), DType::kInt32, {2}), 3, AttentionOptions{});
  });
  EXPECT_TRUE(has(exp, "out (shape [2, 8, 64], strides [0, 64, 1]) repeats elements")) << exp;
  // Writing a cache into itself, or into one array twice.
  std::vector<int64_t> slots = {20, 21};
  const TensorView own_rows(kc.data(), DType::kFloat32, {2, 2, kD});
  const std::string self = error_of([&] {
    ops::reshape_and_cache_flash(own_rows, own_rows, k, v,
                                 TensorView(slots.data(), DType::kInt64, {2}), KVCacheDType::kAuto,
                                 1.0f, 1.0f);
  });
  EXPECT_TRUE(has(self, "key_cache overlaps key")) << self;
  const TensorView fresh(buf.data(), DType::kFloat32, {2, 2, kD});
  const std::string twice = error_of([&] {
    ops::reshape_and_cache_flash(fresh, fresh, k, k, TensorView(slots.data(), DType::kInt64, {2}),
                                 KVCacheDType::kAuto, 1.0f, 1.0f);
  });
  EXPECT_TRUE(has(twice, "key_cache and value_cache are the same array")) << twice;
}

// The split-K rule took any head counts: 2 query heads over 8 KV heads gave a partition (1008).
TEST(ApiMisuse, PartitionRuleNeedsWholeGroups) {
  using K = AttentionKernel;
  const std::string msg = error_of([] {
    ops::decode_partition_size(K::kTensorCore, 1, 2, 8, 32768, 16, 132, KVCacheDType::kAuto);
  });
  EXPECT_TRUE(has(msg, "num_kv_heads = 8 must divide num_heads = 2")) << msg;
  EXPECT_EQ(
      ops::decode_partition_size(K::kTensorCore, 1, 32, 8, 32768, 16, 132, KVCacheDType::kAuto),
      1008);
}

}  // namespace
}  // namespace pagedkv
