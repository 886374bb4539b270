// CUDA tensors where no GPU can run them: the registration is refused with
// MUON_UNAVAILABLE naming the parameter and the reason, nothing is
// registered, and the optimizer goes on with host tensors. Runs against the
// shipped libmuon.so and the plugin at argv[1] ("missing": a path that does
// not exist). On a machine with a GPU the first test skips (tests/gpu covers
// the GPU).
#include <dlpack/dlpack.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "libmuon/muon.h"
#include "gtest/gtest.h"

namespace {

std::string g_plugin;  // argv[1]

DLTensor Tensor(void* data, int64_t* shape, DLDeviceType type) {
  DLTensor t = {};
  t.data = data;
  t.device = {type, 0};
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  return t;
}

muon_optimizer_t* Create() {
  muon_options_t o;
  muon_options_init(&o, sizeof o);
  muon_optimizer_t* opt = nullptr;
  EXPECT_EQ(muon_create(&o, &opt), MUON_OK);
  return opt;
}

muon_status_t Register(muon_optimizer_t* opt, void* value, void* grad, DLDeviceType type,
                       const char* name, int64_t* id) {
  static int64_t shape[2] = {4, 4};
  DLTensor v = Tensor(value, shape, type), g = Tensor(grad, shape, type);
  muon_param_options_t po;
  muon_param_options_init(&po, sizeof po);
  po.name = name;
  return muon_register_param(opt, &v, &g, &po, id);
}

TEST(CudaPlugin, CudaTensorWithoutAUsableGpuIsRefused) {
  muon_optimizer_t* opt = Create();
  // Never dereferenced: the device is opened before any memory is touched.
  void* fake_value = reinterpret_cast<void*>(0x10000);
  void* fake_grad = reinterpret_cast<void*>(0x20000);
  int64_t id = -7;
  const muon_status_t st = Register(opt, fake_value, fake_grad, kDLCUDA, "w", &id);
  if (st == MUON_OK) {
    muon_destroy(opt);
    GTEST_SKIP() << "a usable GPU is present: tests/gpu checks the GPU path";
  }
  const std::string msg = muon_last_error_message();
  EXPECT_EQ(st, MUON_UNAVAILABLE) << msg;
  EXPECT_EQ(id, -7);
  EXPECT_EQ(msg.find("muon_register_param: param 'w': is a cuda:0 tensor, but "), 0u) << msg;
  if (g_plugin == "missing") {
    EXPECT_NE(msg.find("libmuon_cuda.so could not be loaded"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MUON_CUDA_PLUGIN"), std::string::npos) << msg;
  } else {
    // Built with CUDA: the plugin loads and finds no driver (CI) or no GPU;
    // without CUDA it is empty.
    EXPECT_TRUE(msg.find("no NVIDIA driver is installed") != std::string::npos ||
                msg.find("no usable CUDA device") != std::string::npos ||
                msg.find("built without the CUDA toolkit") != std::string::npos)
        << msg;
  }
  size_t n = 99;
  ASSERT_EQ(muon_num_params(opt, &n), MUON_OK);
  EXPECT_EQ(n, 0u);

  // The optimizer stays on the host and steps host tensors.
  std::vector<float> value(16, 1.0f), grad(16, 0.5f);
  ASSERT_EQ(Register(opt, value.data(), grad.data(), kDLCPU, "w", &id), MUON_OK)
      << muon_last_error_message();
  EXPECT_EQ(id, 0);
  ASSERT_EQ(muon_step(opt, nullptr), MUON_OK) << muon_last_error_message();
  EXPECT_NE(value[0], 1.0f);
  muon_destroy(opt);

  // The failed GPU attempt leaves the in-process communicator on host copies.
  muon_inprocess_world_t* world = nullptr;
  ASSERT_EQ(muon_inprocess_world_create(1, &world), MUON_OK);
  muon_comm_t comm;
  ASSERT_EQ(muon_inprocess_comm(world, nullptr, 0, 0, &comm), MUON_OK);
  const float send[2] = {3.0f, -1.0f};
  float recv[2] = {0.0f, 0.0f};
  EXPECT_EQ(comm.all_gather(comm.ctx, send, recv, sizeof send, nullptr), MUON_OK)
      << muon_last_error_message();
  EXPECT_EQ(recv[0], 3.0f);
  EXPECT_EQ(recv[1], -1.0f);
  comm.release(comm.ctx);
  muon_inprocess_world_destroy(world);
}

TEST(CudaPlugin, OneOptimizerStepsTheParametersOfOneDevice) {
  muon_optimizer_t* opt = Create();
  std::vector<float> value(16, 1.0f), grad(16, 0.5f);
  int64_t id = -1;
  ASSERT_EQ(Register(opt, value.data(), grad.data(), kDLCPU, "a", &id), MUON_OK);
  const muon_status_t st = Register(opt, reinterpret_cast<void*>(0x10000),
                                    reinterpret_cast<void*>(0x20000), kDLCUDA, "b", &id);
  const std::string msg = muon_last_error_message();
  EXPECT_EQ(st, MUON_INVALID_ARGUMENT) << msg;
  EXPECT_NE(msg.find("param 'b': is on cuda:0 but the parameters registered before it are on "
                     "cpu"),
            std::string::npos)
      << msg;
  EXPECT_EQ(id, 0);
  muon_destroy(opt);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) g_plugin = argv[1];
  setenv("MUON_CUDA_PLUGIN", g_plugin == "missing" ? "/nonexistent/libmuon_cuda.so" : g_plugin.c_str(), 1);
  return RUN_ALL_TESTS();
}
