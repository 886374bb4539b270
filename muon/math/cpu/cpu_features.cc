#include "muon/math/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace muon {
namespace cpu {
namespace {

std::atomic<uint32_t> g_test_mask{kAllFeatures};

// Each level needs the one before it: a mask that drops a level drops
// everything above it.
uint32_t AsLevels(uint32_t f) {
  if (!(f & kFeatureAvx2)) return 0;
  if (!(f & kFeatureAvx512)) return kFeatureAvx2;
  if (!(f & kFeatureAvx512Bf16)) return f & (kFeatureAvx2 | kFeatureAvx512);
  return f;
}

std::string DetectVendor();

#if defined(__x86_64__) && defined(__linux__)
uint32_t Detect() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  const bool fma = c & (1u << 12), movbe = c & (1u << 22), osxsave = c & (1u << 27),
             avx = c & (1u << 28), f16c = c & (1u << 29);
  if (!osxsave) return 0;
  const bool lzcnt = __get_cpuid(0x80000001, &a, &b, &c, &d) && (c & (1u << 5));
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  const unsigned ebx7 = b, edx7 = d;
  uint32_t f = 0;
  const bool ymm_state = (xcr0_lo & 0x6) == 0x6;
  const bool avx2 = ebx7 & (1u << 5), bmi1 = ebx7 & (1u << 3), bmi2 = ebx7 & (1u << 8);
  // x86-64-v3 (the AVX2 loops are built for it).
  if (!(ymm_state && fma && movbe && avx && f16c && avx2 && bmi1 && bmi2 && lzcnt)) return 0;
  f |= kFeatureAvx2;
  const bool zmm_state = (xcr0_lo & 0xe6) == 0xe6;
  const bool avx512 = (ebx7 & (1u << 16)) && (ebx7 & (1u << 17)) && (ebx7 & (1u << 28)) &&
                      (ebx7 & (1u << 30)) && (ebx7 & (1u << 31));  // F, DQ, CD, BW, VL
  if (!(zmm_state && avx512)) return f;
  f |= kFeatureAvx512;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return f;
  f |= kFeatureAvx512Bf16;
  if (DetectVendor() == "AuthenticAMD") f |= kFeatureFastBf16Dot;
  const bool amx = (edx7 & (1u << 22)) && (edx7 & (1u << 24));  // AMX-BF16, AMX-TILE
  // Linux hands the tile state to a process that asks (ARCH_REQ_XCOMP_PERM
  // for XFEATURE_XTILEDATA).
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  if (amx && syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0) f |= kFeatureAmxBf16;
  return f;
}

std::string DetectVendor() {
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return "";
  char v[13];
  std::memcpy(v, &b, 4);
  std::memcpy(v + 4, &d, 4);
  std::memcpy(v + 8, &c, 4);
  v[12] = '\0';
  return v;
}
#else
uint32_t Detect() { return 0; }
std::string DetectVendor() { return ""; }
#endif

struct IsaName {
  const char* name;
  uint32_t cap;
};
constexpr IsaName kIsaNames[] = {
    {"amx", kAllFeatures},
    {"avx512_bf16", kAllFeatures & ~kFeatureAmxBf16},
    {"avx512", kAllFeatures & ~(kFeatureAvx512Bf16 | kFeatureAmxBf16)},
    {"avx2", kAllFeatures & ~(kFeatureAvx512 | kFeatureAvx512Bf16 | kFeatureAmxBf16)},
    {"baseline", kFeatureFastBf16Dot},
};

}  // namespace

uint32_t DetectedFeatures() {
  static const uint32_t detected = AsLevels(Detect());
  return detected;
}

const std::string& CpuVendor() {
  static const std::string* vendor = new std::string(DetectVendor());
  return *vendor;
}

absl::StatusOr<uint32_t> IsaCap(const char* setting) {
  if (setting == nullptr || setting[0] == '\0') return kAllFeatures;
  for (const IsaName& n : kIsaNames) {
    if (std::strcmp(setting, n.name) == 0) return n.cap;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("MUON_CPU_ISA=\"", setting,
                   "\" is not a CPU level libmuon knows: set one of amx, avx512_bf16, avx512, "
                   "avx2, baseline, or unset it"));
}

uint32_t Features() {
  absl::StatusOr<uint32_t> cap = IsaCap(std::getenv("MUON_CPU_ISA"));
  return AsLevels(DetectedFeatures() & (cap.ok() ? *cap : kAllFeatures) &
                  g_test_mask.load(std::memory_order_relaxed));
}

absl::Status FeatureSettingStatus() { return IsaCap(std::getenv("MUON_CPU_ISA")).status(); }

std::string FeatureNames(uint32_t features) {
  std::vector<const char*> names;
  if (features & kFeatureAvx2) names.push_back("avx2");
  if (features & kFeatureAvx512) names.push_back("avx512");
  if (features & kFeatureAvx512Bf16) names.push_back("avx512_bf16");
  if (features & kFeatureAmxBf16) names.push_back("amx");
  if (features & kFeatureFastBf16Dot) names.push_back("fast_bf16_dot");
  return names.empty() ? "none" : absl::StrJoin(names, " ");
}

