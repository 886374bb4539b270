// Split Newton-Schulz on the GPU backend's steps (muon/math/split_ns.h):
// members as threads of one process, each with its own CudaBackend and
// stream on the same GPU, summing through the host (muon/math/testing's
// Summer), against the CPU backend's own OrthogonalizeBlock and NorMuonBlock
// run the same way. Skips, saying why, where no CUDA device can be used.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "muon/math/cpu/cpu_backend.h"
#include "muon/math/cuda/cuda_backend.h"
#include "muon/math/cuda/cuda_test_util.h"
#include "muon/math/split_ns.h"
#include "muon/math/testing/member_summer.h"
#include "muon/math/testing/random_matrix.h"

namespace muon {
namespace {

using cuda_test::Device;
using cuda_test::MaxRel;

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

struct Shape {
  int64_t rows, cols;
  int members;
};

// Member b's block of a row-major rows x cols matrix: rows [j0, j0 + w) of
// a tall one, columns of a wide one (packed row by row).
struct Blocks {
  bool tall;
  int64_t m, n;
  std::vector<int64_t> first, width;
  explicit Blocks(const Shape& s)
      : tall(s.rows > s.cols), m(std::min(s.rows, s.cols)), n(std::max(s.rows, s.cols)) {
    int64_t j0 = 0;
    for (int b = 0; b < s.members; ++b) {
      const int64_t w = n / s.members + (b < n % s.members ? 1 : 0);
      first.push_back(j0);
      width.push_back(w);
      j0 += w;
    }
  }
  std::vector<float> Cut(const std::vector<float>& x, int64_t cols, int b) const {
    std::vector<float> out;
    for (int64_t i = 0; i < (tall ? width[b] : m); ++i) {
      for (int64_t j = 0; j < (tall ? m : width[b]); ++j) {
        out.push_back(tall ? x[(first[b] + i) * cols + j] : x[i * cols + first[b] + j]);
      }
    }
    return out;
  }
  void Put(const std::vector<float>& block, int64_t cols, int b, std::vector<float>* x) const {
    size_t k = 0;
    for (int64_t i = 0; i < (tall ? width[b] : m); ++i) {
      for (int64_t j = 0; j < (tall ? m : width[b]); ++j) {
        (tall ? (*x)[(first[b] + i) * cols + j] : (*x)[i * cols + first[b] + j]) = block[k++];
      }
    }
  }
  MatrixBlock At(float* data, int b) const { return {data, m, width[b], tall, first[b], n}; }
};

// The members' sums on device values: each member's stream waits, its
// values cross to the host, are summed there in member order, and go back.
MemberSums DeviceSums(testing::Summer& summer, int member, cudaStream_t stream) {
  auto sum = [&summer, member, stream](auto* values, int64_t n) -> absl::Status {
    using T = std::remove_pointer_t<decltype(values)>;
    std::vector<T> host(static_cast<size_t>(n));
    if (cudaStreamSynchronize(stream) != cudaSuccess ||
        cudaMemcpy(host.data(), values, host.size() * sizeof(T), cudaMemcpyDeviceToHost) !=
            cudaSuccess) {
      return absl::InternalError("reading a member's sum");
    }
    absl::Status st = summer.Sum(member, host.data(), n);
    if (st.ok() && cudaMemcpy(values, host.data(), host.size() * sizeof(T),
                              cudaMemcpyHostToDevice) != cudaSuccess) {
      st = absl::InternalError("writing a member's sum");
    }
    return st;
  };
  MemberSums s;
  s.f64 = [sum](double* v, int64_t n) { return sum(v, n); };
  s.f32 = [sum](float* v, int64_t n) { return sum(v, n); };
  return s;
}

// The matrix orthogonalized by its members (then NorMuon on the blocks,
// moments per member), on the CPU backend's own program or the GPU's steps.
struct Result {
  std::vector<float> x;
  std::vector<std::vector<float>> moments;
};

Result RunMembers(bool gpu, const NsConfig& cfg, const Shape& s, const std::vector<float>& u,
                  std::vector<absl::Status>* status) {
  const Blocks blocks(s);
  const NorMuonStep step{0.9, 1e-8, cfg.dtype};
  Result r{u, std::vector<std::vector<float>>(s.members, std::vector<float>(s.rows, 0.01f))};
  testing::Summer summer(s.members);
  status->assign(s.members, absl::OkStatus());
  std::vector<std::thread> threads;
  for (int b = 0; b < s.members; ++b) {
    threads.emplace_back([&, b] {
      std::vector<float> block = blocks.Cut(u, s.cols, b);
      absl::Status& st = (*status)[b];
      if (!gpu) {
        CpuBackend cpu;
        cpu.AllowNativeBf16(false);
        const MatrixBlock at = blocks.At(block.data(), b);
        st = cpu.OrthogonalizeBlock(cfg, at, summer.For(b));
        if (st.ok()) st = cpu.NorMuonBlock(step, at, r.moments[b].data(), summer.For(b));
      } else {
        cudaSetDevice(0);
        auto be = CudaBackend::Create();
        cudaStream_t stream = nullptr;
        cudaStreamCreate(&stream);
        // The block one float into its buffer and the workspace 8 bytes
        // into its own, as a round's slots and the engine's workspace may
        // place them (the products must not assume more alignment).
        std::vector<float> padded = {0.0f};
        padded.insert(padded.end(), block.begin(), block.end());
        Device<float> x(padded), moments(r.moments[b]);
        Device<unsigned char> work(
            std::vector<unsigned char>(SplitWorkBytes(cfg, blocks.m, blocks.width[b], blocks.n,
                                                      s.rows) + 8));
        const SplitWork w =
            SplitWorkAt(work.p + 8, cfg, blocks.m, blocks.width[b], blocks.n, s.rows);
        st = be.ok() ? (*be)->SetStream(stream) : be.status();
        if (be.ok()) (*be)->EnableUnprovenAol(cfg.aol);  // this test is AOL's proof on a GPU
        const MemberSums sums = DeviceSums(summer, b, stream);
        if (st.ok()) st = OrthogonalizeBlockOn(**be, cfg, blocks.At(x.p + 1, b), sums, w);
        if (st.ok()) st = NorMuonBlockOn(**be, step, blocks.At(x.p + 1, b), moments.p, sums, w);
        if (cudaStreamSynchronize(stream) != cudaSuccess && st.ok()) {
          st = absl::InternalError("the member's stream failed");
        }
        const std::vector<float> out = x.Get();
        block.assign(out.begin() + 1, out.end());
        r.moments[b] = moments.Get();
        cudaStreamDestroy(stream);
      }
      blocks.Put(block, s.cols, b, &r.x);
    });
  }
  for (std::thread& t : threads) t.join();
  return r;
}

// Every member ends with the same moments (bit for bit: the same summed
// squares), both backends' results are near each other (products in another
// summation order), and something was orthogonalized: the standard quintic
// and cubic5 iterations, Gram Newton-Schulz (a restart, cubic5 and not) and
// AOL's pre-scaling.
TEST(CudaSplit, TheGpusStepsMatchTheCpusSplitNewtonSchulz) {
  REQUIRE_GPU(probe);
  probe.reset();
  const char* const variants[] = {"quintic", "cubic5", "gram", "gram cubic5", "aol"};
  for (NsDtype dtype : {NsDtype::kFP32, NsDtype::kBF16, NsDtype::kFP16}) {
    for (const std::string variant : variants) {
      if (variant == "aol" && dtype == NsDtype::kFP16) continue;  // CPU only (Supports)
      for (const Shape s : {Shape{24, 40, 2}, Shape{40, 24, 3}, Shape{16, 50, 4},
                            Shape{130, 520, 3}, Shape{600, 96, 2}}) {
        SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dtype) << " "
                                          << variant << " " << s.rows << "x" << s.cols
                                          << " over " << s.members);
        NsConfig cfg;
        cfg.dtype = dtype;
        if (variant.find("cubic5") != std::string::npos) {
          cfg.coefficients = ScheduleCoefficients(NsSchedule::kCubic5);
        }
        if (variant.rfind("gram", 0) == 0) cfg.algorithm = NsAlgorithm::kGram;
        if (variant == "aol") {
          cfg.coefficients = ScheduleCoefficients(NsSchedule::kAol);
          cfg.steps = 4;
          cfg.aol = true;
        }
        const std::vector<float> u = RandomNormal(s.rows * s.cols, 31);
        std::vector<absl::Status> cpu_status, gpu_status;
        const Result want = RunMembers(false, cfg, s, u, &cpu_status);
        const Result got = RunMembers(true, cfg, s, u, &gpu_status);
        for (int b = 0; b < s.members; ++b) {
          ASSERT_TRUE(cpu_status[b].ok()) << cpu_status[b];
          ASSERT_TRUE(gpu_status[b].ok()) << gpu_status[b];
          for (int64_t i = 0; i < s.rows; ++i) {
            ASSERT_EQ(Bits(got.moments[b][i]), Bits(got.moments[0][i])) << "member " << b;
          }
        }
        const double bound = dtype == NsDtype::kFP32 ? 1e-4 : dtype == NsDtype::kFP16 ? 1e-2 : 5e-2;
        EXPECT_LT(MaxRel(got.x, want.x), bound);
        EXPECT_LT(MaxRel(got.moments[0], want.moments[0]), bound);
        EXPECT_GT(MaxRel(got.x, u), 0.1) << "nothing was orthogonalized";
      }
    }
  }
}

