#include "capi/capi_internal.h"

#include "muon/comm/codes.h"

namespace muon {
namespace capi {

std::string& LastError() {
  thread_local std::string last_error;
  return last_error;
}

muon_status_t Report(const char* fn, const absl::Status& s) {
  if (s.ok()) {
    LastError().clear();
    return MUON_OK;
  }
  try {
    LastError() = absl::StrCat(fn, ": ", s.message());
  } catch (...) {
    LastError().clear();
  }
  return ToCStatus(s.code());
}

absl::Status NullArg(const char* name) {
  return absl::InvalidArgumentError(absl::StrCat(name, " is NULL"));
}

}  // namespace capi
}  // namespace muon
