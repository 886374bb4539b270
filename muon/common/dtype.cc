#include "muon/common/dtype.h"

#include <dlpack/dlpack.h>

#include "absl/strings/str_cat.h"

namespace muon {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
  }
  return "unknown";
}

DLDataType ToDLDataType(DType t) {
  DLDataType dt;
  dt.lanes = 1;
  switch (t) {
    case DType::kF32:
      dt.code = kDLFloat;
      dt.bits = 32;
      break;
    case DType::kBF16:
      dt.code = kDLBfloat;
      dt.bits = 16;
      break;
    case DType::kF16:
      dt.code = kDLFloat;
      dt.bits = 16;
      break;
  }
  return dt;
}

absl::StatusOr<DType> FromDLDataType(const DLDataType& dt, const std::string& what) {
  if (dt.lanes == 1) {
    if (dt.code == kDLFloat && dt.bits == 32) return DType::kF32;
    if (dt.code == kDLFloat && dt.bits == 16) return DType::kF16;
    if (dt.code == kDLBfloat && dt.bits == 16) return DType::kBF16;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": unsupported dtype (DLPack code ", static_cast<int>(dt.code), ", bits ",
      static_cast<int>(dt.bits), ", lanes ", static_cast<int>(dt.lanes),
      "); supported are float32, bfloat16 and float16"));
}


}  // namespace muon
