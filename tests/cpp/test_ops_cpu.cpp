// CPU ops from C++: fp16/bf16/fp8 conversions, decode attention against a direct computation,
// and argument errors as exceptions.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "error_of.h"
#include "ops/cpu/fp8.h"
#include "ops/cpu/half.h"
#include "ops/cpu/vec.h"
#include "pagedkv/ops.h"

namespace pagedkv {
namespace {

TEST(HalfConversion, RoundTripsEveryFp16) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = cpu_ops::half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(cpu_ops::float_to_half(f), h) << h;
  }
  EXPECT_EQ(cpu_ops::float_to_half(65520.0f), 0x7c00);            // ties to even: overflow to inf
  EXPECT_EQ(cpu_ops::float_to_half(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even mantissa
  EXPECT_EQ(cpu_ops::float_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(cpu_ops::float_to_bf16(1.0f + 3.0f / 256), 0x3f82);
}

TEST(HalfConversion, VectorPathMatchesScalarForEveryFp16) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> got(all.size());
  cpu_ops::load_row(all.data(), DType::kFloat16, got.data(), static_cast<int>(all.size()));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float want = cpu_ops::half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[h])) << h;
    } else {
      EXPECT_EQ(cpu_ops::float_to_bits(got[h]), cpu_ops::float_to_bits(want)) << h;
    }
  }
  // Spot values: 1.0, -2.0, the smallest subnormal, 65504 and -inf.
  EXPECT_EQ(got[0x3c00], 1.0f);
  EXPECT_EQ(got[0xc000], -2.0f);
  EXPECT_EQ(got[0x0001], std::ldexp(1.0f, -24));
  EXPECT_EQ(got[0x7bff], 65504.0f);
  EXPECT_EQ(got[0xfc00], -INFINITY);
}

TEST(Fp8Conversion, RoundTripsEveryCodeAndSaturates) {
  for (auto fmt : {cpu_ops::Fp8Format::kE4M3, cpu_ops::Fp8Format::kE5M2}) {
    for (int c = 0; c < 256; ++c) {
      const float f = cpu_ops::fp8_to_float(static_cast<uint8_t>(c), fmt);
      if (!std::isfinite(f)) continue;
      EXPECT_EQ(cpu_ops::float_to_fp8(f, fmt), c) << c;
    }
  }
  EXPECT_EQ(cpu_ops::fp8_to_float(cpu_ops::float_to_fp8(1e6f, cpu_ops::Fp8Format::kE4M3),
                                  cpu_ops::Fp8Format::kE4M3),
            448.0f);
  EXPECT_EQ(cpu_ops::fp8_to_float(cpu_ops::float_to_fp8(-1e9f, cpu_ops::Fp8Format::kE5M2),
                                  cpu_ops::Fp8Format::kE5M2),
            -57344.0f);
}

