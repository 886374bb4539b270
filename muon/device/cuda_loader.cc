#include "muon/device/cuda_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace muon {
namespace {

constexpr char kPluginFile[] = "libmuon_cuda.so";

// The directory of the shared object (or program) this function is in.
std::string OwnDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&OwnDirectory), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

struct Plugin {
  CudaPluginEntry entry = nullptr;
  const MemoryOps* ops = nullptr;  // installed once a device opens
  std::string error;  // why it could not be loaded
};

Plugin LoadPlugin() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MUON_CUDA_PLUGIN"); env != nullptr && *env != '\0') {
    candidates.push_back(env);
  } else {
    const std::string dir = OwnDirectory();
    if (!dir.empty()) candidates.push_back(absl::StrCat(dir, "/", kPluginFile));
    candidates.push_back(kPluginFile);
  }
  std::vector<std::string> failures;
  for (const std::string& c : candidates) {
    void* handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      failures.push_back(e != nullptr ? e : c);
      continue;
    }
    void* sym = dlsym(handle, kCudaPluginEntry);
    if (sym == nullptr) {
      failures.push_back(absl::StrCat(c, ": has no ", kCudaPluginEntry,
                                      " (built without the CUDA toolkit?)"));
      dlclose(handle);
      continue;
    }
    Plugin p;
    p.entry = reinterpret_cast<CudaPluginEntry>(sym);
    if (void* ops = dlsym(handle, kCudaPluginMemoryOps); ops != nullptr) {
      p.ops = reinterpret_cast<CudaPluginMemoryOps>(ops)(kCudaPluginAbi);
    }
    return p;  // stays loaded: devices it made may live until exit
  }
  Plugin p;
  p.error = absl::StrCat(
      "the CUDA plugin ", kPluginFile, " could not be loaded (", absl::StrJoin(failures, "; "),
      "); build it (bazel build //:muon_cuda), keep it beside libmuon.so or name it in "
      "MUON_CUDA_PLUGIN");
  return p;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Device>> OpenCudaDevice(int ordinal) {
  static std::once_flag once;
  static Plugin* plugin = nullptr;
  std::call_once(once, [] { plugin = new Plugin(LoadPlugin()); });  // never freed: see above
  if (plugin->entry == nullptr) return absl::UnavailableError(plugin->error);
  Device* device = nullptr;
  char error[1024] = {};
  const int code = plugin->entry(kCudaPluginAbi, ordinal, &device, error, sizeof error);
  if (code != 0 || device == nullptr) {
    return absl::Status(code != 0 ? static_cast<absl::StatusCode>(code)
                                  : absl::StatusCode::kInternal,
                        error[0] != '\0' ? error : "the CUDA plugin made no device");
  }
  // A GPU is usable: from now on the in-process communicator may be handed
  // its memory (not before: without a GPU its copies would fail).
  if (plugin->ops != nullptr) InstallMemoryOps(plugin->ops);
  return std::shared_ptr<Device>(device);
}

}  // namespace muon
