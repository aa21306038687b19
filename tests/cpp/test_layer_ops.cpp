// The fused layer and sampling ops from C++ on raw host buffers (no Python): small cases checked
// by hand, and argument errors as exceptions naming the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "error_of.h"
#include "pagedkv/layer_ops.h"
#include "pagedkv/sampling_ops.h"

namespace pagedkv {
namespace {

using testing::error_of;

TEST(LayerOps, RmsNormAndResidualForm) {
  std::vector<float> x = {3.0f, 4.0f}, w = {1.0f, 2.0f}, out(2);
  const TensorView vx(x.data(), DType::kFloat32, {1, 2}), vw(w.data(), DType::kFloat32, {2});
  ops::rms_norm(TensorView(out.data(), DType::kFloat32, {1, 2}), vx, vw, 0.0f);
  const float inv = 1.0f / std::sqrt(12.5f);  // mean of 9 and 16
  EXPECT_FLOAT_EQ(out[0], 3.0f * inv);
  EXPECT_FLOAT_EQ(out[1], 8.0f * inv);
  ops::rms_norm(TensorView(out.data(), DType::kFloat32, {1, 2}), vx, vw, 0.0f, 1.0f);  // Gemma
  EXPECT_FLOAT_EQ(out[1], 4.0f * inv * 3.0f);

  std::vector<float> residual = {1.0f, -4.0f};
  ops::fused_add_rms_norm(vx, TensorView(residual.data(), DType::kFloat32, {1, 2}), vw, 0.0f);
  EXPECT_EQ(residual, (std::vector<float>{4.0f, 0.0f}));
  EXPECT_FLOAT_EQ(x[0], 4.0f / std::sqrt(8.0f));
  EXPECT_FLOAT_EQ(x[1], 0.0f);
}

TEST(LayerOps, RotaryAndGatedActivation) {
  // One head of 4 dims, rotary over the first 2 (partial): a quarter turn at position 1.
  std::vector<float> q = {1.0f, 2.0f, 7.0f, 8.0f};
  std::vector<float> cache = {1.0f, 0.0f, 0.0f, 1.0f};  // rows: (cos, sin) for positions 0, 1
  std::vector<int64_t> pos = {1};
  ops::rotary_embedding(TensorView(pos.data(), DType::kInt64, {1}),
                        TensorView(q.data(), DType::kFloat32, {1, 1, 4}), std::nullopt,
                        TensorView(cache.data(), DType::kFloat32, {2, 2}), /*is_neox=*/true);
  EXPECT_EQ(q, (std::vector<float>{-2.0f, 1.0f, 7.0f, 8.0f}));

  std::vector<float> gu = {1.0f, 0.0f, 3.0f, 5.0f}, out(2);
  ops::act_and_mul(ops::GatedActivation::kSilu, TensorView(out.data(), DType::kFloat32, {2}),
                   TensorView(gu.data(), DType::kFloat32, {4}));
  EXPECT_FLOAT_EQ(out[0], 3.0f / (1.0f + std::exp(-1.0f)));
  EXPECT_FLOAT_EQ(out[1], 0.0f);
}

TEST(SamplingOps, ThresholdAndRace) {
  std::vector<float> p = {0.125f, 0.5f, 0.25f, 0.125f}, thr(1);
  std::vector<int32_t> k = {2};
  std::vector<float> top_p = {1.0f}, min_p = {0.0f};
  const TensorView vp(p.data(), DType::kFloat32, {1, 4});
  ops::top_k_top_p_threshold(TensorView(thr.data(), DType::kFloat32, {1}), vp,
                             TensorView(k.data(), DType::kInt32, {1}),
                             TensorView(top_p.data(), DType::kFloat32, {1}),
                             TensorView(min_p.data(), DType::kFloat32, {1}));
  EXPECT_EQ(thr[0], 0.25f);
  std::vector<int64_t> keys = {42}, tokens(1, -1);
  ops::sample_exponential_race(TensorView(tokens.data(), DType::kInt64, {1}), vp,
                               TensorView(thr.data(), DType::kFloat32, {1}),
                               TensorView(keys.data(), DType::kInt64, {1}));
  EXPECT_TRUE(tokens[0] == 1 || tokens[0] == 2) << tokens[0];
}

TEST(LayerOps, ErrorsNameTheArgument) {
  std::vector<float> x(8), w(3);
  const TensorView vx(x.data(), DType::kFloat32, {2, 4});
  EXPECT_NE(error_of([&] {
              ops::rms_norm(vx, vx, TensorView(w.data(), DType::kFloat32, {3}), 1e-6f);
            }).find("weight"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::act_and_mul(ops::GatedActivation::kGelu, vx, vx); }).find("out"),
            std::string::npos);
}

}  // namespace
}  // namespace pagedkv