ScopedFeatureMask::ScopedFeatureMask(uint32_t mask)
    : previous_(g_test_mask.exchange(mask & g_test_mask.load())) {}

ScopedFeatureMask::~ScopedFeatureMask() { g_test_mask.store(previous_); }

const char* Bf16EngineName(Bf16Engine engine) {
  switch (engine) {
    case Bf16Engine::kAmx: return "amx";
    case Bf16Engine::kAvx512Bf16: return "avx512_bf16";
    case Bf16Engine::kOneDnn: return "onednn";
    case Bf16Engine::kEmulated: break;
  }
  return "emulated";
}

uint32_t FeaturesFor(Bf16Engine engine) {
  switch (engine) {
    case Bf16Engine::kAmx: return kFeatureAvx2 | kFeatureAvx512 | kFeatureAvx512Bf16 | kFeatureAmxBf16;
    case Bf16Engine::kAvx512Bf16:
    case Bf16Engine::kOneDnn: return kFeatureAvx2 | kFeatureAvx512 | kFeatureAvx512Bf16;
    case Bf16Engine::kEmulated: break;
  }
  return 0;
}

absl::StatusOr<Bf16Engine> ChooseBf16Engine(uint32_t features, const char* request,
                                            const char* native_setting,
                                            const char* amx_setting) {
  const bool asked = request != nullptr && request[0] != '\0' && std::strcmp(request, "auto") != 0;
  if (!asked) {
    const bool off = native_setting != nullptr && std::strcmp(native_setting, "0") == 0;
    const bool onednn = amx_setting != nullptr && std::strcmp(amx_setting, "0") == 0;
    if (off) return Bf16Engine::kEmulated;
    if (onednn) {  // the older setting: oneDNN where it multiplies bf16 natively
      const uint32_t need = FeaturesFor(Bf16Engine::kOneDnn);
      return (features & need) == need ? Bf16Engine::kOneDnn : Bf16Engine::kEmulated;
    }
    if (features & kFeatureAmxBf16) return Bf16Engine::kAmx;
    if ((features & kFeatureAvx512Bf16) && (features & kFeatureFastBf16Dot)) {
      return Bf16Engine::kAvx512Bf16;
    }
    return Bf16Engine::kEmulated;
  }
  for (Bf16Engine e : {Bf16Engine::kEmulated, Bf16Engine::kAmx, Bf16Engine::kAvx512Bf16,
                       Bf16Engine::kOneDnn}) {
    if (std::strcmp(request, Bf16EngineName(e)) != 0) continue;
    const uint32_t need = FeaturesFor(e);
    if ((features & need) == need) return e;
    return absl::FailedPreconditionError(absl::StrCat(
        "MUON_CPU_BF16=", request, ": this CPU (", CpuVendor().empty() ? "unknown" : CpuVendor(),
        ", features: ", FeatureNames(features), ") has no ", FeatureNames(need & ~features),
        "; unset MUON_CPU_BF16 to let libmuon choose"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("MUON_CPU_BF16=\"", request,
                   "\" is not a bf16 engine: set one of auto, amx, avx512_bf16, onednn, "
                   "emulated, or unset it"));
}

absl::StatusOr<Bf16Engine> ChooseBf16EngineHere() {
  absl::StatusOr<Bf16Engine> engine =
      ChooseBf16Engine(Features(), std::getenv("MUON_CPU_BF16"),
                       std::getenv("MUON_CPU_NATIVE_BF16"), std::getenv("MUON_CPU_AMX"));
  const char* cap = std::getenv("MUON_CPU_ISA");
  if (!engine.ok() && cap != nullptr && cap[0] != '\0') {
    return absl::Status(engine.status().code(),
                        absl::StrCat(engine.status().message(), " (MUON_CPU_ISA=", cap,
                                     " caps this CPU's features)"));
  }
  return engine;
}

const char* Fp32EngineName(Fp32Engine engine) {
  return engine == Fp32Engine::kAvx512 ? "avx512" : "openblas";
}

absl::StatusOr<Fp32Engine> ChooseFp32Engine(uint32_t features, const char* request) {
  const bool avx512 = (features & kFeatureAvx512) != 0;
  if (request == nullptr || request[0] == '\0' || std::strcmp(request, "auto") == 0) {
    // The kernel also where OpenBLAS runs its own AVX-512 kernels: 1.05-1.2x
    // their rate in tiles, and symmetric products (BENCHMARKS.md).
    return avx512 ? Fp32Engine::kAvx512 : Fp32Engine::kOpenBlas;
  }
  if (std::strcmp(request, "openblas") == 0) return Fp32Engine::kOpenBlas;
  if (std::strcmp(request, "avx512") == 0) {
    if (avx512) return Fp32Engine::kAvx512;
    return absl::FailedPreconditionError(absl::StrCat(
        "MUON_CPU_FP32=avx512: this CPU (", CpuVendor().empty() ? "unknown" : CpuVendor(),
        ", features: ", FeatureNames(features),
        ") has no avx512; unset MUON_CPU_FP32 to let libmuon choose"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("MUON_CPU_FP32=\"", request,
                   "\" is not an fp32 engine: set one of auto, avx512, openblas, or unset it"));
}

}  // namespace cpu
}  // namespace muon
