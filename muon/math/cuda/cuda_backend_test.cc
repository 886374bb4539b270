// The GPU backend against the CPU backend (the CPU one is tested against a
// double-precision reference in muon/math/cpu). Skips, saying why, where no
// CUDA device can be used (CI has none).
#include "muon/math/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "muon/common/half.h"
#include "muon/math/cpu/cpu_backend.h"
#include "muon/math/cuda/cuda_test_util.h"
#include "muon/math/split_blocks.h"
#include "muon/math/testing/random_matrix.h"
#include "muon/math/testing/reference_ns.h"

namespace muon {
namespace {

using cuda_test::Device;
using cuda_test::MaxRel;

struct Case {
  int64_t count, rows, cols;
};

// How far the GPU's Newton-Schulz may land from the CPU's, by dtype.
double Bound(NsDtype dtype) {
  return dtype == NsDtype::kFP32 ? 1e-4 : dtype == NsDtype::kFP16 ? 1e-2 : 5e-2;
}

// `u` (c.count matrices of c.rows x c.cols) orthogonalized with `cfg` by
// the CPU backend (*want) and by `gpu` (*got).
void CpuAndGpu(CudaBackend& gpu, const NsConfig& cfg, const Case& c, const std::vector<float>& u,
               std::vector<float>* want, std::vector<float>* got) {
  *want = u;
  CpuBackend cpu;
  ASSERT_TRUE(cpu.Orthogonalize(cfg, {want->data(), c.count, c.rows, c.cols}).ok());
  Device<float> d(u);
  const absl::Status st = gpu.Orthogonalize(cfg, {d.p, c.count, c.rows, c.cols});
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  *got = d.Get();
}

TEST(CudaBackend, NewtonSchulzMatchesCpu) {
  REQUIRE_GPU(gpu);
  for (NsDtype dtype : {NsDtype::kFP32, NsDtype::kBF16, NsDtype::kFP16}) {
  // torch's quintic, and cubic5 (c == 0: the cubic update, two products).
  for (bool cubic : {false, true}) {
    SCOPED_TRACE(cubic ? "cubic5" : "quintic");
    // Wide, tall, square, a vector; and matrices whose norm spans many
    // blocks, with float4 loads (elements % 4 == 0) and without.
    for (Case c : {Case{3, 64, 96}, Case{2, 96, 64}, Case{4, 33, 33}, Case{1, 1, 17},
                   Case{2, 520, 256}, Case{1, 257, 513}}) {
      NsConfig cfg;
      cfg.dtype = dtype;
      if (cubic) cfg.coefficients = ScheduleCoefficients(NsSchedule::kCubic5);
      std::vector<float> want, got;
      ASSERT_NO_FATAL_FAILURE(
          CpuAndGpu(*gpu, cfg, c, RandomNormal(c.count * c.rows * c.cols, 7), &want, &got));
      const double err = MaxRel(got, want);
      // fp32: only the GEMMs' summation order differs. bf16 (fp16): a
      // different order flips roundings of 8-bit (11-bit) mantissas,
      // compounding over 5 steps.
      EXPECT_LT(err, Bound(dtype))
          << "count " << c.count << " " << c.rows << "x" << c.cols;
    }
  }
  }
}

// AOL on the GPU (aol_kernels.h: the input as it is, its gram, the scales
// in double, the first iteration on the scaled gram) against the CPU's
// (cpu/aol.h), fp32 and bf16, wide, tall, square, batched, with symmetric
// tiles and without; fp16 AOL is refused, naming it. Refused by default
// until this test has passed on a GPU (EnableUnprovenAol).
TEST(CudaBackend, AolMatchesCpu) {
  REQUIRE_GPU(gpu);
  NsConfig cfg;
  cfg.coefficients = ScheduleCoefficients(NsSchedule::kAol);
  cfg.steps = 4;
  cfg.aol = true;
  const Case one{1, 64, 96};
  {
    Device<float> d(RandomNormal(one.rows * one.cols, 3));
    EXPECT_EQ(gpu->Orthogonalize(cfg, {d.p, 1, one.rows, one.cols}).code(),
              absl::StatusCode::kUnimplemented);  // not enabled
  }
  gpu->EnableUnprovenAol(true);
  for (int tiles : {1, 2}) {
    gpu->SetSymmetricTiles(tiles);
    for (NsDtype dtype : {NsDtype::kFP32, NsDtype::kBF16}) {
      cfg.dtype = dtype;
      for (Case c : {Case{3, 64, 96}, Case{2, 96, 64}, Case{4, 48, 48}, Case{1, 256, 520}}) {
        SCOPED_TRACE(::testing::Message() << "tiles " << tiles << " ns "
                                          << static_cast<int>(dtype) << " " << c.count << "x"
                                          << c.rows << "x" << c.cols);
        auto u = RandomNormal(c.count * c.rows * c.cols, 11);
        for (float& v : u) v *= 3.0f;  // not of norm 1: AOL does not divide by it
        std::vector<float> want, got;
        ASSERT_NO_FATAL_FAILURE(CpuAndGpu(*gpu, cfg, c, u, &want, &got));
        EXPECT_LT(MaxRel(got, want), Bound(dtype));
        // Nearer the CPU's AOL than the Frobenius-started iteration: the
        // pre-scaling ran.
        NsConfig plain = cfg;
        plain.aol = false;
        auto frob = u;
        CpuBackend cpu;
        ASSERT_TRUE(cpu.Orthogonalize(plain, {frob.data(), c.count, c.rows, c.cols}).ok());
        EXPECT_GT(MaxRel(got, frob), MaxRel(got, want));
      }
    }
  }
  gpu->SetSymmetricTiles(0);
  cfg.dtype = NsDtype::kFP16;
  Device<float> d(RandomNormal(one.rows * one.cols, 3));
  const absl::Status st = gpu->Orthogonalize(cfg, {d.p, 1, one.rows, one.cols});
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(st.message()).find("fp16"), std::string::npos) << st;
}

// Gram Newton-Schulz on the GPU runs the CPU's program (split_ns.h) as
// cuBLASLt products: the CPU backend's result, wide and tall, batched, with
// restarts nowhere, at 2 (the default) and at 1 and 3, quintic and cubic5.
// A square matrix runs the standard iteration on both.
TEST(CudaBackend, GramNewtonSchulzMatchesCpu) {
  REQUIRE_GPU(gpu);
  for (NsDtype dtype : {NsDtype::kFP32, NsDtype::kBF16, NsDtype::kFP16}) {
    for (uint64_t restarts : {uint64_t{0}, uint64_t{1} << 2, (uint64_t{1} << 1) | (uint64_t{1} << 3)}) {
      for (bool cubic : {false, true}) {
        for (Case c : {Case{3, 64, 96}, Case{2, 96, 64}, Case{2, 33, 33}, Case{1, 130, 520},
                       Case{2, 520, 256}}) {
          SCOPED_TRACE(::testing::Message()
                       << "dtype " << static_cast<int>(dtype) << " restarts "
                       << restarts << (cubic ? " cubic5 " : " quintic ") << c.count << "x"
                       << c.rows << "x" << c.cols);
          NsConfig cfg;
          cfg.dtype = dtype;
          cfg.algorithm = NsAlgorithm::kGram;
          cfg.gram_restarts = restarts;
          if (cubic) cfg.coefficients = ScheduleCoefficients(NsSchedule::kCubic5);
          const std::vector<float> u = RandomNormal(c.count * c.rows * c.cols, 11);
          std::vector<float> want, got;
          ASSERT_NO_FATAL_FAILURE(CpuAndGpu(*gpu, cfg, c, u, &want, &got));
          if (dtype != NsDtype::kFP32 && restarts == 0) {
            // Without restarts bf16 round-off compounds through Q (why
            // gram-newton-schulz restarts): the two backends' summation
            // orders land apart (0.098 on an H200 while the CPU read Q, R
            // and Z from one triangle, which compounded more: now both run
            // split_ns.h's general products). Each must be about as near
            // the float64 result as the other.
            std::vector<float> exact;
            for (int64_t k = 0; k < c.count; ++k) {
              const size_t size = static_cast<size_t>(c.rows * c.cols);
              std::vector<double> one(u.begin() + k * size, u.begin() + (k + 1) * size);
              for (double v : ReferenceNewtonSchulz(one, c.rows, c.cols, cfg)) {
                exact.push_back(static_cast<float>(v));
              }
            }
            const double gpu_err = MaxRel(got, exact), cpu_err = MaxRel(want, exact);
            EXPECT_LT(gpu_err, 1.5 * cpu_err + 0.02) << "the CPU's: " << cpu_err;
          } else {
            EXPECT_LT(MaxRel(got, want), Bound(dtype));
          }
          // Not the input: the iterations ran.
          EXPECT_GT(MaxRel(got, u), 0.1);
        }
      }
    }
  }
}

// Symmetric products in t x t tiles (those on and below the diagonal, then
// their mirror) against the whole products, for t = 2, 3 and 4 wherever t
// divides m (else the whole products run): the standard and the Gram
// iterations, every dtype, wide, tall, square and batched; and the tiled
// runs are deterministic.
TEST(CudaBackend, SymmetricTilesMatchTheWholeProducts) {
  REQUIRE_GPU(gpu);
  for (NsDtype dtype : {NsDtype::kFP32, NsDtype::kBF16, NsDtype::kFP16}) {
    for (NsAlgorithm algorithm : {NsAlgorithm::kStandard, NsAlgorithm::kGram}) {
      for (Case c : {Case{3, 64, 96}, Case{2, 96, 64}, Case{1, 192, 520}, Case{2, 256, 256}}) {
        NsConfig cfg;
        cfg.dtype = dtype;
        cfg.algorithm = algorithm;
        const auto u = RandomNormal(c.count * c.rows * c.cols, 13);
        gpu->SetSymmetricTiles(1);
        Device<float> whole(u);
        ASSERT_TRUE(gpu->Orthogonalize(cfg, {whole.p, c.count, c.rows, c.cols}).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> want = whole.Get();
        for (int tiles : {2, 3, 4}) {
          SCOPED_TRACE(::testing::Message()
                       << "dtype " << static_cast<int>(dtype) << " algorithm "
                       << static_cast<int>(algorithm) << " tiles " << tiles << " " << c.count
                       << "x" << c.rows << "x" << c.cols);
          gpu->SetSymmetricTiles(tiles);
          Device<float> once(u), again(u);
          const absl::Status st = gpu->Orthogonalize(cfg, {once.p, c.count, c.rows, c.cols});
          ASSERT_TRUE(st.ok()) << st;
          ASSERT_TRUE(gpu->Orthogonalize(cfg, {again.p, c.count, c.rows, c.cols}).ok());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<float> got = once.Get();
          EXPECT_LT(MaxRel(got, want), dtype == NsDtype::kFP32 ? 1e-5 : Bound(dtype));
          EXPECT_EQ(0, std::memcmp(got.data(), again.Get().data(), got.size() * sizeof(float)));
        }
      }
    }
  }
  gpu->SetSymmetricTiles(0);
}

// NorMuon on the GPU against the CPU backend's (muon/math/normuon.h), three
// steps: fp32 batches with each Newton-Schulz dtype's rounding, and bf16
// batches (the bf16 slots); a matrix whose moments are NULL is left as it
// is. Shapes: rows shorter and longer than a block, one row, one column.
TEST(CudaBackend, NorMuonMatchesCpu) {
  REQUIRE_GPU(gpu);
  struct Kind {
    DType batch;
    NsDtype ns;
  };
  for (Kind kind : {Kind{DType::kF32, NsDtype::kFP32}, Kind{DType::kF32, NsDtype::kBF16},
                    Kind{DType::kF32, NsDtype::kFP16}, Kind{DType::kBF16, NsDtype::kBF16}}) {
    for (Case c : {Case{3, 64, 96}, Case{2, 300, 17}, Case{2, 1, 700}, Case{3, 520, 1}}) {
      SCOPED_TRACE(::testing::Message() << "batch " << static_cast<int>(kind.batch) << " ns "
                                        << static_cast<int>(kind.ns) << " " << c.count << "x"
                                        << c.rows << "x" << c.cols);
      const size_t n = static_cast<size_t>(c.count * c.rows * c.cols);
      const size_t rows = static_cast<size_t>(c.rows);
      std::vector<float> x = RandomNormal(n, 17);
      // Newton-Schulz's output: values of its dtype.
      const int ns_type = kind.ns == NsDtype::kFP16   ? ew::kF16
                          : kind.ns == NsDtype::kBF16 ? ew::kBF16
                                                      : ew::kF32;
      for (float& v : x) v = ew::RoundTo(ns_type, v);
      std::vector<float> moments = RandomNormal(static_cast<size_t>(c.count) * rows, 19);
      for (float& v : moments) v = v * v * 0.01f;
      NorMuonStep step;
      step.beta2 = 0.9;
      step.ns_dtype = kind.ns;
      // CPU: fp32 (or bf16 bits) on the host.
      std::vector<float> cpu_x = x, cpu_m = moments;
      std::vector<uint16_t> cpu_b(n);
      for (size_t i = 0; i < n; ++i) cpu_b[i] = ew::FloatToBf16Bits(x[i]);
      // GPU: the same in device memory.
      Device<float> gx(x), gm(moments);
      Device<uint16_t> gb(cpu_b);
      CpuBackend cpu;
      for (int s = 0; s < 3; ++s) {
        std::vector<float*> host_ptrs, dev_ptrs;
        for (int64_t k = 0; k < c.count; ++k) {
          const bool skip = k == 1;  // not stepped
          host_ptrs.push_back(skip ? nullptr : cpu_m.data() + k * c.rows);
          dev_ptrs.push_back(skip ? nullptr : gm.p + k * c.rows);
        }
        MatrixBatch hb{kind.batch == DType::kF32 ? static_cast<void*>(cpu_x.data())
                                                : static_cast<void*>(cpu_b.data()),
                       c.count, c.rows, c.cols};
        hb.dtype = kind.batch;
        MatrixBatch db{kind.batch == DType::kF32 ? static_cast<void*>(gx.p)
                                                : static_cast<void*>(gb.p),
                       c.count, c.rows, c.cols};
        db.dtype = kind.batch;
        ASSERT_TRUE(cpu.NorMuon(step, hb, host_ptrs.data()).ok());
        const absl::Status st = gpu->NorMuon(step, db, dev_ptrs.data());
        ASSERT_TRUE(st.ok()) << st;
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> got(n), want(n);
      if (kind.batch == DType::kF32) {
        got = gx.Get();
        want = cpu_x;
      } else {
        const std::vector<uint16_t> gbits = gb.Get();
        for (size_t i = 0; i < n; ++i) {
          got[i] = ew::Bf16BitsToFloat(gbits[i]);
          want[i] = ew::Bf16BitsToFloat(cpu_b[i]);
        }
      }
      // The rows' divisors differ in the last bits of double sums at most:
      // fp32 agrees to float precision, a rounded dtype within an ulp.
      const double bound = kind.ns == NsDtype::kFP32   ? 1e-5
                           : kind.ns == NsDtype::kFP16 ? 2e-3
                                                       : 1.6e-2;
      EXPECT_LT(MaxRel(got, want), bound);
      EXPECT_LT(MaxRel(gm.Get(), cpu_m), 1e-5);
      // The matrix not stepped: its bits as they were.
      const size_t size = rows * static_cast<size_t>(c.cols);
      for (size_t i = size; i < 2 * size; ++i) {
        ASSERT_EQ(got[i], x[i]) << "element " << i;
      }
      // And the values moved (NorMuon ran; one row keeps its norm, so stays).
      if (c.rows > 1) {
        EXPECT_GT(MaxRel(got, x), 1e-3);
      }
    }
  }
}

// Split blocks in device memory (CopyRuns, ScaleRounded, a batch per
// block) against the CPU's run on the host: rows in periods of {8, 4}, and
// columns in periods of {6, 9, 15}, each with lr factors and NorMuon (one
// matrix not stepped), fp32 and bf16 Newton-Schulz.
TEST(CudaBackend, SplitBlocksMatchCpu) {
  REQUIRE_GPU(gpu);
  MemorySource device_memory;
  device_memory.allocate = [](size_t bytes, const std::string&) -> absl::StatusOr<void*> {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return absl::ResourceExhaustedError("cudaMalloc");
    return p;
  };
  device_memory.free = [](void* p) { cudaFree(p); };
  struct SplitCase {
    Case shape;
    BlockSplit split;
    std::vector<double> factors;
  };
  const SplitCase cases[] = {
      {{3, 48, 40}, {0, {8, 4}}, {1.0, 0.75}},
      {{2, 24, 60}, {1, {6, 9, 15}}, {1.5, 1.0, 0.5}},
  };
  for (NsDtype dtype : {NsDtype::kFP32, NsDtype::kBF16}) {
    for (const SplitCase& c : cases) {
      SCOPED_TRACE(::testing::Message() << "ns " << static_cast<int>(dtype) << " "
                                        << SplitString(c.split));
      NsConfig config;
      config.dtype = dtype;
      const Case& m = c.shape;
      const size_t n = static_cast<size_t>(m.count * m.rows * m.cols);
      const int64_t per = SplitMomentCount(c.split, m.rows, m.cols);
      std::vector<float> x = RandomNormal(n, 23), moments(static_cast<size_t>(m.count * per));
      CpuBackend cpu;
      Device<float> gx(x), gm(moments);
      SplitOrthogonalizer on_cpu, on_gpu;
      ASSERT_TRUE(on_cpu.Reserve(cpu, MemorySource{}, config, c.split, m.count, m.rows, m.cols,
                                 DType::kF32)
                      .ok());
      ASSERT_TRUE(on_gpu.Reserve(*gpu, device_memory, config, c.split, m.count, m.rows, m.cols,
                                 DType::kF32)
                      .ok());
      NorMuonStep normuon;
      normuon.ns_dtype = dtype;
      std::vector<float*> host_ptrs, dev_ptrs;
      for (int64_t k = 0; k < m.count; ++k) {
        const bool skip = k == 1;
        host_ptrs.push_back(skip ? nullptr : moments.data() + k * per);
        dev_ptrs.push_back(skip ? nullptr : gm.p + k * per);
      }
      std::vector<float> want = x;
      ASSERT_TRUE(on_cpu.Run(cpu, config, c.split, c.factors, &normuon, host_ptrs.data(),
                             {want.data(), m.count, m.rows, m.cols, DType::kF32})
                      .ok());
      const absl::Status st = on_gpu.Run(*gpu, config, c.split, c.factors, &normuon,
                                         dev_ptrs.data(), {gx.p, m.count, m.rows, m.cols,
                                                           DType::kF32});
      ASSERT_TRUE(st.ok()) << st;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_LT(MaxRel(gx.Get(), want), Bound(dtype));
      EXPECT_LT(MaxRel(gm.Get(), moments), dtype == NsDtype::kFP32 ? 1e-3 : 5e-2);
      EXPECT_GT(MaxRel(want, x), 0.1);  // the blocks moved
    }
  }
}

// bf16 Newton-Schulz on a bf16 batch (the exchange's bf16 slots) gives the
// fp32 batch's results bit for bit: its input is rounded to bf16 first and
// its result is bf16 either way. Shapes with and without vector loads.
TEST(CudaBackend, Bf16BatchesGiveTheFp32BatchesResults) {
  REQUIRE_GPU(gpu);
  NsConfig cfg;
  cfg.dtype = NsDtype::kBF16;
  EXPECT_EQ(gpu->SlotDtype(cfg), DType::kBF16);
  for (Case c : {Case{3, 64, 96}, Case{1, 257, 513}, Case{2, 520, 256}, Case{1, 1, 17}}) {
    const size_t n = static_cast<size_t>(c.count * c.rows * c.cols);
    const auto u = RandomNormal(n, 21);
    std::vector<uint16_t> u16(n);
    for (size_t i = 0; i < n; ++i) u16[i] = ew::FloatToBf16Bits(u[i]);
    Device<float> wide(u);
    Device<uint16_t> narrow(u16);
    ASSERT_TRUE(gpu->Orthogonalize(cfg, {wide.p, c.count, c.rows, c.cols}).ok());
    MatrixBatch b{narrow.p, c.count, c.rows, c.cols};
    b.dtype = DType::kBF16;
    ASSERT_TRUE(gpu->Orthogonalize(cfg, b).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> w = wide.Get();
    const std::vector<uint16_t> got = narrow.Get();
    size_t differ = 0;
    for (size_t i = 0; i < n; ++i) differ += ew::FloatToBf16Bits(w[i]) != got[i] ? 1 : 0;
    EXPECT_EQ(differ, 0u) << "count " << c.count << " " << c.rows << "x" << c.cols;
  }
}

// The norm's reduction has a fixed order: two runs give the same bits.
TEST(CudaBackend, NewtonSchulzIsDeterministic) {
  REQUIRE_GPU(gpu);
  NsConfig cfg;
  const Case c{3, 700, 300};
  const auto u = RandomNormal(c.count * c.rows * c.cols, 11);
  Device<float> first(u), second(u);
  ASSERT_TRUE(gpu->Orthogonalize(cfg, {first.p, c.count, c.rows, c.cols}).ok());
  ASSERT_TRUE(gpu->Orthogonalize(cfg, {second.p, c.count, c.rows, c.cols}).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(first.Get(), second.Get());
}

// Several tensors (more than one launch holds, of mixed dtypes and sizes)
// stepped by one call each, with the hyper-parameters read from device
// memory, against the CPU backend.
// skip_nonfinite's count: every tensor in one call (45 of them: two
// launches of at most 40), fp32, bf16 and fp16, empty to several chunks,
// against the host's count of the same values.
TEST(CudaBackend, CountNonFiniteAllMatchesTheHostsCount) {
  REQUIRE_GPU(be);
  std::vector<std::unique_ptr<Device<float>>> f32;
  std::vector<std::unique_ptr<Device<uint16_t>>> half;
  std::vector<CountArgs> args;
  int64_t want = 0;
  for (int i = 0; i < 45; ++i) {
    const int64_t n = i % 5 == 0 ? 0 : (i % 3 == 0 ? 5 * 1024 + 7 : 1 + 37 * i);
    const DType dtype = i % 3 == 0 ? DType::kF32 : (i % 3 == 1 ? DType::kBF16 : DType::kF16);
    std::vector<float> v = RandomNormal(n, 100 + i);
    for (int64_t k = i; k < n; k += 97 + i) v[static_cast<size_t>(k)] = k % 2 ? NAN : -INFINITY;
    if (dtype == DType::kF32) {
      want += CountNonFinite(dtype, v.data(), n);
      f32.push_back(std::make_unique<Device<float>>(v));
      args.push_back({dtype, f32.back()->p, n});
      continue;
    }
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    for (int64_t k = 0; k < n; ++k) {
      bits[static_cast<size_t>(k)] = dtype == DType::kBF16 ? FloatToBf16Bits(v[static_cast<size_t>(k)])
                                                          : FloatToF16Bits(v[static_cast<size_t>(k)]);
    }
    want += CountNonFinite(dtype, bits.data(), n);
    half.push_back(std::make_unique<Device<uint16_t>>(bits));
    args.push_back({dtype, half.back()->p, n});
  }
  ASSERT_GT(want, 100);
  Device<int64_t> counter(std::vector<int64_t>{7});
  ASSERT_TRUE(be->CountNonFiniteAll(args, counter.p).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(counter.Get()[0], 7 + want);
}

// An error another call left pending on this thread is not read, cleared
// or blamed on libmuon's launch: the launch is refused naming it as pending,
// and the caller still reads it.
TEST(CudaBackend, AnErrorPendingBeforeALaunchIsLeftForItsCaller) {
  REQUIRE_GPU(be);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  void* huge = nullptr;
  ASSERT_EQ(cudaMalloc(&huge, size_t{1} << 62), cudaErrorMemoryAllocation);  // the host's call
  Device<int64_t> counter(std::vector<int64_t>{0});
  Device<float> x(std::vector<float>{1.0f, NAN});
  const CountArgs args[] = {{DType::kF32, x.p, 2}};
  const absl::Status st = be->CountNonFiniteAll(args, counter.p);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("pending before it"), std::string::npos) << st;
  EXPECT_NE(st.message().find("cudaErrorMemoryAllocation"), std::string::npos) << st;
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation) << "libmuon read the host's error";
  ASSERT_TRUE(be->CountNonFiniteAll(args, counter.p).ok());  // read: launches again
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(counter.Get()[0], 1);
}

TEST(CudaBackend, MomentumAndApplyMatchCpu) {
  REQUIRE_GPU(gpu);
  constexpr int kTensors = 45;
  std::vector<std::vector<float>> g, b, p, u, out(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    const size_t n = 1 + static_cast<size_t>(i) * 397;
    g.push_back(RandomNormal(n, 1 + i));
    b.push_back(RandomNormal(n, 100 + i));
    p.push_back(RandomNormal(n, 200 + i));
    u.push_back(RandomNormal(n, 300 + i));
    out[i].assign(n, 0.0f);
  }
  auto b_cpu = b, p_cpu = p, out_cpu = out;
  const StepScalars scalars{0.02, 0.05, 0.9};
  std::vector<MomentumArgs> m(kTensors);
  std::vector<ApplyArgs> a(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    const int64_t n = static_cast<int64_t>(g[i].size());
    m[i] = {DType::kF32, g[i].data(), DType::kF32, b_cpu[i].data(), n, out_cpu[i].data()};
    a[i] = {DType::kF32, p_cpu[i].data(), n, u[i].data(), 1.0 + i * 0.25};
    a[i].cautious = i % 2 == 1;
    a[i].weight_decay_scale = i % 3 == 0 ? 1.0 : 0.5 * i;  // per-parameter decay
  }
  CpuBackend cpu;
  MomentumStep step;
  step.scalars = &scalars;
  ASSERT_TRUE(cpu.Momentum(step, m).ok());
  ASSERT_TRUE(cpu.Apply({&scalars, nullptr}, a).ok());

  std::vector<std::unique_ptr<Device<float>>> dg, db, dp, du, dout;
  for (int i = 0; i < kTensors; ++i) {
    dg.push_back(std::make_unique<Device<float>>(g[i]));
    db.push_back(std::make_unique<Device<float>>(b[i]));
    dp.push_back(std::make_unique<Device<float>>(p[i]));
    du.push_back(std::make_unique<Device<float>>(u[i]));
    dout.push_back(std::make_unique<Device<float>>(out[i]));
    m[i].grad = dg[i]->p;
    m[i].buf = db[i]->p;
    m[i].out = dout[i]->p;
    a[i].param = dp[i]->p;
    a[i].update = du[i]->p;
  }
  StepScalars* dscalars = nullptr;
  ASSERT_EQ(cudaMalloc(&dscalars, sizeof(StepScalars)), cudaSuccess);
  ASSERT_TRUE(gpu->StoreScalars(dscalars, scalars).ok());
  step.scalars = dscalars;
  ASSERT_TRUE(gpu->Momentum(step, m).ok());
  ASSERT_TRUE(gpu->Apply({dscalars, nullptr}, a).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(dscalars);
  // The GPU contracts a*b+c into one rounding (as torch's CUDA kernels do):
  // at most a last-bit difference.
  for (int i = 0; i < kTensors; ++i) {
    EXPECT_LT(MaxRel(db[i]->Get(), b_cpu[i]), 1e-6) << i;
    EXPECT_LT(MaxRel(dout[i]->Get(), out_cpu[i]), 1e-6) << i;
    EXPECT_LT(MaxRel(dp[i]->Get(), p_cpu[i]), 1e-6) << i;
  }
}

// The element-wise kernels take 4 elements per vector access where every
// pointer is aligned for it, else one at a time: the same element math, so
// the same bits. Each tensor is stepped twice, aligned (vector path, scalar
// tail) and one element off alignment (scalar path), in bf16 and fp32 mixes.
TEST(CudaBackend, VectorAndScalarElementPathsGiveTheSameBits) {
  REQUIRE_GPU(gpu);
  const StepScalars scalars{0.02, 0.05, 0.9};
  StepScalars* dscalars = nullptr;
  ASSERT_EQ(cudaMalloc(&dscalars, sizeof(StepScalars)), cudaSuccess);
  ASSERT_TRUE(gpu->StoreScalars(dscalars, scalars).ok());
  struct Mix {
    DType grad, buf, out, param;
  };
  for (const Mix& mix : {Mix{DType::kBF16, DType::kF32, DType::kBF16, DType::kBF16},
                         Mix{DType::kF32, DType::kF32, DType::kF32, DType::kF32},
                         Mix{DType::kF16, DType::kF16, DType::kF32, DType::kF16}}) {
    std::vector<std::vector<float>> results[2];  // [offset]: buf, out, param of each size
    for (int offset = 0; offset < 2; ++offset) {
      for (int64_t n : {int64_t{4096}, int64_t{5000}, int64_t{3}}) {
        // One element in: 4 bytes (fp32) or 2 (16-bit) off the 16/8-byte
        // alignment, holding the same bytes as the aligned run's tensor.
        const auto shift = [&](DType t) { return offset * (t == DType::kF32 ? 4 : 2); };
        const auto values = [&](uint32_t seed, DType t) {
          const std::vector<float> v = RandomNormal(static_cast<size_t>(n), seed);
          std::vector<float> out(static_cast<size_t>(n) + 2, 0.0f);
          std::vector<uint16_t> half(v.size());
          for (size_t i = 0; i < v.size(); ++i) {
            half[i] = t == DType::kBF16 ? ew::FloatToBf16Bits(v[i]) : ew::FloatToF16Bits(v[i]);
          }
          const void* src = t == DType::kF32 ? static_cast<const void*>(v.data()) : half.data();
          std::memcpy(reinterpret_cast<char*>(out.data()) + shift(t), src,
                      v.size() * (t == DType::kF32 ? 4 : 2));
          return out;
        };
        Device<float> g(values(1, mix.grad)), b(values(2, mix.buf)), o(values(3, mix.out)),
            pa(values(4, mix.param));
        const auto at = [&](DType t, float* base) -> void* {
          return reinterpret_cast<char*>(base) + shift(t);
        };
        MomentumArgs m{mix.grad, at(mix.grad, g.p), mix.buf, at(mix.buf, b.p), n,
                       at(mix.out, o.p), mix.out};
        ApplyArgs a{mix.param, at(mix.param, pa.p), n, at(mix.out, o.p), 1.5, mix.out};
        MomentumStep step;
        step.scalars = dscalars;
        ASSERT_TRUE(gpu->Momentum(step, {&m, 1}).ok());
        ASSERT_TRUE(gpu->Apply({dscalars, nullptr}, {&a, 1}).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        // Compared as the bytes each tensor's n elements occupy, from its start.
        for (auto* d : {&b, &o, &pa}) {
          std::vector<float> all = d->Get();
          const DType t = d == &b ? mix.buf : d == &o ? mix.out : mix.param;
          const size_t bytes = static_cast<size_t>(n) * (t == DType::kF32 ? 4 : 2);
          std::vector<float> mine((bytes + 3) / 4 + 1, 0.0f);
          std::memcpy(mine.data(), reinterpret_cast<char*>(all.data()) + shift(t), bytes);
          results[offset].push_back(mine);
        }
      }
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    for (size_t k = 0; k < results[0].size(); ++k) {
      EXPECT_EQ(0, std::memcmp(results[0][k].data(), results[1][k].data(),
                               results[0][k].size() * 4))
          << "tensor " << k << " of mix grad " << static_cast<int>(mix.grad);
    }
  }
  cudaFree(dscalars);
}

}  // namespace
}  // namespace muon
