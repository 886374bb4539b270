#include "muon/common/matrix_view.h"

#include <ostream>
#include <string>

#include "gtest/gtest.h"

namespace muon {

bool operator==(const MatrixShape& a, const MatrixShape& b) {
  return a.batch == b.batch && a.rows == b.rows && a.cols == b.cols;
}

std::ostream& operator<<(std::ostream& os, const MatrixShape& m) {
  return os << m.batch << " x " << m.rows << " x " << m.cols;
}

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

TEST(MatrixView, EachViewGivesItsMatrices) {
  EXPECT_EQ(View({6, 10}, MatrixView::k2D), (MatrixShape{1, 6, 10}));
  EXPECT_EQ(View({8, 3, 5, 2}, MatrixView::kFlattenTrailing), (MatrixShape{1, 8, 30}));
  // On a 2-D shape flattening is the 2-D view.
  EXPECT_EQ(View({4, 7}, MatrixView::kFlattenTrailing), (MatrixShape{1, 4, 7}));
  EXPECT_EQ(View({4, 6, 3, 2}, MatrixView::kBatchedLeading), (MatrixShape{4, 6, 6}));
  EXPECT_EQ(View({0, 5, 7}, MatrixView::kBatchedLeading), (MatrixShape{0, 5, 7}));
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

// Found by fuzz/placement_fuzzer: the product of a shape's dimensions
// overflowed int64_t (a global shape, or a local one with an empty dimension).
TEST(MatrixView, ShapesWhoseElementCountOverflowsAreRefused) {
  const int64_t big = int64_t{1} << 62;
  EXPECT_TRUE(Has(Error({2, big}, 0), "param 'w': shape [2, 4611686018427387904] has more "
                                      "elements than a 64-bit count holds"));
  EXPECT_TRUE(Has(Error({0, big, 4}, 1), "has more elements than a 64-bit count holds"));
  EXPECT_TRUE(Has(Error({3, big, 2, 0}, 2), "has more elements than a 64-bit count holds"));
  EXPECT_TRUE(Has(Error({3, -2}, 0), "param 'w': shape [3, -2] has a negative dimension"));
  // Empty dimensions are fine when the others fit.
  EXPECT_EQ(View({0, big}, MatrixView::k2D), (MatrixShape{1, 0, big}));
  EXPECT_EQ(View({big, 0, 1}, MatrixView::kBatchedLeading), (MatrixShape{big, 0, 1}));
}

// Only matrices with elements cost work; one parameter may declare at most
// kMaxParamMatrices of them, any number of empty ones.
TEST(MatrixView, DeclaredMatricesWithElementsAreCapped) {
  EXPECT_EQ((MatrixShape{7, 2, 3}).with_elements(), 7);
  EXPECT_EQ((MatrixShape{7, 0, 3}).with_elements(), 0);
  EXPECT_EQ((MatrixShape{7, 2, 0}).with_elements(), 0);
  EXPECT_EQ((MatrixShape{0, 2, 3}).with_elements(), 0);
  const int64_t cap = kMaxParamMatrices, huge = int64_t{1} << 32;
  EXPECT_TRUE(CheckDeclaredMatrices({cap, 1, 1}, {cap, 1, 1}, "param 'w'").ok());
  EXPECT_TRUE(CheckDeclaredMatrices({huge, 0, 3}, {huge, 0, 3}, "param 'w'").ok());
  const absl::Status st = CheckDeclaredMatrices({cap + 1, 2, 6}, {cap + 1, 2, 3, 2}, "param 'w'");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "param 'w': shape [1048577, 2, 3, 2] declares 1048577 matrices of 2 x 6, more than "
            "the 1048576 one parameter may declare (the first step plans each matrix); register "
            "such a tensor as fewer, larger matrices (another matrix view) or split it over "
            "parameters");
}

}  // namespace
}  // namespace muon
