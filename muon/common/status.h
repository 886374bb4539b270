// absl::Status helpers shared by the core.
#ifndef MUON_COMMON_STATUS_H_
#define MUON_COMMON_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define MUON_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::absl::Status _muon_status = (expr);          \
    if (!_muon_status.ok()) return _muon_status;   \
  } while (0)

#define MUON_CONCAT_INNER_(a, b) a##b
#define MUON_CONCAT_(a, b) MUON_CONCAT_INNER_(a, b)

// `lhs = value of statusor_expr`, or return its error status.
#define MUON_ASSIGN_OR_RETURN(lhs, expr) \
  MUON_ASSIGN_OR_RETURN_IMPL_(MUON_CONCAT_(_muon_statusor_, __LINE__), lhs, expr)

#define MUON_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#endif  // MUON_COMMON_STATUS_H_
