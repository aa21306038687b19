// The Hopper decode's copy pattern alone (src/ops/cuda/decode_bulk.cuh without the attention): each
// warp of a CTA streams its 16-key chunks of one KV head's K and V rows through a ring of
// mbarrier stages, one TMA box (16 slots x 128 bytes, 128-byte swizzle) per 128-byte slice, from a
// paged cache of randomly permuted blocks, with the kernel's own copy and barrier instructions
// (ops/cuda/bulk_copy.cuh, tensor_map.cu). It measures what that pattern can stream on this GPU,
// and what each piece of a real kernel's work costs it, without the rest of the library:
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -Iinclude -o /tmp/copy_stream \
//     benchmarks/decode_copy_stream.cu src/ops/cuda/tensor_map.cu
//   /tmp/copy_stream row=128 seqs=64 len=2048 stages=3 ctas=4        # fp8-sized rows, 64*2048
//   bash benchmarks/decode_copy_stream.sh                             # the RESULTS.md tables
//
// Options (key=value): row (bytes of one K or V row: 256 = bf16 head size 128, 128 = fp8), seqs,
// len, part (keys per CTA; len = no split), stages (ring depth per warp), ctas (CTAs per SM the
// shared memory is padded for), warps (per CTA), keys (per stage: 16 or 32, i.e. 1 or 2 blocks),
// hnd (1: cache stored [block, head, slot, dim], read through the same NHD-shaped map), seq_order
// (1: each sequence's blocks in order), hint (1: L2 evict-first), and the kernel's other work:
// lookahead (block id loaded a chunk ahead), prologue (a sequence-length load before the first
// copies, query loads and two CTA barriers after them), pdl (programmatic dependent launch),
// epilogue (1: each warp's 4 KB to shared memory, a barrier, a merge and a global store; 2: the
// same without the store; 3: the store alone; 5: the barrier alone), delay
// (cycles of spinning per chunk after its stage is refilled: the "math"; jitter=1 draws it from
// [0, 2 * delay]).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/bulk_copy.cuh"
#include "ops/cuda/tensor_map.h"

