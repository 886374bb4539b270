// Whether the NVIDIA driver can run what the CUDA plugin was built with, and
// the message that says what to do when it cannot. Plain C++ (no CUDA), so
// that it is tested where no GPU or driver is.
//
// CUDA's minor-version compatibility: a runtime of major M runs on any driver
// that supports CUDA M.0 or later; an older driver fails every call with
// "CUDA driver version is insufficient", which names neither version.
#ifndef MUON_DEVICE_CUDA_DRIVER_CHECK_H_
#define MUON_DEVICE_CUDA_DRIVER_CHECK_H_

#include <string>

namespace muon {

// `driver` and `runtime` as cudaDriverGetVersion and CUDART_VERSION give
// them (1000 * major + 10 * minor; a driver of 0: none installed). Empty when
// the driver will do, else the message.
inline std::string DriverMismatch(int driver, int runtime) {
  const auto version = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  };
  if (driver == 0) {
    return "no NVIDIA driver is installed (cudaDriverGetVersion reports none); libmuon_cuda.so "
           "was built with CUDA " + version(runtime);
  }
  if (driver / 1000 >= runtime / 1000) return "";
  return "the NVIDIA driver supports CUDA " + version(driver) + ", and libmuon_cuda.so was built "
         "with CUDA " + version(runtime) + ", which needs a driver for CUDA " +
         std::to_string(runtime / 1000) + ".0 or later" +
         (runtime / 1000 == 13 ? " (version 580 or later)" :
          runtime / 1000 == 12 ? " (version 525 or later)" : "") +
         ": update the driver, or build the plugin with a CUDA " + std::to_string(driver / 1000) +
         " toolkit";
}

}  // namespace muon

#endif  // MUON_DEVICE_CUDA_DRIVER_CHECK_H_
