// What every extern "C" entry point of libmuon shares: the thread-local
// error message behind muon_last_error_message, the conversion of
// absl::Status to muon_status_t, and the exception firewall.
#ifndef MUON_CAPI_CAPI_INTERNAL_H_
#define MUON_CAPI_CAPI_INTERNAL_H_

#include <exception>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "capi/muon.h"

namespace muon {
namespace capi {

// The calling thread's last error message (empty after a successful call).
std::string& LastError();

// The muon_status_t of an absl::StatusCode (codes share their numbers;
// anything unknown is MUON_UNKNOWN).
muon_status_t ToCode(absl::StatusCode code);

// The absl::StatusCode of a muon_status_t (MUON_OK never reaches here;
// anything unknown is kUnknown).
absl::StatusCode FromCode(muon_status_t status);

// Records `s` as the thread's last error ("fn: message"; cleared when OK)
// and returns its code.
muon_status_t Report(const char* fn, const absl::Status& s);

// Runs `body` (returning absl::Status); no exception leaves the library.
template <typename Body>
muon_status_t Guard(const char* fn, Body&& body) {
  try {
    return Report(fn, body());
  } catch (const std::bad_alloc&) {
    return Report(fn, absl::ResourceExhaustedError("out of host memory"));
  } catch (const std::exception& e) {
    return Report(fn, absl::InternalError(absl::StrCat("unexpected exception: ", e.what())));
  } catch (...) {
    return Report(fn, absl::InternalError("unexpected exception"));
  }
}

// InvalidArgument "<name> is NULL".
absl::Status NullArg(const char* name);

}  // namespace capi
}  // namespace muon

#endif  // MUON_CAPI_CAPI_INTERNAL_H_
