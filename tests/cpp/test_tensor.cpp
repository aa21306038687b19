// TensorView: construction from DLPack and raw pointers, and the validation helpers.
#include <gtest/gtest.h>

#include <vector>

#include "pagedkv/pagedkv.h"

namespace pagedkv {
namespace {

TEST(TensorView, FromRawPointerIsRowMajor) {
  std::vector<float> buf(24);
  TensorView t(buf.data(), DType::kFloat32, {2, 3, 4});
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.nbytes(), 96u);
}

TEST(TensorView, FromDLPackAppliesOffsetAndStrides) {
  std::vector<uint16_t> buf(64);
  int64_t shape[2] = {4, 8};
  int64_t strides[2] = {16, 1};
  DLTensor dl{};
  dl.data = buf.data();
  dl.device = {kDLCPU, 0};
  dl.ndim = 2;
  dl.dtype = {kDLBfloat, 16, 1};
  dl.shape = shape;
  dl.strides = strides;
  dl.byte_offset = 4;
  TensorView t = TensorView::from_dlpack(dl, "query");
  EXPECT_EQ(t.dtype(), DType::kBFloat16);
  EXPECT_EQ(t.data(), reinterpret_cast<char*>(buf.data()) + 4);
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(t.is_last_dim_contiguous());
}

TEST(TensorView, UnsupportedDTypeNamesArgument) {
  int64_t shape[1] = {4};
  float data[4];
  DLTensor dl{};
  dl.data = data;
  dl.device = {kDLCPU, 0};
  dl.ndim = 1;
  dl.dtype = {kDLComplex, 64, 1};
  dl.shape = shape;
  try {
    TensorView::from_dlpack(dl, "key_cache");
    FAIL() << "expected TypeError";
  } catch (const TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("key_cache"), std::string::npos);
  }
}

TEST(TensorView, Fp8DLPackDTypeSaysCachesAreUint8) {
  int64_t shape[1] = {4};
  uint8_t data[4] = {};
  DLTensor dl{};
  dl.data = data;
  dl.device = {kDLCPU, 0};
  dl.ndim = 1;
  dl.dtype = {10, 8, 1};  // DLPack 1.1 kDLFloat8_e4m3fn (torch.float8_e4m3fn)
  dl.shape = shape;
  try {
    TensorView::from_dlpack(dl, "key_cache");
    FAIL() << "expected TypeError";
  } catch (const TypeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("key_cache"), std::string::npos) << msg;
    EXPECT_NE(msg.find("uint8"), std::string::npos) << msg;
  }
}

TEST(TensorView, ValidationHelpersNameTheArgument) {
  std::vector<int32_t> buf(6);
  TensorView t(buf.data(), DType::kInt32, {2, 3});
  EXPECT_NO_THROW(check_shape(t, "block_tables", {2, -1}));
  EXPECT_THROW(check_shape(t, "block_tables", {3, -1}), ValueError);
  EXPECT_THROW(check_dtype(t, "block_tables", {DType::kInt64}), TypeError);
  EXPECT_THROW(check_ndim(t, "block_tables", 3), ValueError);
  try {
    check_shape(t, "seq_lens", {2});
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("seq_lens"), std::string::npos);
  }
}

TEST(TensorView, ZeroSizeIsContiguousWhateverItsStrides) {
  // numpy exports size-0 arrays with all strides 0; torch with arbitrary ones.
  float dummy = 0.0f;
  const TensorView z(&dummy, DType::kFloat32, {0, 2, 64}, {}, {0, 0, 0});
  EXPECT_EQ(z.numel(), 0);
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_TRUE(z.is_last_dim_contiguous());
  EXPECT_NO_THROW(check_contiguous(z, "key"));
  const TensorView inner(&dummy, DType::kFloat32, {3, 0}, {}, {5, 7});
  EXPECT_TRUE(inner.is_contiguous());
  EXPECT_TRUE(inner.is_last_dim_contiguous());
  // The relaxation is for empty arrays only.
  const TensorView strided(&dummy, DType::kFloat32, {1, 2}, {}, {0, 0});
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_FALSE(strided.is_last_dim_contiguous());
  EXPECT_THROW(check_contiguous(strided, "key"), ValueError);
}

TEST(Version, MatchesBuildInfo) {
  EXPECT_STREQ(version(), build_info().version.c_str());
  EXPECT_FALSE(build_info().compiler.empty());
  if (!build_info().with_cuda) EXPECT_FALSE(cuda_available());
}

}  // namespace
}  // namespace pagedkv
