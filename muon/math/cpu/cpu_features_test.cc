// Every CPU decision on every CPU kind, whatever this host is: the bf16
// engine for each feature set and setting, MUON_CPU_ISA's caps, and the mask
// a test puts on this host's features.
#include "muon/math/cpu/cpu_features.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace muon {
namespace cpu {
namespace {

constexpr uint32_t kAvx2Cpu = kFeatureAvx2;                     // AMD Milan, Rome
constexpr uint32_t kAvx512Cpu = kFeatureAvx2 | kFeatureAvx512;  // Skylake-SP, Ice Lake
constexpr uint32_t kBf16Cpu = kAvx512Cpu | kFeatureAvx512Bf16;  // Cooper Lake, SPR without AMX
constexpr uint32_t kZen4Cpu = kBf16Cpu | kFeatureFastBf16Dot;   // AMD Zen 4/5
constexpr uint32_t kAmxCpu = kBf16Cpu | kFeatureAmxBf16;        // Sapphire Rapids on
constexpr uint32_t kCpus[] = {0, kAvx2Cpu, kAvx512Cpu, kBf16Cpu, kZen4Cpu, kAmxCpu};

Bf16Engine Choose(uint32_t features, const char* request = nullptr,
                  const char* native = nullptr, const char* amx = nullptr) {
  absl::StatusOr<Bf16Engine> e = ChooseBf16Engine(features, request, native, amx);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *e : Bf16Engine::kEmulated;
}

TEST(CpuFeatures, DefaultEngineForEachCpuKind) {
  EXPECT_EQ(Choose(0), Bf16Engine::kEmulated);
  EXPECT_EQ(Choose(kAvx2Cpu), Bf16Engine::kEmulated);
  EXPECT_EQ(Choose(kAvx512Cpu), Bf16Engine::kEmulated);
  EXPECT_EQ(Choose(kBf16Cpu), Bf16Engine::kEmulated);  // faster there (cpu_features.h)
  EXPECT_EQ(Choose(kZen4Cpu), Bf16Engine::kAvx512Bf16);
  EXPECT_EQ(Choose(kAmxCpu), Bf16Engine::kAmx);
  EXPECT_EQ(Choose(kAmxCpu | kFeatureFastBf16Dot), Bf16Engine::kAmx);
  for (uint32_t cpu : kCpus) EXPECT_EQ(Choose(cpu, "auto"), Choose(cpu)) << cpu;
  for (uint32_t cpu : kCpus) EXPECT_EQ(Choose(cpu, ""), Choose(cpu)) << cpu;
}

TEST(CpuFeatures, ExplicitEngineWhereTheCpuRunsIt) {
  for (uint32_t cpu : kCpus) {
    EXPECT_EQ(Choose(cpu, "emulated"), Bf16Engine::kEmulated);
    for (Bf16Engine e : {Bf16Engine::kAmx, Bf16Engine::kAvx512Bf16, Bf16Engine::kOneDnn}) {
      absl::StatusOr<Bf16Engine> got = ChooseBf16Engine(cpu, Bf16EngineName(e));
      if ((cpu & FeaturesFor(e)) == FeaturesFor(e)) {
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, e);
      } else {
        // Refused, naming the setting and what the CPU lacks.
        ASSERT_FALSE(got.ok()) << Bf16EngineName(e) << " on " << FeatureNames(cpu);
        EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
        const std::string msg(got.status().message());
        EXPECT_NE(msg.find(std::string("MUON_CPU_BF16=") + Bf16EngineName(e)), std::string::npos)
            << msg;
        EXPECT_NE(msg.find("has no " + FeatureNames(FeaturesFor(e) & ~cpu)), std::string::npos)
            << msg;
        EXPECT_NE(msg.find("unset MUON_CPU_BF16"), std::string::npos) << msg;
      }
    }
  }
}

TEST(CpuFeatures, UnknownEngineIsRefusedWithTheAcceptedValues) {
  absl::StatusOr<Bf16Engine> got = ChooseBf16Engine(kAmxCpu, "avx512bf16");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("auto, amx, avx512_bf16, onednn, emulated"),
            std::string::npos)
      << got.status();
}

// fp32 products: libmuon's AVX-512 kernel where the CPU has AVX-512
// (whatever OpenBLAS's core: it takes no part); OpenBLAS otherwise; a
// request wins where the CPU runs it.
TEST(CpuFeatures, Fp32EngineForEachCpuKind) {
  auto choose = [](uint32_t cpu, const char* request) {
    absl::StatusOr<Fp32Engine> e = ChooseFp32Engine(cpu, request);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *e : Fp32Engine::kOpenBlas;
  };
  for (const char* request : {static_cast<const char*>(nullptr), "", "auto"}) {
    for (uint32_t cpu : {kZen4Cpu, kAvx512Cpu, kAmxCpu}) {
      EXPECT_EQ(choose(cpu, request), Fp32Engine::kAvx512);
    }
    EXPECT_EQ(choose(kAvx2Cpu, request), Fp32Engine::kOpenBlas);
    EXPECT_EQ(choose(0, request), Fp32Engine::kOpenBlas);
  }
  for (uint32_t cpu : kCpus) EXPECT_EQ(choose(cpu, "openblas"), Fp32Engine::kOpenBlas);
  EXPECT_EQ(choose(kAvx512Cpu, "avx512"), Fp32Engine::kAvx512);
  absl::StatusOr<Fp32Engine> missing = ChooseFp32Engine(kAvx2Cpu, "avx512");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status().message().find("MUON_CPU_FP32=avx512"), std::string::npos);
  EXPECT_NE(missing.status().message().find("has no avx512"), std::string::npos)
      << missing.status();
  absl::StatusOr<Fp32Engine> unknown = ChooseFp32Engine(kZen4Cpu, "mkl");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("auto, avx512, openblas"), std::string::npos)
      << unknown.status();
}

