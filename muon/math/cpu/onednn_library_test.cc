// oneDNN opened on first use: what each way of failing to open it says, and
// that the backend hands that message to the caller who asked for oneDNN
// (this binary runs with MUON_CPU_BF16=onednn and MUON_ONEDNN_LIBRARY set to
// a file that does not exist: see BUILD.bazel).
#include "muon/math/cpu/onednn_library.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/math/cpu/cpu_backend.h"
#include "muon/math/cpu/cpu_features.h"

namespace muon {
namespace {

constexpr char kMissing[] = "/nonexistent/libdnnl.so.2";

TEST(OneDnnLibrary, DebiansOneDnnOpensWithEveryFunction) {
  absl::StatusOr<OneDnn> api = OpenOneDnn("libdnnl.so.2");  // deps.sh installs libdnnl2
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_NE(api->engine_create, nullptr);
  EXPECT_NE(api->matmul_desc_init, nullptr);
  EXPECT_NE(api->stream_wait, nullptr);
}

TEST(OneDnnLibrary, AMissingFileNamesItselfAndTheFix) {
  absl::StatusOr<OneDnn> api = OpenOneDnn(kMissing);
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(api.status().message());
  EXPECT_NE(m.find(kMissing), std::string::npos) << m;
  EXPECT_NE(m.find("MUON_ONEDNN_LIBRARY"), std::string::npos) << m;
  EXPECT_NE(m.find("unset MUON_CPU_BF16"), std::string::npos) << m;
}

TEST(OneDnnLibrary, ALibraryWithoutOneDnnsFunctionsNamesTheFirstMissing) {
  absl::StatusOr<OneDnn> api = OpenOneDnn("libz.so.1");
  ASSERT_FALSE(api.ok());
  const std::string m(api.status().message());
  EXPECT_NE(m.find("has no dnnl_engine_create"), std::string::npos) << m;
  EXPECT_NE(m.find("oneDNN 2.x"), std::string::npos) << m;
}

TEST(OneDnnLibrary, TheProcessWideLoadReadsMuonOneDnnLibrary) {
  absl::StatusOr<const OneDnn*> api = LoadOneDnn();
  ASSERT_FALSE(api.ok()) << "MUON_ONEDNN_LIBRARY names a file that does not exist";
  EXPECT_NE(std::string(api.status().message()).find(kMissing), std::string::npos)
      << api.status();
}

TEST(OneDnnLibrary, ABf16StepOnOneDnnThatCannotOpenFailsNamingTheLibrary) {
  const uint32_t need = cpu::FeaturesFor(cpu::Bf16Engine::kOneDnn);
  if ((cpu::Features() & need) != need) {
    GTEST_SKIP() << "this CPU (features: " << cpu::FeatureNames(cpu::Features())
                 << ") has no " << cpu::FeatureNames(need & ~cpu::Features())
                 << ": MUON_CPU_BF16=onednn is refused before oneDNN is opened";
  }
  std::vector<float> u(16 * 8, 0.5f);
  CpuBackend backend;
  NsConfig config;  // bf16
  absl::Status status = backend.Orthogonalize(config, {u.data(), 1, 16, 8});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(status.message()).find(kMissing), std::string::npos) << status;
  EXPECT_EQ(u[0], 0.5f) << "the matrix changed although the step failed";
}

}  // namespace
}  // namespace muon
