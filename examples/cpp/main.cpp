// Uses the installed pagedkv library from C++: prints the version and build, schedules two
// prompts with the continuous-batching scheduler (docs/metadata.md's worked example: chunked
// prefill under a 512-token budget), then writes a few tokens into a paged KV cache (NHD layout)
// and runs decode attention over them on the CPU.
#include <pagedkv/pagedkv.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

// Three steps of two 484-token prompts; the sampled token of every sequence is a dummy 7.
void run_scheduler() {
  pagedkv::SchedulerConfig cfg;
  cfg.num_blocks = 128;
  cfg.block_size = 16;
  cfg.max_num_batched_tokens = 512;
  pagedkv::Scheduler sched(cfg);
  pagedkv::RequestParams params;
  params.max_tokens = 8;
  for (int r = 0; r < 2; ++r)
    sched.add_request("req-" + std::to_string(r), std::vector<int32_t>(484, 100 + r), params);
  for (int step = 1; step <= 3; ++step) {
    const pagedkv::StepPlan& plan = sched.schedule();
    std::printf("step %d: %d prefills, %d prefill tokens, %d decode tokens, seq_lens", step,
                plan.num_prefills, plan.num_prefill_tokens, plan.num_decode_tokens);
    // The plan's arrays are preallocated for the batch limits: entries past num_seqs are unused.
    for (int i = 0; i < plan.num_seqs; ++i) std::printf(" %d", plan.seq_lens[i]);
    std::printf("\n");
    sched.update(plan, std::vector<int64_t>(plan.num_seqs, 7));
  }
}

}  // namespace

int main() {
  const pagedkv::BuildInfo info = pagedkv::build_info();
  std::printf("pagedkv %s (cuda: %s)\n", pagedkv::version(), info.with_cuda ? "yes" : "no");
  run_scheduler();

  using pagedkv::DType;
  using pagedkv::TensorView;
  constexpr int kBlocks = 4, kBlockSize = 16, kKVHeads = 2, kHeads = 4, kHeadSize = 64;
  constexpr int kTokens = 5;
  // Cache [num_blocks, block_size, num_kv_heads, head_size] for keys and for values.
  std::vector<float> key_cache(kBlocks * kBlockSize * kKVHeads * kHeadSize, 0.0f);
  std::vector<float> value_cache(key_cache.size(), 0.0f);
  std::vector<float> key(kTokens * kKVHeads * kHeadSize), value(key.size());
  for (size_t i = 0; i < key.size(); ++i) {
    key[i] = std::sin(0.1f * static_cast<float>(i));
    value[i] = std::cos(0.05f * static_cast<float>(i));
  }
  // The sequence lives in physical block 2: slots 2 * 16 + 0 .. 2 * 16 + 4.
  std::vector<int64_t> slots(kTokens);
  for (int t = 0; t < kTokens; ++t) slots[t] = 2 * kBlockSize + t;

  const TensorView kc(key_cache.data(), DType::kFloat32,
                      {kBlocks, kBlockSize, kKVHeads, kHeadSize});
  const TensorView vc(value_cache.data(), DType::kFloat32,
                      {kBlocks, kBlockSize, kKVHeads, kHeadSize});
  pagedkv::ops::reshape_and_cache_flash(
      TensorView(key.data(), DType::kFloat32, {kTokens, kKVHeads, kHeadSize}),
      TensorView(value.data(), DType::kFloat32, {kTokens, kKVHeads, kHeadSize}), kc, vc,
      TensorView(slots.data(), DType::kInt64, {kTokens}), pagedkv::KVCacheDType::kAuto, 1.0f, 1.0f);

  std::vector<float> query(kHeads * kHeadSize, 0.1f), out(query.size(), 0.0f);
  std::vector<int32_t> block_table = {2}, seq_lens = {kTokens};
  pagedkv::AttentionOptions opts;
  opts.scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));
  pagedkv::ops::paged_attention_v1(
      TensorView(out.data(), DType::kFloat32, {1, kHeads, kHeadSize}),
      TensorView(query.data(), DType::kFloat32, {1, kHeads, kHeadSize}), kc, vc, kKVHeads,
      TensorView(block_table.data(), DType::kInt32, {1, 1}),
      TensorView(seq_lens.data(), DType::kInt32, {1}), kTokens, opts);
  double checksum = 0.0;
  for (float v : out) checksum += v;
  std::printf("decode attention over %d cached tokens: checksum %.6f\n", kTokens, checksum);
  return 0;
}
