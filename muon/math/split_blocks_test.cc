#include "muon/math/split_blocks.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "muon/math/cpu/cpu_backend.h"
#include "muon/math/testing/random_matrix.h"
#include "muon/math/testing/reference_ns.h"

namespace muon {
namespace {

// The rows of a GQA-fused QKV weight that belong to block j, written out
// here from the layout (groups of q, k, v rows), not from the library.
std::vector<int64_t> GqaRows(int64_t groups, int64_t q, int64_t kv, int j) {
  std::vector<int64_t> rows;
  const int64_t period = q + 2 * kv;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t first = g * period + (j == 0 ? 0 : j == 1 ? q : q + kv);
    const int64_t size = j == 0 ? q : kv;
    for (int64_t r = 0; r < size; ++r) rows.push_back(first + r);
  }
  return rows;
}

NsConfig Fp32() {
  NsConfig c;
  c.dtype = NsDtype::kFP32;
  return c;
}

// A batch whose blocks do not fit the room at once runs in chunks (here of
// 2, 2 and 1 matrices for the largest block, all 5 at once for the others):
// the same bits as one batch, NorMuon's moments (rows and columns split)
// and lr factors included.
TEST(SplitBlocks, ChunksOfABatchGiveTheWholeBatchsBits) {
  const int64_t count = 5, rows = 24, cols = 20;
  for (const BlockSplit& split : {BlockSplit{0, {8, 4}}, BlockSplit{1, {6, 4}}}) {
    SCOPED_TRACE(SplitString(split));
    const std::vector<BlockShape> shapes = SplitBlockShapes(split, rows, cols);
    const size_t largest = static_cast<size_t>(shapes[0].rows * shapes[0].cols) * 4;
    const std::vector<float> input = RandomNormal(count * rows * cols, 5);
    const int64_t per = SplitMomentCount(split, rows, cols);
    std::vector<std::vector<float>> out, moments;
    for (size_t room : {SplitOrthogonalizer::kDefaultRoomBytes, 2 * largest + 16}) {
      CpuBackend cpu;
      SplitOrthogonalizer s(room);
      const NsConfig config = Fp32();
      ASSERT_TRUE(
          s.Reserve(cpu, MemorySource{}, config, split, count, rows, cols, DType::kF32).ok());
      std::vector<float> work = input, m(static_cast<size_t>(count * per), 0.0f);
      std::vector<float*> mp;
      for (int64_t k = 0; k < count; ++k) mp.push_back(k == 2 ? nullptr : m.data() + k * per);
      const NorMuonStep normuon;
      for (int step = 0; step < 2; ++step) {
        ASSERT_TRUE(s.Run(cpu, config, split, std::vector<double>{0.5, 1.25}, &normuon, mp.data(),
                          {work.data(), count, rows, cols, DType::kF32})
                        .ok());
      }
      out.push_back(work);
      moments.push_back(m);
    }
    EXPECT_EQ(out[0], out[1]);
    EXPECT_EQ(moments[0], moments[1]);
    EXPECT_NE(out[0], input);
    EXPECT_NE(moments[0], std::vector<float>(moments[0].size(), 0.0f));
  }
}

TEST(SplitBlocks, GqaRowsAreOrthogonalizedAsThreeMatrices) {
  const int64_t groups = 3, q = 8, kv = 4, cols = 24, rows = groups * (q + 2 * kv);
  const BlockSplit split{0, {q, kv, kv}};
  ASSERT_TRUE(CheckBlockSplit(split, rows, cols, "p").ok());
  const std::vector<float> input = RandomNormal(rows * cols, 1);
  std::vector<float> work = input;
  CpuBackend cpu;
  SplitOrthogonalizer s;
  const NsConfig config = Fp32();
  ASSERT_TRUE(s.Reserve(cpu, MemorySource{}, config, split, 1, rows, cols, DType::kF32).ok());
  const std::vector<double> ones = {1.0, 1.0, 1.0};
  ASSERT_TRUE(
      s.Run(cpu, config, split, ones, nullptr, nullptr, {work.data(), 1, rows, cols, DType::kF32})
          .ok());
  for (int j = 0; j < 3; ++j) {
    const std::vector<int64_t> picked = GqaRows(groups, q, kv, j);
    const int64_t br = static_cast<int64_t>(picked.size());
    std::vector<double> block;
    for (int64_t r : picked) {
      for (int64_t c = 0; c < cols; ++c) block.push_back(input[static_cast<size_t>(r * cols + c)]);
    }
    const std::vector<double> want = ReferenceNewtonSchulz(block, br, cols, config);
    double err = 0, top = 0;
    for (int64_t i = 0; i < br; ++i) {
      for (int64_t c = 0; c < cols; ++c) {
        const double got = work[static_cast<size_t>(picked[static_cast<size_t>(i)] * cols + c)];
        err = std::max(err, std::fabs(got - want[static_cast<size_t>(i * cols + c)]));
        top = std::max(top, std::fabs(want[static_cast<size_t>(i * cols + c)]));
      }
    }
    EXPECT_LT(err / top, 1e-5) << "block " << j;
  }
  // The whole matrix orthogonalized at once differs: the split is not a no-op.
  std::vector<float> whole = input;
  ASSERT_TRUE(cpu.Orthogonalize(config, {whole.data(), 1, rows, cols, DType::kF32}).ok());
  double apart = 0;
  for (size_t i = 0; i < whole.size(); ++i) apart = std::max(apart, double(std::fabs(whole[i] - work[i])));
  EXPECT_GT(apart, 1e-2);
}

TEST(SplitBlocks, ColumnBlocksFactorsAndMomentsFollowTheirBlock) {
  // dim 1, two blocks of 6 and 2 columns repeating twice: block 0 is
  // columns {0-5, 8-13}, block 1 columns {6, 7, 14, 15}.
  const int64_t rows = 5, cols = 16;
  const BlockSplit split{1, {6, 2}};
  ASSERT_EQ(SplitMomentCount(split, rows, cols), 2 * rows);
  const std::vector<float> input = RandomNormal(rows * cols, 2);
  CpuBackend cpu;
  const NsConfig config = Fp32();
  SplitOrthogonalizer s;
  ASSERT_TRUE(s.Reserve(cpu, MemorySource{}, config, split, 1, rows, cols, DType::kF32).ok());
  std::vector<float> work = input;
  std::vector<float> moments(2 * rows, 0.5f);
  float* mp = moments.data();
  const NorMuonStep normuon{0.9, 1e-8, NsDtype::kFP32};
  const std::vector<double> factors = {1.0, 2.5};
  ASSERT_TRUE(s.Run(cpu, config, split, factors, &normuon, &mp,
                    {work.data(), 1, rows, cols, DType::kF32})
                  .ok());
  const std::vector<std::vector<int64_t>> columns = {{0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13},
                                                     {6, 7, 14, 15}};
  for (int j = 0; j < 2; ++j) {
    const std::vector<int64_t>& cs = columns[static_cast<size_t>(j)];
    const int64_t bc = static_cast<int64_t>(cs.size());
    std::vector<float> block;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c : cs) block.push_back(input[static_cast<size_t>(r * cols + c)]);
    }
    ASSERT_TRUE(cpu.Orthogonalize(config, {block.data(), 1, rows, bc, DType::kF32}).ok());
    std::vector<float> own(rows, 0.5f);
    float* op = own.data();
    ASSERT_TRUE(cpu.NorMuon(normuon, {block.data(), 1, rows, bc, DType::kF32}, &op).ok());
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(moments[static_cast<size_t>(j * rows + r)], own[static_cast<size_t>(r)]);
      for (int64_t k = 0; k < bc; ++k) {
        const float want = block[static_cast<size_t>(r * bc + k)] * static_cast<float>(factors[j]);
        EXPECT_EQ(work[static_cast<size_t>(r * cols + cs[static_cast<size_t>(k)])], want)
            << "block " << j << " row " << r << " column " << cs[static_cast<size_t>(k)];
      }
    }
  }
}

