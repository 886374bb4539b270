// The detail a communicator or host callback attaches to the error status it
// is about to return (muon_set_callback_error): kept per thread, taken by the
// caller of the callback once it returns.
#ifndef MUON_COMM_CALLBACK_ERROR_H_
#define MUON_COMM_CALLBACK_ERROR_H_

#include <string>

namespace muon {

// Sets the calling thread's callback detail (NULL clears it).
void SetCallbackError(const char* message);
// Returns and clears it.
std::string TakeCallbackError();
// Returns it and leaves it for the caller that takes it.
std::string PeekCallbackError();

}  // namespace muon

#endif  // MUON_COMM_CALLBACK_ERROR_H_
