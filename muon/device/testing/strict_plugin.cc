// libmuon_strict_gpu.so: the strict GPU (strict_gpu.h) in the CUDA plugin's
// place, so that libmuon.so steps kDLCUDA tensors on it (MUON_CUDA_PLUGIN).
// Device i is strict-cpu device i of one runtime per process (8 devices),
// which tests reach through muon_strict_gpu_runtime().
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "muon/device/cuda_loader.h"
#include "muon/device/testing/strict_cpu_runtime.h"
#include "muon/device/testing/strict_gpu.h"

namespace {

std::shared_ptr<muon::StrictCpuRuntime>& Runtime() {
  static auto* rt = new std::shared_ptr<muon::StrictCpuRuntime>(
      std::make_shared<muon::StrictCpuRuntime>(8));
  return *rt;  // never freed: devices made from it may live until exit
}

thread_local std::string t_error;

int Fail(absl::StatusCode code, const std::string& message, char* error, size_t error_size) {
  if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", message.c_str());
  return static_cast<int>(code);
}

int Sync(void* stream) {
  absl::Status st = Runtime()->StreamSynchronize(stream, "memory ops: waiting for the stream");
  t_error = std::string(st.message());
  return st.ok() ? 0 : 1;
}

int Copy(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0 || dst == src) return 0;
  absl::Status st =
      Runtime()->MemcpyAsync(dst, src, bytes, muon::CopyKind::kDefault, stream, "memory ops: copy");
  t_error = std::string(st.message());
  return st.ok() ? 0 : 1;
}

int HostReadable(const void* ptr) { return Runtime()->DeviceOf(ptr) < 0 ? 1 : 0; }

const char* ErrorString(int) { return t_error.c_str(); }

const muon::MemoryOps kOps = {&Sync, &Copy, &HostReadable, &ErrorString};

}  // namespace

extern "C" __attribute__((visibility("default"))) int muon_cuda_plugin_create_device(
    int abi, int ordinal, muon::Device** device, char* error, size_t error_size) {
  if (abi != muon::kCudaPluginAbi) {
    return Fail(absl::StatusCode::kFailedPrecondition, "plugin interface mismatch", error,
                error_size);
  }
  try {
    absl::StatusOr<int> count = Runtime()->DeviceCount();
    if (ordinal < 0 || ordinal >= *count) {
      return Fail(absl::StatusCode::kInvalidArgument,
                  "strict-cpu device " + std::to_string(ordinal) + " does not exist", error,
                  error_size);
    }
    *device = muon::MakeStrictGpuDevice(Runtime(), ordinal).release();
    return 0;
  } catch (const std::exception& e) {
    return Fail(absl::StatusCode::kInternal, e.what(), error, error_size);
  }
}

extern "C" __attribute__((visibility("default"))) const muon::MemoryOps*
muon_cuda_plugin_memory_ops(int abi) {
  return abi == muon::kCudaPluginAbi ? &kOps : nullptr;
}

// Fault injection (strict_gpu.h).
extern "C" __attribute__((visibility("default"))) void muon_strict_gpu_fail_next_momentum(
    int ordinal) {
  muon::FailNextMomentum(ordinal);
}

// The runtime the devices live on, for tests to allocate, copy and wait.
extern "C" __attribute__((visibility("default"))) muon::StrictCpuRuntime* muon_strict_gpu_runtime() {
  return Runtime().get();
}

// The element-wise launches issued on a device so far (strict_gpu.h).
extern "C" __attribute__((visibility("default"))) void muon_strict_gpu_launches(
    int ordinal, int64_t* momentum, int64_t* apply) {
  const muon::StrictLaunches l = muon::LaunchesOn(ordinal);
  *momentum = l.momentum;
  *apply = l.apply;
}

// The non-finite count launches issued on a device so far (strict_gpu.h).
extern "C" __attribute__((visibility("default"))) int64_t muon_strict_gpu_count_launches(
    int ordinal) {
  return muon::LaunchesOn(ordinal).count;
}