#define CHECK(x)                                                                          \
  do {                                                                                    \
    const cudaError_t e = (x);                                                            \
    if (e != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace {

using namespace pagedkv::cuda_ops;

constexpr int kHeads = 8, kBlock = 16, kMaxWarps = 8, kMaxStages = 16;

struct Params {
  CUtensorMap k_map, v_map;
  const int* tables;  // [seqs][blocks per sequence]
  const int* lens;
  const __nv_bfloat16* q;
  float* out;
  int blocks_per_seq, part, parts, seqs, row, stages, keys, warps, stage_bytes;
  int lookahead, prologue, pdl, epilogue, delay, jitter;
};

__global__ void __launch_bounds__(32 * kMaxWarps) copy_stream(const __grid_constant__ Params p) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  __shared__ __align__(8) uint64_t bars[kMaxWarps][kMaxStages];
  __shared__ float q_tile[8 * 136];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = p.warps;
  // Grid order as the decode's (heads fastest): head, partition, sequence.
  const int head = blockIdx.x % kHeads, part = blockIdx.x / kHeads % p.parts;
  const int seq = blockIdx.x / kHeads / p.parts;
  if (p.pdl) pdl_wait();
  if (lane == 0) {
    for (int i = 0; i < p.stages; ++i) mbar_init(&bars[warp][i], 1);
  }
  mbar_init_fence();
  __syncwarp();
  const uint64_t policy = make_evict_first_policy();

  const int* table = p.tables + seq * p.blocks_per_seq;
  const int blocks = p.keys / kBlock;  // blocks per stage
  const int c0 = part * p.part / p.keys, chunks = p.part / p.keys;
  const int n = (chunks - warp + W - 1) / W;  // this warp's chunks c0 + warp + W j
  unsigned char* ring = smem + warp * p.stages * p.stage_bytes;
  const int slices = p.row / 128, per_block = 2 * slices;  // boxes per block: K then V slices
  auto block_of = [&](int j, int b) { return table[(c0 + warp + W * j) * blocks + b]; };
  int next = 0;  // lookahead: the block id of the next chunk to issue (one block per stage)
  auto issue = [&](int j, int stage) {
    unsigned char* dst = ring + stage * p.stage_bytes;
    uint64_t* bar = &bars[warp][stage];
    if (lane == 0) mbar_arrive_expect(bar, uint32_t(p.stage_bytes));
    if (lane < blocks * per_block) {
      const int b = lane / per_block, r = lane % per_block, is_v = r >= slices;
      const int slice = is_v ? r - slices : r;
      const int blk = p.lookahead && blocks == 1 ? next : block_of(j, b);
      tma_load_4d(dst + (2 * b + is_v) * kBlock * p.row + slice * 2048, is_v ? &p.v_map : &p.k_map,
                  slice * 128, head, 0, blk, bar, policy, true);
    }
  };
  auto look = [&](int j) { next = p.lookahead && j < n ? block_of(j, 0) : 0; };

  if (p.prologue && p.lens[seq] <= 0) return;  // the sequence length gates the first copies
  for (int j = 0; j < p.stages && j < n; ++j) {
    look(j);
    issue(j, j);
  }
  look(p.stages);
  if (p.prologue) {  // the query tile: loads after the first copies, two CTA barriers
    float qv[8];
    for (int k = 0; k < 8; ++k) {
      qv[k] = __bfloat162float(p.q[(blockIdx.x * 1024 + threadIdx.x + k * 128) & ((1 << 20) - 1)]);
    }
    __syncthreads();
    for (int k = 0; k < 8; ++k) q_tile[(threadIdx.x + k * 128) % (8 * 136)] = qv[k];
    __syncthreads();
  }

  int stage = 0;
  uint32_t parity = 0;
  for (int j = 0; j < n; ++j) {
    mbar_wait(&bars[warp][stage], parity);
    __syncwarp();  // every lane is past the wait before the stage is refilled
    if (j + p.stages < n) {
      issue(j + p.stages, stage);
      look(j + p.stages + 1);
    }
    if (p.delay > 0) {  // the chunk's math, after an early release
      uint32_t h = (blockIdx.x * 131u + warp * 7919u + j * 104729u) * 2654435761u;
      const long long cycles = p.jitter ? (h >> 16) % uint32_t(2 * p.delay + 1) : p.delay;
      const long long t0 = clock64();
      while (clock64() - t0 < cycles) {
      }
    }
    if (++stage == p.stages) {
      stage = 0;
      parity ^= 1u;
    }
  }
  if (p.pdl) pdl_trigger();
  if (p.epilogue == 5) __syncthreads();
  if (p.epilogue == 3) {
    for (int i = threadIdx.x; i < 512; i += blockDim.x) p.out[blockIdx.x * 512 + i] = float(i);
  }
  if (p.epilogue == 1 || p.epilogue == 2) {  // each warp's fp32 state through shared memory
    float* mine = reinterpret_cast<float*>(ring);
    for (int i = lane; i < 1024; i += 32) mine[i] = q_tile[i % (8 * 136)] + i;
    __syncthreads();
    for (int i = threadIdx.x; i < 512; i += blockDim.x) {
      float o = 0.f;
      for (int w = 0; w < W; ++w) {
        o += reinterpret_cast<const float*>(smem + w * p.stages * p.stage_bytes)[i];
      }
      if (p.epilogue == 1 || o == 12345.f) p.out[blockIdx.x * 512 + i] = o;
    }
  }
}

// A [blocks, slots, heads, row] byte cache (NHD), or [blocks, heads, slots, row] (hnd), as the
// decode's tensor map (tensor_map.cu) sees it: rows of `row` bytes, 16-slot boxes.
CUtensorMap cache_map(const void* base, int row, int blocks, bool hnd) {
  CacheLayout l;
  l.s_block = int64_t(kBlock) * kHeads * row;
  l.s_head = hnd ? kBlock * row : row;
  l.s_slot = hnd ? row : kHeads * row;
  AttnParams a{};
  a.head_size = row;
  a.num_kv_heads = kHeads;
  a.block_size = kBlock;
  a.num_blocks = blocks;
  CUtensorMap map;
  if (!encode_cache_map(&map, base, l, a, 1)) {
    std::printf("cuTensorMapEncodeTiled refused the cache map\n");
    std::exit(1);
  }
  return map;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, int> o = {
      {"row", 256},  {"seqs", 16},     {"len", 4096},    {"part", 0},
      {"stages", 2}, {"ctas", 3},      {"warps", 4},     {"keys", 16},
      {"hnd", 0},    {"seq_order", 0}, {"lookahead", 0}, {"prologue", 0},
      {"pdl", 0},    {"epilogue", 0},  {"delay", 0},     {"jitter", 0}};
  for (int i = 1; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    const std::string key = eq == nullptr ? "" : std::string(argv[i], size_t(eq - argv[i]));
    if (o.count(key) == 0) {
      std::printf("unknown option %s (see the file's header)\n", argv[i]);
      return 1;
    }
    o[key] = std::atoi(eq + 1);
  }
  const int row = o["row"], seqs = o["seqs"], len = o["len"], part = o["part"] ? o["part"] : len;
  const int warps = std::min(o["warps"], kMaxWarps), keys = o["keys"];
  const int blocks_per_seq = len / kBlock, blocks = seqs * blocks_per_seq;
  const size_t cache_bytes = size_t(blocks) * kBlock * kHeads * row;
  // Rotating sets of caches, > 50 MB of L2 in all, so every call reads from HBM.
  const int sets = int(std::clamp<size_t>((size_t(512) << 20) / (2 * cache_bytes), 1, 4));
  Params p{};
  p.blocks_per_seq = blocks_per_seq;
  p.part = part;
  p.parts = len / part;
  p.seqs = seqs;
  p.row = row;
  p.stages = std::min(o["stages"], kMaxStages);
  p.keys = keys;
  p.warps = warps;
  p.stage_bytes = 2 * keys * row;
  p.lookahead = o["lookahead"];
  p.prologue = o["prologue"];
  p.pdl = o["pdl"];
  p.epilogue = o["epilogue"];
  p.delay = o["delay"];
  p.jitter = o["jitter"];
  // Dynamic shared memory padded so that `ctas` CTAs fit per SM (228 KB, 1 KB reserved per CTA
  // and the static arrays), capped at what one CTA may have.
  const int need = 1024 + warps * p.stages * p.stage_bytes;
  const int smem = std::min((228 << 10) / o["ctas"] - 8192, (227 << 10) - 8192);
  if (need > smem) {
    std::printf("rings of %d B do not fit %d CTAs per SM\n", need, o["ctas"]);
    return 0;
  }
  std::mt19937 rng(1);
  std::vector<Params> ps(sets, p);
  for (Params& s : ps) {
    unsigned char *k, *v;
    CHECK(cudaMalloc(&k, cache_bytes));
    CHECK(cudaMalloc(&v, cache_bytes));
    CHECK(cudaMemset(k, 1, cache_bytes));
    CHECK(cudaMemset(v, 1, cache_bytes));
    s.k_map = cache_map(k, row, blocks, o["hnd"]);
    s.v_map = cache_map(v, row, blocks, o["hnd"]);
    std::vector<int> table(blocks);
    for (int j = 0; j < blocks; ++j) table[j] = j;
    if (!o["seq_order"]) std::shuffle(table.begin(), table.end(), rng);
    int* t;
    CHECK(cudaMalloc(&t, blocks * sizeof(int)));
    CHECK(cudaMemcpy(t, table.data(), blocks * sizeof(int), cudaMemcpyHostToDevice));
    s.tables = t;
  }
  int* lens;
  __nv_bfloat16* q;
  float* out;
  const int grid = seqs * kHeads * p.parts;
  CHECK(cudaMalloc(&lens, seqs * sizeof(int)));
  std::vector<int> host_lens(seqs, len);
  CHECK(cudaMemcpy(lens, host_lens.data(), seqs * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&q, (1 << 20) * sizeof(__nv_bfloat16)));
  CHECK(cudaMemset(q, 0, (1 << 20) * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&out, size_t(grid) * 512 * sizeof(float)));
  for (Params& s : ps) {
    s.lens = lens;
    s.q = q;
    s.out = out;
  }
  CHECK(cudaFuncSetAttribute(copy_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  auto launch = [&](const Params& s) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = 32 * warps;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = p.pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, copy_stream, s));
  };
  // Four rounds over the sets in one CUDA graph; the median of 7 replays.
  constexpr int kRounds = 4;
  for (const Params& s : ps) launch(s);
  CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int r = 0; r < kRounds; ++r) {
    for (const Params& s : ps) launch(s);
  }
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<float> us;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int t = 0; t < 8; ++t) {
    CHECK(cudaEventRecord(a, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (t > 0) us.push_back(ms * 1e3f / float(kRounds * sets));  // the first replay warms up
  }
  std::sort(us.begin(), us.end());
  const double t = us[us.size() / 2];
  std::printf("row %d %d*%d part %d: %d warps x %d stages of %d keys, %d CTAs/SM, grid %d%s%s |",
              row, seqs, len, part, warps, p.stages, keys, o["ctas"], grid, o["hnd"] ? ", hnd" : "",
              o["seq_order"] ? ", blocks in order" : "");
  std::printf(" lookahead %d prologue %d pdl %d epilogue %d delay %d%s: %7.1f us %5.2f TB/s\n",
              p.lookahead, p.prologue, p.pdl, p.epilogue, p.delay, p.jitter ? " (jitter)" : "", t,
              2.0 * cache_bytes / t / 1e6);
  return 0;
}
