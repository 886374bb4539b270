#include "muon/math/cpu/onednn_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace muon {

absl::StatusOr<OneDnn> OpenOneDnn(const std::string& file) {
  const std::string fix =
      "; install oneDNN 2.x (Debian: libdnnl2), point MUON_ONEDNN_LIBRARY at its libdnnl.so.2, "
      "or unset MUON_CPU_BF16 to let libmuon choose its own bf16 products";
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat(
        "MUON_CPU_BF16=onednn: cannot open ", file, " (", why ? why : "unknown", ")", fix));
  }
  OneDnn api;
#define MUON_ONEDNN_LOOKUP(name)                                                          \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(handle, "dnnl_" #name));          \
  if (api.name == nullptr) {                                                              \
    dlclose(handle);                                                                      \
    return absl::FailedPreconditionError(absl::StrCat("MUON_CPU_BF16=onednn: ", file,     \
                                                      " has no dnnl_" #name               \
                                                      " (libmuon needs oneDNN 2.x)", fix)); \
  }
  MUON_ONEDNN_FUNCTIONS(MUON_ONEDNN_LOOKUP)
#undef MUON_ONEDNN_LOOKUP
  return api;
}

absl::StatusOr<const OneDnn*> LoadOneDnn() {
  static const absl::StatusOr<OneDnn> loaded = [] {
    const char* setting = std::getenv("MUON_ONEDNN_LIBRARY");
    return OpenOneDnn(setting != nullptr && setting[0] != '\0' ? setting : "libdnnl.so.2");
  }();
  if (!loaded.ok()) return loaded.status();
  return &*loaded;
}

}  // namespace muon