TEST(SplitBlocks, RowMomentsStayInTheMatrixRowOrder) {
  const int64_t rows = 12, cols = 10;
  const BlockSplit split{0, {2, 1}};  // periods of 3 rows: block 0 rows {0,1,3,4,...}
  CpuBackend cpu;
  const NsConfig config = Fp32();
  SplitOrthogonalizer s;
  ASSERT_TRUE(s.Reserve(cpu, MemorySource{}, config, split, 1, rows, cols, DType::kF32).ok());
  std::vector<float> work = RandomNormal(rows * cols, 3);
  const std::vector<float> input = work;
  std::vector<float> moments(rows);
  for (int64_t r = 0; r < rows; ++r) moments[static_cast<size_t>(r)] = 0.1f * (r + 1);
  const std::vector<float> before = moments;
  float* mp = moments.data();
  const NorMuonStep normuon{0.5, 1e-8, NsDtype::kFP32};
  ASSERT_TRUE(s.Run(cpu, config, split, std::vector<double>{1.0, 1.0}, &normuon, &mp,
                    {work.data(), 1, rows, cols, DType::kF32})
                  .ok());
  // Block 1 is rows 2, 5, 8, 11: its moments from its own rows, in place.
  std::vector<float> block;
  std::vector<float> own;
  for (int64_t r = 2; r < rows; r += 3) {
    own.push_back(before[static_cast<size_t>(r)]);
    for (int64_t c = 0; c < cols; ++c) block.push_back(input[static_cast<size_t>(r * cols + c)]);
  }
  ASSERT_TRUE(cpu.Orthogonalize(config, {block.data(), 1, 4, cols, DType::kF32}).ok());
  float* op = own.data();
  ASSERT_TRUE(cpu.NorMuon(normuon, {block.data(), 1, 4, cols, DType::kF32}, &op).ok());
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(moments[static_cast<size_t>(2 + 3 * i)], own[static_cast<size_t>(i)]);
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_EQ(work[static_cast<size_t>((2 + 3 * i) * cols + c)],
                block[static_cast<size_t>(i * cols + c)]);
    }
  }
}

