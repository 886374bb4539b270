#include "muon/device/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/device/cuda/cuda_gpu_runtime.h"
#include "muon/device/cuda/driver_check.h"
#include "muon/device/gpu_device.h"
#include "muon/math/cuda/cuda_backend.h"

namespace muon {

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int ordinal) {
  // A driver too old for this build fails every call with a message that
  // names no version: say which, and what to do.
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess) {
    const std::string mismatch = DriverMismatch(driver, CUDART_VERSION);
    if (!mismatch.empty()) return absl::UnavailableError(mismatch);
  }
  std::shared_ptr<GpuRuntime> rt = MakeCudaRuntime();
  absl::StatusOr<int> count = rt->DeviceCount();
  if (!count.ok() || *count == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no usable CUDA device (", count.ok() ? "none found" : count.status().message(), ")"));
  }
  if (ordinal >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", ordinal, " does not exist (", *count, " are visible)"));
  }
  // The backend's cuBLAS handle belongs to the GPU current when it is made.
  absl::StatusOr<int> previous = rt->GetDevice();
  if (!previous.ok()) return previous.status();
  absl::Status st = rt->SetDevice(ordinal);
  if (!st.ok()) return st;
  absl::StatusOr<std::unique_ptr<CudaBackend>> math = CudaBackend::Create();
  (void)rt->SetDevice(*previous);
  if (!math.ok()) return math.status();
  return MakeGpuDevice(std::move(rt), ordinal, std::move(math).value());
}

}  // namespace muon
