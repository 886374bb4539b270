#include "capi/capi_internal.h"

namespace muon {
namespace capi {

std::string& LastError() {
  thread_local std::string last_error;
  return last_error;
}

muon_status_t ToCode(absl::StatusCode code) {
  const int c = static_cast<int>(code);
  switch (c) {
    case MUON_OK:
    case MUON_CANCELLED:
    case MUON_UNKNOWN:
    case MUON_INVALID_ARGUMENT:
    case MUON_NOT_FOUND:
    case MUON_ALREADY_EXISTS:
    case MUON_RESOURCE_EXHAUSTED:
    case MUON_FAILED_PRECONDITION:
    case MUON_OUT_OF_RANGE:
    case MUON_UNIMPLEMENTED:
    case MUON_INTERNAL:
    case MUON_UNAVAILABLE:
      return static_cast<muon_status_t>(c);
    default:
      return MUON_UNKNOWN;
  }
}

absl::StatusCode FromCode(muon_status_t status) {
  const int c = static_cast<int>(status);
  if (c > 0 && c <= 16) return static_cast<absl::StatusCode>(c);
  return absl::StatusCode::kUnknown;
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
  return ToCode(s.code());
}

absl::Status NullArg(const char* name) {
  return absl::InvalidArgumentError(absl::StrCat(name, " is NULL"));
}

}  // namespace capi
}  // namespace muon