// The split-K choice a C++ application gets: the kernel of the call, then the rule for it.
TEST(DecodeSplit, KernelAndRule) {
  std::vector<float> q(4 * 8 * 64), cache(6 * 16 * 2 * 64);
  const TensorView qv(q.data(), DType::kFloat32, {4, 8, 64});
  const TensorView cv(cache.data(), DType::kFloat32, {6, 16, 2, 64});
  EXPECT_EQ(ops::decode_kernel(qv, cv, cv, 2, KVCacheDType::kAuto), AttentionKernel::kCpu);
  EXPECT_EQ(ops::decode_kernel(qv, cv, cv, 2, KVCacheDType::kAuto, AttentionKernel::kCpu),
            AttentionKernel::kCpu);
  // A GPU kernel named for host arrays is refused, not ignored.
  EXPECT_THROW(ops::decode_kernel(qv, cv, cv, 2, KVCacheDType::kAuto, AttentionKernel::kHopper),
               ValueError);
  EXPECT_EQ(ops::decode_partition_size(qv, cv, cv, 2, 4096, KVCacheDType::kAuto), kPartitionSize);
  EXPECT_EQ(ops::decode_partition_size(qv, cv, cv, 2, 512, KVCacheDType::kAuto), 0);
  EXPECT_THROW(ops::decode_kernel(qv, cv, cv, 3, KVCacheDType::kAuto), ValueError);
  using K = AttentionKernel;
  constexpr auto kAuto = KVCacheDType::kAuto, kFp8 = KVCacheDType::kFp8E4M3;
  // H100 (132 SMs), 32 query / 8 KV heads, 16-token blocks.
  EXPECT_EQ(ops::decode_partition_size(K::kHopper, 1, 32, 8, 32768, 16, 132, kAuto), 2048);
  EXPECT_EQ(ops::decode_partition_size(K::kHopper, 16, 32, 8, 4096, 16, 132, kAuto), 0);
  EXPECT_EQ(ops::decode_partition_size(K::kHopper, 16, 32, 8, 4096, 16, 132, kFp8), 1024);
  EXPECT_EQ(ops::decode_partition_size(K::kTensorCore, 1, 32, 8, 32768, 16, 132, kAuto), 1008);
  EXPECT_EQ(ops::decode_partition_size(K::kCudaCore, 32, 32, 8, 8192, 16, 132, kAuto), 2048);
  EXPECT_EQ(ops::decode_partition_size(K::kHopper, 1, 32, 8, 100, 16, 132, kAuto), 0);
  EXPECT_THROW(ops::decode_partition_size(K::kHopper, 1, 32, 8, 4096, 0, 132, kAuto), ValueError);
}

TEST(PagedAttentionV1, MatchesDirectSoftmax) {
  constexpr int kBlocks = 3, kBs = 8, kD = 32, kLen = 11;
  std::vector<float> kc(kBlocks * kBs * kD), vc(kc.size()), q(kD), out(kD, -1.0f);
  for (size_t i = 0; i < kc.size(); ++i) {
    kc[i] = std::sin(0.37f * i);
    vc[i] = std::cos(0.11f * i);
  }
  for (int d = 0; d < kD; ++d) q[d] = 0.05f * d;
  std::vector<int32_t> table = {2, 0}, lens = {kLen};
  AttentionOptions o;
  o.scale = 0.5f;
  const TensorView kv(kc.data(), DType::kFloat32, {kBlocks, kBs, 1, kD});
  const TensorView vv(vc.data(), DType::kFloat32, {kBlocks, kBs, 1, kD});
  ops::paged_attention_v1(TensorView(out.data(), DType::kFloat32, {1, 1, kD}),
                          TensorView(q.data(), DType::kFloat32, {1, 1, kD}), kv, vv, 1,
                          TensorView(table.data(), DType::kInt32, {1, 2}),
                          TensorView(lens.data(), DType::kInt32, {1}), kLen, o);
  std::vector<double> logits(kLen), want(kD, 0.0);
  double mx = -1e30, sum = 0;
  for (int t = 0; t < kLen; ++t) {
    const float* k = &kc[(table[t / kBs] * kBs + t % kBs) * kD];
    double s = 0;
    for (int d = 0; d < kD; ++d) s += double(q[d]) * k[d];
    logits[t] = 0.5 * s;
    mx = std::max(mx, logits[t]);
  }
  for (int t = 0; t < kLen; ++t) {
    const double p = std::exp(logits[t] - mx);
    sum += p;
    const float* v = &vc[(table[t / kBs] * kBs + t % kBs) * kD];
    for (int d = 0; d < kD; ++d) want[d] += p * v[d];
  }
  for (int d = 0; d < kD; ++d) EXPECT_NEAR(out[d], want[d] / sum, 1e-5) << d;

  lens[0] = 17;  // needs 3 blocks, the table has 2
  EXPECT_THROW(ops::paged_attention_v1(TensorView(out.data(), DType::kFloat32, {1, 1, kD}),
                                       TensorView(q.data(), DType::kFloat32, {1, 1, kD}), kv, vv, 1,
                                       TensorView(table.data(), DType::kInt32, {1, 2}),
                                       TensorView(lens.data(), DType::kInt32, {1}), 17, o),
               ValueError);
  EXPECT_THROW(parse_kv_cache_dtype("fp4"), ValueError);
  EXPECT_EQ(parse_kv_cache_dtype("fp8"), KVCacheDType::kFp8E4M3);
}

