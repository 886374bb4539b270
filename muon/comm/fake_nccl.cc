// A stand-in for libnccl.so.2 (same SONAME) for nccl_comm_test: it exports
// the functions the NCCL adapter resolves, logs every call, and copies host
// memory where a 1-rank communicator would move data. Communicators are
// FakeComm structs made by the test. Not thread-safe; one test thread.
#include <cstdlib>
#include <cstring>
#include <string>

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace {

struct FakeComm {
  int rank;
  int size;
};

std::string g_log;
int g_fail_next = 0;      // result the next data call returns instead of success
int g_in_progress_polls = 0;
const void* g_self_send = nullptr;  // pending send to self inside a group
size_t g_self_bytes = 0;

size_t ElemSize(int dtype) { return dtype == 7 ? 4 : dtype == 6 || dtype == 9 ? 2 : 1; }

int Take() {
  const int r = g_fail_next;
  g_fail_next = 0;
  if (r == 7) g_in_progress_polls = 2;  // ncclInProgress: settles after two polls
  return r;
}

void Log(const std::string& s) { g_log += s + ";"; }

}  // namespace

// Test controls.
FAKE_API const char* fake_nccl_log() { return g_log.c_str(); }
FAKE_API void fake_nccl_clear() { g_log.clear(); }
FAKE_API void fake_nccl_fail_next(int result) { g_fail_next = result; }

FAKE_API int ncclGroupStart() {
  Log("GroupStart");
  return 0;
}

FAKE_API int ncclGroupEnd() {
  Log("GroupEnd");
  return Take();
}

FAKE_API int ncclSend(const void* buf, size_t count, int dtype, int peer, void* comm, void*) {
  Log("Send(" + std::to_string(peer) + "," + std::to_string(count) + "," +
      std::to_string(dtype) + ")");
  if (peer == static_cast<FakeComm*>(comm)->rank) {
    g_self_send = buf;
    g_self_bytes = count * ElemSize(dtype);
  }
  return Take();
}

FAKE_API int ncclRecv(void* buf, size_t count, int dtype, int peer, void* comm, void*) {
  Log("Recv(" + std::to_string(peer) + "," + std::to_string(count) + "," +
      std::to_string(dtype) + ")");
  const size_t bytes = count * ElemSize(dtype);
  if (peer == static_cast<FakeComm*>(comm)->rank && g_self_send != nullptr &&
      g_self_bytes == bytes) {
    std::memcpy(buf, g_self_send, bytes);
    g_self_send = nullptr;
  }
  return Take();
}

FAKE_API int ncclAllGather(const void* send, void* recv, size_t count, int dtype, void* comm,
                           void* stream) {
  const FakeComm* c = static_cast<FakeComm*>(comm);
  Log("AllGather(" + std::to_string(count) + "," + std::to_string(dtype) +
      (send == static_cast<char*>(recv) + c->rank * count * ElemSize(dtype) ? ",inplace" : "") +
      (stream != nullptr ? ",stream" : "") + ")");
  if (c->size == 1) std::memmove(recv, send, count * ElemSize(dtype));
  return Take();
}

FAKE_API int ncclBroadcast(const void* send, void* recv, size_t count, int dtype, int root,
                           void*, void*) {
  Log("Broadcast(" + std::to_string(count) + "," + std::to_string(dtype) + ",root" +
      std::to_string(root) + (send == recv ? ",inplace" : "") + ")");
  return Take();
}

FAKE_API int ncclReduceScatter(const void* send, void* recv, size_t count, int dtype, int op,
                               void* comm, void*) {
  Log("ReduceScatter(" + std::to_string(count) + "," + std::to_string(dtype) + ",op" +
      std::to_string(op) + ")");
  if (static_cast<FakeComm*>(comm)->size == 1) std::memmove(recv, send, count * ElemSize(dtype));
  return Take();
}

FAKE_API int ncclCommCount(void* comm, int* count) {
  const FakeComm* c = static_cast<FakeComm*>(comm);
  if (c->size <= 0) return 4;  // ncclInvalidArgument
  *count = c->size;
  return 0;
}

FAKE_API int ncclCommUserRank(void* comm, int* rank) {
  *rank = static_cast<FakeComm*>(comm)->rank;
  return 0;
}

FAKE_API const char* ncclGetErrorString(int result) {
  return result == 4 ? "invalid argument" : "fake error string";
}

FAKE_API const char* ncclGetLastError(void*) { return "fake last error"; }

FAKE_API int ncclCommGetAsyncError(void*, int* state) {
  Log("GetAsyncError");
  *state = g_in_progress_polls > 0 ? 7 : 0;
  if (g_in_progress_polls > 0) --g_in_progress_polls;
  return 0;
}

FAKE_API int ncclMemAlloc(void** ptr, size_t size) {
  Log("MemAlloc(" + std::to_string(size) + ")");
  *ptr = std::malloc(size);
  return *ptr != nullptr ? 0 : 1;
}

FAKE_API int ncclMemFree(void* ptr) {
  Log("MemFree");
  std::free(ptr);
  return 0;
}
