// What this CPU can run, and which kernel each CPU decision picks.
//
// Every CPU-dependent choice of the CPU backend reads Features(): the
// features the CPU and the OS give (asked once), capped by MUON_CPU_ISA (a
// user's setting, like oneDNN's ONEDNN_MAX_CPU_ISA) and by a test's
// ScopedFeatureMask. So a test drives every decision on any host, and runs
// every kernel wherever the CPU can run it. What the mask does not reach:
// OpenBLAS's own kernel choice (its OPENBLAS_CORETYPE) and oneDNN's
// (ONEDNN_MAX_CPU_ISA).
//
// The decisions:
//   - bf16 products (ChooseBf16Engine): libmuon's AMX tile kernel where the
//     CPU has AMX; libmuon's AVX512-BF16 kernel where it has AVX512-BF16 with
//     a fast VDPBF16PS and no AMX (AMD Zen 4/5); else emulated (fp32 OpenBLAS
//     products, each rounded to bf16: faster than the AVX512-BF16 kernel on
//     Intel's CPUs without AMX, Cooper Lake or Sapphire Rapids with AMX off).
//     oneDNN's matmul only on request.
//   - fp32 products (ChooseFp32Engine): libmuon's AVX-512 kernel
//     (f32_gemm.h) where the CPU has AVX-512, whatever OpenBLAS's core;
//     else OpenBLAS.
//   - the element-wise loops (cpu_kernels.h): the AVX-512, AVX2 or baseline
//     build of each loop (x86-64-v4, -v3, default); all compute the same bits.
#ifndef MUON_MATH_CPU_CPU_FEATURES_H_
#define MUON_MATH_CPU_CPU_FEATURES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muon {
namespace cpu {

// Feature bits. Each level includes the ones before it on every real CPU;
// the mask keeps them as levels (capping AVX-512 drops AVX512-BF16 and AMX).
enum CpuFeature : uint32_t {
  kFeatureAvx2 = 1u << 0,        // x86-64-v3: AVX2, FMA, F16C, BMI1/2 (OS saves YMM)
  kFeatureAvx512 = 1u << 1,      // x86-64-v4: AVX-512 F, BW, CD, DQ, VL (OS saves ZMM)
  kFeatureAvx512Bf16 = 1u << 2,  // AVX512-BF16 (VDPBF16PS, VCVTNEPS2BF16)
  kFeatureAmxBf16 = 1u << 3,     // AMX tiles with bf16, granted to this process by the OS
  // VDPBF16PS retires more multiply-adds per cycle than an fp32 FMA of the
  // same width (twice, on AMD Zen 4/5: measured on a Zen 5 core, 8.4 G/s
  // of either, 540 against 270 GFLOP/s; there libmuon's AVX512-BF16
  // Newton-Schulz takes 0.27-0.33x the emulated one's time), so bf16
  // products beat fp32 ones rounded. Not on Intel's AVX512-BF16 CPUs: measured on a Sapphire Rapids
  // core, VDPBF16PS zmm issued 1.1 G/s against 4.2 G/s for VFMADD zmm (70
  // against 134 GFLOP/s), and libmuon's AVX512-BF16 Newton-Schulz took
  // 1.3-1.5x the emulated one's time (BENCHMARKS.md, "Every CPU kind").
  kFeatureFastBf16Dot = 1u << 4,
};
constexpr uint32_t kAllFeatures = kFeatureAvx2 | kFeatureAvx512 | kFeatureAvx512Bf16 |
                                  kFeatureAmxBf16 | kFeatureFastBf16Dot;

// What the CPU and the OS give this process (asked once; x86-64 Linux only,
// 0 elsewhere).
uint32_t DetectedFeatures();
// "GenuineIntel", "AuthenticAMD", ... ("" off x86).
const std::string& CpuVendor();

// The cap MUON_CPU_ISA sets: "amx" (everything), "avx512_bf16", "avx512",
// "avx2", "baseline" (none of these features); unset or empty: no cap. Any
// other value is an error naming the accepted ones.
absl::StatusOr<uint32_t> IsaCap(const char* setting);

// DetectedFeatures() & MUON_CPU_ISA's cap & the innermost ScopedFeatureMask.
// A malformed MUON_CPU_ISA caps nothing here; FeatureSettingStatus() reports
// it (the backend fails its first Newton-Schulz with it).
uint32_t Features();
absl::Status FeatureSettingStatus();

// "avx2 avx512 avx512_bf16 amx fast_bf16_dot" for the bits set ("none" for 0).
std::string FeatureNames(uint32_t features);

// Caps Features() for the scope (tests: a CPU of another kind on this one).
// Nestable; not for use while another thread asks Features().
class ScopedFeatureMask {
 public:
  explicit ScopedFeatureMask(uint32_t mask);
  ~ScopedFeatureMask();
  ScopedFeatureMask(const ScopedFeatureMask&) = delete;
  ScopedFeatureMask& operator=(const ScopedFeatureMask&) = delete;

 private:
  uint32_t previous_;
};

// The engine of the CPU backend's bf16 products.
enum class Bf16Engine {
  kEmulated,    // fp32 OpenBLAS products, each rounded to bf16
  kAmx,         // libmuon's AMX tile kernel (bf16_gemm.h)
  kAvx512Bf16,  // libmuon's AVX512-BF16 kernel (bf16_gemm.h)
  kOneDnn,      // oneDNN's matmul (AVX512-BF16 or AMX), on request only
};
const char* Bf16EngineName(Bf16Engine engine);  // "emulated", "amx", "avx512_bf16", "onednn"

// The features an engine needs (0 for the emulated one).
uint32_t FeaturesFor(Bf16Engine engine);

// The choice for a CPU with `features`. `request` is MUON_CPU_BF16's value
// ("auto" or unset: the best engine the features allow; "amx",
// "avx512_bf16", "onednn", "emulated": that one, or an error naming the
// missing feature); the older settings still hold when it is unset:
// MUON_CPU_NATIVE_BF16=0 asks for "emulated", MUON_CPU_AMX=0 for "onednn".
absl::StatusOr<Bf16Engine> ChooseBf16Engine(uint32_t features, const char* request,
                                            const char* native_setting = nullptr,
                                            const char* amx_setting = nullptr);
// The same on Features() and this process's environment.
absl::StatusOr<Bf16Engine> ChooseBf16EngineHere();

// The engine of the CPU backend's fp32 products (f32_products.h): the fp32
// Newton-Schulz's, and the emulated bf16 and fp16 ones before rounding.
enum class Fp32Engine {
  kOpenBlas,  // OpenBLAS's SGEMM, SSYRK, SSYMM
  kAvx512,    // libmuon's AVX-512 kernel (f32_gemm.h)
};
const char* Fp32EngineName(Fp32Engine engine);  // "openblas", "avx512"

// The choice for a CPU with `features`.
// `request` is MUON_CPU_FP32's value: "auto" or unset, libmuon's kernel where
// the CPU has AVX-512 (also where OpenBLAS's core runs its own AVX-512
// kernels: one thread per call in tiles, they run at 0.85-0.98x their own
// rate, and the kernel beats them by 1.05-1.2x), else OpenBLAS;
// "avx512" or "openblas", that one, or an error naming the missing feature.
absl::StatusOr<Fp32Engine> ChooseFp32Engine(uint32_t features, const char* request);

}  // namespace cpu
}  // namespace muon

#endif  // MUON_MATH_CPU_CPU_FEATURES_H_
