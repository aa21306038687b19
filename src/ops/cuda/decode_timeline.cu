// Host side of the decode timeline (decode_timeline.h): one device buffer, grown on demand, and
// the file the records go to. A profiling tool: it synchronises the stream on every call.
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/decode_timeline.h"

namespace pagedkv::cuda_ops {

#if PAGEDKV_DECODE_TIMELINE
namespace {
std::mutex g_mu;
uint64_t* g_buf = nullptr;
uint64_t g_words = 0;
std::string g_path;  // guarded by g_mu; "" = off

std::string timeline_file() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_path;
}
}  // namespace

bool set_decode_timeline_file(std::string_view path) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_path = path;
  return true;
}

uint64_t* decode_timeline_buffer(uint64_t ctas, cudaStream_t s) {
  if (timeline_file().empty()) return nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  const uint64_t words = ctas * kTimelineWords;
  if (words > g_words) {
    if (g_buf != nullptr) check_cuda(cudaFree(g_buf), "decode timeline");
    check_cuda(cudaMalloc(&g_buf, words * sizeof(uint64_t)), "decode timeline");
    g_words = words;
  }
  check_cuda(cudaMemsetAsync(g_buf, 0, words * sizeof(uint64_t), s), "decode timeline");
  return g_buf;
}

void decode_timeline_dump(uint64_t* buffer, uint64_t ctas, cudaStream_t s) {
  const std::string path = timeline_file();
  if (buffer == nullptr || path.empty()) return;
  std::vector<uint64_t> host(ctas * kTimelineWords);
  check_cuda(cudaStreamSynchronize(s), "decode timeline");
  check_cuda(
      cudaMemcpy(host.data(), buffer, host.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost),
      "decode timeline");
  if (FILE* f =
          std::fopen(path.c_str(), "ab")) {  // one record: the CTA count, then the CTAs' words
    std::fwrite(&ctas, sizeof(ctas), 1, f);
    std::fwrite(host.data(), sizeof(uint64_t), host.size(), f);
    std::fclose(f);
  }
}
#else
bool set_decode_timeline_file(std::string_view) { return false; }
uint64_t* decode_timeline_buffer(uint64_t, cudaStream_t) { return nullptr; }
void decode_timeline_dump(uint64_t*, uint64_t, cudaStream_t) {}
#endif

}  // namespace pagedkv::cuda_ops