// The older settings, honoured while MUON_CPU_BF16 is unset.
TEST(CpuFeatures, OlderSettings) {
  for (uint32_t cpu : kCpus) {
    EXPECT_EQ(Choose(cpu, nullptr, "0"), Bf16Engine::kEmulated);
    EXPECT_EQ(Choose(cpu, nullptr, "1"), Choose(cpu));
    EXPECT_EQ(Choose(cpu, nullptr, nullptr, "0"),
              (cpu & kFeatureAvx512Bf16) ? Bf16Engine::kOneDnn : Bf16Engine::kEmulated);
    EXPECT_EQ(Choose(cpu, nullptr, "0", "0"), Bf16Engine::kEmulated);
  }
  // MUON_CPU_BF16 wins.
  EXPECT_EQ(Choose(kAmxCpu, "amx", "0", "0"), Bf16Engine::kAmx);
}

TEST(CpuFeatures, IsaCaps) {
  EXPECT_EQ(*IsaCap(nullptr), kAllFeatures);
  EXPECT_EQ(*IsaCap(""), kAllFeatures);
  EXPECT_EQ(*IsaCap("amx"), kAllFeatures);
  // The caps keep the fast dot (a property of the CPU's AVX512-BF16).
  EXPECT_EQ(*IsaCap("avx512_bf16"), kZen4Cpu);
  EXPECT_EQ(*IsaCap("avx512"), kAvx512Cpu | kFeatureFastBf16Dot);
  EXPECT_EQ(*IsaCap("avx2"), kAvx2Cpu | kFeatureFastBf16Dot);
  EXPECT_EQ(*IsaCap("baseline"), uint32_t{kFeatureFastBf16Dot});
  absl::StatusOr<uint32_t> bad = IsaCap("AVX2");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("MUON_CPU_ISA=\"AVX2\""), std::string::npos);
  EXPECT_NE(bad.status().message().find("amx, avx512_bf16, avx512, avx2, baseline"),
            std::string::npos);
}

// The environment's cap and a test's mask both narrow this host's features,
// as levels: dropping a level drops every one above it.
TEST(CpuFeatures, MaskAndCapNarrowThisHost) {
  const uint32_t detected = DetectedFeatures();
  ::unsetenv("MUON_CPU_ISA");
  EXPECT_EQ(Features(), detected);
  {
    ScopedFeatureMask avx2(kAvx2Cpu);
    EXPECT_EQ(Features(), detected & kAvx2Cpu);
    {
      ScopedFeatureMask more(kAmxCpu);  // nested masks only narrow
      EXPECT_EQ(Features(), detected & kAvx2Cpu);
    }
    EXPECT_EQ(Features(), detected & kAvx2Cpu);
  }
  {
    ScopedFeatureMask holes(kFeatureAvx2 | kFeatureAvx512Bf16 | kFeatureAmxBf16);
    EXPECT_EQ(Features(), detected & kAvx2Cpu);  // no AVX-512: nothing above it
  }
  {
    ScopedFeatureMask fast(kAvx512Cpu | kFeatureFastBf16Dot);
    EXPECT_EQ(Features(), detected & kAvx512Cpu);  // no AVX512-BF16: no fast dot
  }
  EXPECT_EQ(Features(), detected);
  ::setenv("MUON_CPU_ISA", "avx512", 1);
  EXPECT_EQ(Features(), detected & kAvx512Cpu);
  ::setenv("MUON_CPU_ISA", "avx512_bf16", 1);
  EXPECT_EQ(Features(), detected & kZen4Cpu);
  EXPECT_TRUE(FeatureSettingStatus().ok());
  ::setenv("MUON_CPU_ISA", "sse", 1);
  EXPECT_EQ(Features(), detected);  // reported, not applied
  EXPECT_FALSE(FeatureSettingStatus().ok());
  ::unsetenv("MUON_CPU_ISA");
}

TEST(CpuFeatures, Names) {
  EXPECT_EQ(FeatureNames(0), "none");
  EXPECT_EQ(FeatureNames(kAmxCpu), "avx2 avx512 avx512_bf16 amx");
  EXPECT_EQ(FeatureNames(kZen4Cpu), "avx2 avx512 avx512_bf16 fast_bf16_dot");
  EXPECT_EQ(FeatureNames(kFeatureAvx512Bf16), "avx512_bf16");
  // What this host is, in the log.
  std::printf("this CPU: %s, features: %s\n", CpuVendor().c_str(),
              FeatureNames(DetectedFeatures()).c_str());
}

}  // namespace
}  // namespace cpu
}  // namespace muon