// The sums' kernels against the host: SumInOrder bit for bit (adds in
// member order), RowSquares within double rounding, with zeros outside its
// rows.
TEST(CudaSplit, SumsAndSquaresMatchTheHost) {
  REQUIRE_GPU(gpu);
  const int64_t count = 3, len = 1001;
  const std::vector<float> parts = RandomNormal(count * len, 5);
  Device<float> dp(parts);
  Device<float> dout{std::vector<float>(len)};
  ASSERT_TRUE(gpu->SumInOrder(false, dp.p, count, len, dout.p).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> out = dout.Get();
  for (int64_t e = 0; e < len; ++e) {
    float total = parts[e];
    for (int64_t i = 1; i < count; ++i) total += parts[i * len + e];
    ASSERT_EQ(Bits(out[e]), Bits(total)) << e;
  }
  // 3 rows of 70,000 (several chunks each) at rows 2..4 of 7.
  const int64_t rows = 3, cols = 70000;
  const std::vector<float> x = RandomNormal(rows * cols, 9);
  Device<float> dx(x);
  Device<double> sq{std::vector<double>(7, -1.0)};
  ASSERT_TRUE(gpu->RowSquares(dx.p, rows, cols, sq.p, 7, 2).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> got = sq.Get();
  for (int64_t k = 0; k < 7; ++k) {
    double want = 0;
    if (k >= 2 && k < 5) {
      const float* row = x.data() + (k - 2) * cols;
      for (int64_t j = 0; j < cols; ++j) want += double(row[j]) * row[j];
    }
    EXPECT_NEAR(got[k], want, 1e-9 * (want + 1)) << "row " << k;
  }
}

}  // namespace
}  // namespace muon
