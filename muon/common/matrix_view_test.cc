#include "muon/common/matrix_view.h"

#include <string>

#include "gtest/gtest.h"

namespace muon {
namespace {

MatrixShape View(std::vector<int64_t> shape, MatrixView view) {
  absl::StatusOr<MatrixShape> m = ViewAsMatrices(shape, static_cast<int>(view), "param 'w'");
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : MatrixShape{-1, -1, -1};
}

std::string Error(std::vector<int64_t> shape, int view) {
  absl::StatusOr<MatrixShape> m = ViewAsMatrices(shape, view, "param 'w'");
  EXPECT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(m.status().message());
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(MatrixView, TwoDIsTheMatrix) {
  const MatrixShape m = View({6, 10}, MatrixView::k2D);
  EXPECT_EQ(m.batch, 1);
  EXPECT_EQ(m.rows, 6);
  EXPECT_EQ(m.cols, 10);
}

TEST(MatrixView, FlattenTrailingKeepsTheFirstDim) {
  const MatrixShape m = View({8, 3, 5, 2}, MatrixView::kFlattenTrailing);
  EXPECT_EQ(m.batch, 1);
  EXPECT_EQ(m.rows, 8);
  EXPECT_EQ(m.cols, 30);
  // On a 2-D shape it is the 2-D view.
  const MatrixShape two = View({4, 7}, MatrixView::kFlattenTrailing);
  EXPECT_EQ(two.rows, 4);
  EXPECT_EQ(two.cols, 7);
}

TEST(MatrixView, BatchedLeadingSplitsTheFirstDim) {
  const MatrixShape m = View({4, 6, 3, 2}, MatrixView::kBatchedLeading);
  EXPECT_EQ(m.batch, 4);
  EXPECT_EQ(m.rows, 6);
  EXPECT_EQ(m.cols, 6);
  const MatrixShape empty = View({0, 5, 7}, MatrixView::kBatchedLeading);
  EXPECT_EQ(empty.batch, 0);
  EXPECT_EQ(empty.rows, 5);
  EXPECT_EQ(empty.cols, 7);
}

TEST(MatrixView, ErrorsNameTheParamAndTheCause) {
  EXPECT_TRUE(Has(Error({5}, 0), "param 'w': has 1 dimension(s) [5]"));
  EXPECT_TRUE(Has(Error({5}, 0), "AdamW"));
  EXPECT_TRUE(Has(Error({}, 1), "has 0 dimension(s)"));
  EXPECT_TRUE(Has(Error({2, 3, 4}, 0), "choose a matrix view"));
  EXPECT_TRUE(Has(Error({2, 3}, 2), "BATCHED_LEADING needs at least 3 dimensions"));
  EXPECT_TRUE(Has(Error({2, 3}, 3), "matrix_view 3 is unknown"));
  EXPECT_TRUE(Has(Error({2, 3}, -1), "matrix_view -1 is unknown"));
}

}  // namespace
}  // namespace muon
