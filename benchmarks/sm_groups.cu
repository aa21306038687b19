// Which SMs share a GPC (or a TPC): a thread-block cluster is always placed within one GPC, so
// launching many clusters and joining the SMs that ran CTAs of the same cluster recovers the
// groups. Prints "sm group" lines (group = the smallest SM id of the group), then each group's
// size (stderr). The cluster size is the first argument: 8 (the default) finds GPCs; 2 finds
// TPCs on an H100, whose pairs of SMs always host a cluster of 2 together. With
// decode_timeline.py --sm-groups, the decode's streaming time per group (benchmarks/RESULTS.md,
// "The late CTAs are the SMs' doing").
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/sm_groups benchmarks/sm_groups.cu
//   /tmp/sm_groups [cluster size] > sm_groups.txt
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

namespace {

__global__ void record_sm(unsigned* sm_of_cta, long long spin_ns) {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  if (threadIdx.x == 0) sm_of_cta[blockIdx.x] = sm;
  // Stay resident a while, so the launch spreads over every SM instead of reusing the first.
  long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < spin_ns);
}

int find(std::vector<int>& parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int cluster = argc > 1 ? std::atoi(argv[1]) : 8;
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  const int ctas = 8 * sms / cluster * cluster;  // several CTAs per SM, whole clusters
  unsigned* dev = nullptr;
  check(cudaMalloc(&dev, ctas * sizeof(unsigned)), "cudaMalloc");
  std::vector<unsigned> sm_of(ctas);
  std::vector<int> parent(sms);
  std::iota(parent.begin(), parent.end(), 0);
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(ctas);
  cfg.blockDim = dim3(32);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  for (int launch = 0; launch < 200; ++launch) {
    check(cudaLaunchKernelEx(&cfg, record_sm, dev, 20000LL), "launch");
    check(cudaMemcpy(sm_of.data(), dev, ctas * sizeof(unsigned), cudaMemcpyDeviceToHost), "copy");
    for (int c = 0; c < ctas; c += cluster) {
      for (int k = 1; k < cluster; ++k) {
        parent[find(parent, int(sm_of[c]))] = find(parent, int(sm_of[c + k]));
      }
    }
  }
  std::vector<int> size(sms, 0), first(sms, sms);
  for (int s = 0; s < sms; ++s) {
    const int root = find(parent, s);
    ++size[root];
    first[root] = std::min(first[root], s);
  }
  for (int s = 0; s < sms; ++s) std::printf("%d %d\n", s, first[find(parent, s)]);
  for (int s = 0; s < sms; ++s) {
    if (size[s] > 0) std::fprintf(stderr, "group %d: %d SMs\n", first[s], size[s]);
  }
  return 0;
}