using testing::error_of;

TEST(OpsValidation, NullDataWithElementsIsAnErrorNamingTheArgument) {
  constexpr int kD = 64;
  std::vector<float> kc(4 * 16 * 2 * kD), vc(kc.size()), q(2 * 8 * kD), out(q.size());
  std::vector<int32_t> table = {0, 1}, lens = {3, 5};
  AttentionOptions o;
  o.scale = 0.125f;
  const TensorView kv(kc.data(), DType::kFloat32, {4, 16, 2, kD});
  const TensorView vv(vc.data(), DType::kFloat32, {4, 16, 2, kD});
  const TensorView qv(q.data(), DType::kFloat32, {2, 8, kD});
  const TensorView ov(out.data(), DType::kFloat32, {2, 8, kD});
  const TensorView bt(table.data(), DType::kInt32, {2, 1});
  const TensorView sl(lens.data(), DType::kInt32, {2});
  const TensorView null_cache(nullptr, DType::kFloat32, {4, 16, 2, kD});
  const TensorView null_query(nullptr, DType::kFloat32, {2, 8, kD});
  auto v1 = [&](const TensorView& out_, const TensorView& q_, const TensorView& k_,
                const TensorView& v_) {
    return error_of([&] { ops::paged_attention_v1(out_, q_, k_, v_, 2, bt, sl, 16, o); });
  };
  EXPECT_EQ(v1(ov, qv, kv, vv), "");
  EXPECT_NE(v1(ov, qv, null_cache, vv).find("key_cache has a null data pointer"),
            std::string::npos);
  EXPECT_NE(v1(ov, qv, kv, null_cache).find("value_cache has a null data pointer"),
            std::string::npos);
  EXPECT_NE(v1(ov, null_query, kv, vv).find("query has a null data pointer"), std::string::npos);
  EXPECT_NE(v1(null_query, qv, kv, vv).find("out has a null data pointer"), std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::paged_attention_v1(ov, qv, kv, vv, 2, TensorView(nullptr, DType::kInt32, {2, 1}),
                                      sl, 16, o);
            }).find("block_tables"),
            std::string::npos);
  std::vector<int64_t> mapping = {0, 1};
  const TensorView bm(mapping.data(), DType::kInt64, {1, 2});
  EXPECT_NE(error_of([&] { ops::swap_blocks(null_cache, kv, bm); }).find("src"), std::string::npos);
  EXPECT_NE(error_of([&] { ops::swap_blocks(kv, null_cache, bm); }).find("dst"), std::string::npos);
  EXPECT_NE(error_of([&] { ops::copy_blocks({null_cache}, {vv}, bm); }).find("key_caches[0]"),
            std::string::npos);
  std::vector<int64_t> slots = {0, 1};
  EXPECT_NE(error_of([&] {
              ops::reshape_and_cache_flash(TensorView(nullptr, DType::kFloat32, {2, 2, kD}),
                                           TensorView(kc.data(), DType::kFloat32, {2, 2, kD}), kv,
                                           vv, TensorView(slots.data(), DType::kInt64, {2}),
                                           KVCacheDType::kAuto, 1.0f, 1.0f);
            }).find("key has a null data pointer"),
            std::string::npos);
  // A null pointer with no elements is fine (an empty batch).
  EXPECT_EQ(error_of([&] {
              ops::paged_attention_v1(TensorView(nullptr, DType::kFloat32, {0, 8, kD}),
                                      TensorView(nullptr, DType::kFloat32, {0, 8, kD}), kv, vv, 2,
                                      TensorView(nullptr, DType::kInt32, {0, 1}),
                                      TensorView(nullptr, DType::kInt32, {0}), 0, o);
            }),
            "");
}

}  // namespace
}  // namespace pagedkv
