// The numbered codes the C ABI shares with the core (C++ only): the one
// mapping between muon_status_t and absl::StatusCode, and between
// muon_dtype_t and the core's DType.
//
// Like muon.h itself this is the bottom of the house: the extern "C" shims,
// the communicator adapters (which fill C tables) and the engine's
// communicator port all convert through it, and it depends on nothing but the
// header, absl and the core's dtype. muon_status_t values are absl::StatusCode
// numbers and muon_dtype_t values DType numbers; the static_asserts below hold
// every constant of the header to that.
#ifndef MUON_COMM_CODES_H_
#define MUON_COMM_CODES_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "libmuon/muon.h"
#include "muon/common/dtype.h"

namespace muon {

#define MUON_SAME_CODE_(c, k) \
  static_assert(static_cast<int>(c) == static_cast<int>(absl::StatusCode::k), #c)
MUON_SAME_CODE_(MUON_OK, kOk);
MUON_SAME_CODE_(MUON_CANCELLED, kCancelled);
MUON_SAME_CODE_(MUON_UNKNOWN, kUnknown);
MUON_SAME_CODE_(MUON_INVALID_ARGUMENT, kInvalidArgument);
MUON_SAME_CODE_(MUON_NOT_FOUND, kNotFound);
MUON_SAME_CODE_(MUON_ALREADY_EXISTS, kAlreadyExists);
MUON_SAME_CODE_(MUON_RESOURCE_EXHAUSTED, kResourceExhausted);
MUON_SAME_CODE_(MUON_FAILED_PRECONDITION, kFailedPrecondition);
MUON_SAME_CODE_(MUON_OUT_OF_RANGE, kOutOfRange);
MUON_SAME_CODE_(MUON_UNIMPLEMENTED, kUnimplemented);
MUON_SAME_CODE_(MUON_INTERNAL, kInternal);
MUON_SAME_CODE_(MUON_UNAVAILABLE, kUnavailable);
#undef MUON_SAME_CODE_

// The absl::StatusCode of a status a host callback returned: the same number
// for 0 to 16 (absl's codes, those the header does not name included),
// kUnknown for anything else.
inline absl::StatusCode FromCStatus(muon_status_t status) {
  const int c = static_cast<int>(status);
  return c >= 0 && c <= 16 ? static_cast<absl::StatusCode>(c) : absl::StatusCode::kUnknown;
}

// The name of the status code numbered `code` if the header declares one
// ("OK", "INVALID_ARGUMENT", ...), NULL for any other int: the one list of
// the header's codes. Takes an int, so that a number no enumerator has (a C
// host may pass one) is never held in a muon_status_t on this side.
inline const char* KnownStatusCodeName(int code) {
  switch (code) {
    case MUON_OK:
      return "OK";
    case MUON_CANCELLED:
      return "CANCELLED";
    case MUON_UNKNOWN:
      return "UNKNOWN";
    case MUON_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case MUON_NOT_FOUND:
      return "NOT_FOUND";
    case MUON_ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case MUON_RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case MUON_FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case MUON_OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case MUON_UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case MUON_INTERNAL:
      return "INTERNAL";
    case MUON_UNAVAILABLE:
      return "UNAVAILABLE";
    default:
      return nullptr;
  }
}

// The text for any status number (what muon_status_string returns).
inline const char* StatusCodeName(int code) {
  const char* name = KnownStatusCodeName(code);
  return name != nullptr ? name : "UNRECOGNIZED_STATUS";
}

// The same for a muon_status_t the library itself holds.
inline const char* KnownCStatusName(muon_status_t status) {
  return KnownStatusCodeName(static_cast<int>(status));
}
inline const char* CStatusName(muon_status_t status) {
  return StatusCodeName(static_cast<int>(status));
}

// The muon_status_t of `code`: the same number for every code the header
// declares, MUON_UNKNOWN for the absl codes it does not (deadline exceeded,
// permission denied, aborted, data loss, unauthenticated).
inline muon_status_t ToCStatus(absl::StatusCode code) {
  const muon_status_t c = static_cast<muon_status_t>(code);
  return KnownCStatusName(c) != nullptr ? c : MUON_UNKNOWN;
}

// `status` with `message` as an absl::Status (OK for MUON_OK).
inline absl::Status StatusFromC(muon_status_t status, std::string message) {
  const absl::StatusCode code = FromCStatus(status);
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  return absl::Status(code, std::move(message));
}

static_assert(MUON_DTYPE_FLOAT32 == static_cast<int>(DType::kF32), "MUON_DTYPE_FLOAT32");
static_assert(MUON_DTYPE_BFLOAT16 == static_cast<int>(DType::kBF16), "MUON_DTYPE_BFLOAT16");
static_assert(MUON_DTYPE_FLOAT16 == static_cast<int>(DType::kF16), "MUON_DTYPE_FLOAT16");

inline muon_dtype_t ToCDType(DType t) { return static_cast<muon_dtype_t>(t); }

// The DType of a muon_dtype_t value a caller passed; false for an unknown one.
inline bool FromCDType(int32_t dtype, DType* out) {
  if (dtype < MUON_DTYPE_FLOAT32 || dtype > MUON_DTYPE_FLOAT16) return false;
  *out = static_cast<DType>(dtype);
  return true;
}

}  // namespace muon

#endif  // MUON_COMM_CODES_H_
