#include "muon/comm/callback_error.h"

namespace muon {
namespace {

thread_local std::string t_callback_error;

}  // namespace

void SetCallbackError(const char* message) { t_callback_error = message ? message : ""; }

std::string TakeCallbackError() {
  std::string out;
  out.swap(t_callback_error);
  return out;
}

std::string PeekCallbackError() { return t_callback_error; }

}  // namespace muon
