// What every extern "C" entry point of libmuon shares: the thread-local
// error message behind muon_last_error_message, the report of an
// absl::Status as a muon_status_t (through codes.h), and the exception
// firewall.
#ifndef MUON_CAPI_CAPI_INTERNAL_H_
#define MUON_CAPI_CAPI_INTERNAL_H_

#include <exception>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "libmuon/muon.h"

namespace muon {
namespace capi {

// The calling thread's last error message (empty after a successful call).
std::string& LastError();

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