TEST(SplitBlocks, BadSplitsAreNamed) {
  auto message = [](const BlockSplit& s) {
    return std::string(CheckBlockSplit(s, 12, 8, "param 'qkv'").message());
  };
  EXPECT_EQ(message({0, {5, 2}}),
            "param 'qkv': split_sizes {5, 2} add up to 7, which does not divide the 12 rows of "
            "each matrix (the sizes repeat along split_dim 0 until they cover it)");
  EXPECT_NE(message({0, {4, 0}}).find("split_sizes[1] is 0"), std::string::npos);
  EXPECT_NE(message({1, {9}}).find("split_sizes[0] is 9; sizes must be > 0 and add up to at "
                                   "most the columns of each matrix (8)"),
            std::string::npos);
  EXPECT_NE(message({2, {4}}).find("split_dim 2 is invalid"), std::string::npos);
  EXPECT_TRUE(CheckBlockSplit({0, {}}, 12, 8, "p").ok());
  EXPECT_TRUE(CheckBlockSplit({1, {4}}, 12, 8, "p").ok());
}

TEST(SplitBlocks, FlopsAreTheBlocksSum) {
  const NsConfig config = Fp32();
  EXPECT_EQ(SplitNewtonSchulzFlops(config, {0, {4, 2, 2}}, 16, 32),
            NewtonSchulzFlops(config, 8, 32) + 2 * NewtonSchulzFlops(config, 4, 32));
  EXPECT_EQ(SplitNewtonSchulzFlops(config, {}, 16, 32), NewtonSchulzFlops(config, 16, 32));
}

}  // namespace
}  // namespace muon
