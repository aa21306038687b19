// fork() gives the child the parent's prompt without copying it: what a fork allocates does not
// grow with the prompt's tokens (n > 1 sampling of a long prompt would otherwise hold n copies:
// 64 KiB per child for a 16k-token prompt, 1 GiB at vLLM's default limit n = 16384). Counted by
// replacing the global operator new of this test binary.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "core/token_seq.h"
#include "pagedkv/pagedkv.h"
#include "scheduler_test_util.h"

namespace {
std::atomic<size_t> g_bytes_allocated{0};
}  // namespace

void* operator new(std::size_t n) {
  g_bytes_allocated.fetch_add(n, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace pagedkv {
namespace {

// Bytes allocated per child when `n` children fork off one `prompt_len`-token prompt.
size_t bytes_per_fork(int32_t prompt_len, int32_t n) {
  constexpr int32_t kBlockSize = 16;
  SchedulerConfig c;
  c.block_size = kBlockSize;
  c.num_blocks = prompt_len / kBlockSize + 2 * n + 8;
  c.max_num_batched_tokens = prompt_len + n;
  c.max_num_seqs = n;
  Scheduler s(c);
  std::mt19937 rng(1);
  RequestParams p;
  p.max_tokens = 8;
  s.add_request("p", testing::random_tokens(rng, prompt_len), p);
  s.update(s.schedule(), {5});
  std::vector<std::string> ids;
  for (int32_t i = 1; i < n; ++i) ids.push_back("p#" + std::to_string(i));
  const size_t before = g_bytes_allocated.load();
  for (int32_t i = 1; i < n; ++i) {
    EXPECT_EQ(s.fork("p", ids[i - 1], 100 + i).reason, FinishReason::kNone);
  }
  const size_t bytes = (g_bytes_allocated.load() - before) / static_cast<size_t>(n - 1);
  // The children still see the whole prompt, and run.
  std::vector<int32_t> want = s.get_token_ids("p");
  want.back() = 100 + n - 1;
  EXPECT_EQ(s.get_token_ids(ids.back()), want);
  const StepPlan& plan = s.schedule();
  EXPECT_EQ(plan.num_seqs, n);
  return bytes;
}

TEST(SchedulerForkMemory, ChildrenShareThePromptInsteadOfCopyingIt) {
  const size_t small = bytes_per_fork(256, 64);
  const size_t large = bytes_per_fork(16384, 64);
  // What does grow with the prompt is the block table and the block hashes (20 bytes per
  // 16-token block, about 1.3 bytes per token); a copy of the prompt would be 4 per token.
  EXPECT_LT(large - small, 2 * (16384 - 256)) << small << " vs " << large << " bytes per fork";
}

TEST(TokenSeq, SharedPromptAndRangesAcrossItsEnd) {
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  TokenSeq parent, child;
  parent.assign(prompt.data(), prompt.size());
  parent.push_back(6);
  child.share_prompt(parent);
  child.push_back(60);
  child.push_back(61);
  EXPECT_EQ(child.prompt_data(), parent.prompt_data());
  EXPECT_EQ(parent.to_vector(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(child.to_vector(), (std::vector<int32_t>{1, 2, 3, 4, 5, 60, 61}));
  std::vector<int32_t> scratch;
  EXPECT_EQ(child.range(1, 3, &scratch), child.prompt_data() + 1);  // in place, in the prompt
  EXPECT_TRUE(scratch.empty());
  EXPECT_EQ(*child.range(5, 2, &scratch), 60);  // in place, in the generated part
  const int32_t* across = child.range(3, 4, &scratch);
  EXPECT_EQ(std::vector<int32_t>(across, across + 4), (std::vector<int32_t>{4, 5, 60, 61}));
  int32_t out[3] = {0, 0, 0};
  child.copy_to(4, 3, out);
  EXPECT_EQ(std::vector<int32_t>(out, out + 3), (std::vector<int32_t>{5, 60, 61}));
  parent.clear();  // the child keeps the prompt alive
  EXPECT_EQ(child.to_vector(), (std::vector<int32_t>{1, 2, 3, 4, 5, 60, 61}));
  EXPECT_EQ(parent.size(), 0u);
}

}  // namespace
}  // namespace pagedkv
