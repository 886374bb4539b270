#include "muon/comm/nccl_comm.h"

#include <dlfcn.h>
#include <sched.h>

#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "absl/strings/str_cat.h"
#include "muon/comm/callback_error.h"
#include "muon/comm/table.h"

namespace muon {
namespace {

// ncclResult_t, ncclDataType_t and ncclRedOp_t are C enums (int-sized);
// ncclComm_t and cudaStream_t are pointers.
using Result = int;

struct NcclApi {
  Result (*group_start)() = nullptr;
  Result (*group_end)() = nullptr;
  Result (*send)(const void*, size_t, int, int, void*, void*) = nullptr;
  Result (*recv)(void*, size_t, int, int, void*, void*) = nullptr;
  Result (*all_gather)(const void*, void*, size_t, int, void*, void*) = nullptr;
  Result (*broadcast)(const void*, void*, size_t, int, int, void*, void*) = nullptr;
  Result (*reduce_scatter)(const void*, void*, size_t, int, int, void*, void*) = nullptr;
  Result (*comm_count)(void*, int*) = nullptr;
  Result (*comm_user_rank)(void*, int*) = nullptr;
  const char* (*get_error_string)(Result) = nullptr;
  // Optional: newer NCCLs only.
  const char* (*get_last_error)(void*) = nullptr;           // 2.13
  Result (*comm_get_async_error)(void*, Result*) = nullptr;  // 2.4; nonblocking comms
  Result (*mem_alloc)(void**, size_t) = nullptr;             // 2.19; the barrier's buffer
  Result (*mem_free)(void*) = nullptr;
};

template <typename Fn>
void Sym(void* handle, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
}

// Resolves every function from `handle`; returns the first required one
// that is missing, or nullptr.
const char* Resolve(void* handle, NcclApi* api) {
  Sym(handle, "ncclGroupStart", &api->group_start);
  Sym(handle, "ncclGroupEnd", &api->group_end);
  Sym(handle, "ncclSend", &api->send);
  Sym(handle, "ncclRecv", &api->recv);
  Sym(handle, "ncclAllGather", &api->all_gather);
  Sym(handle, "ncclBroadcast", &api->broadcast);
  Sym(handle, "ncclReduceScatter", &api->reduce_scatter);
  Sym(handle, "ncclCommCount", &api->comm_count);
  Sym(handle, "ncclCommUserRank", &api->comm_user_rank);
  Sym(handle, "ncclGetErrorString", &api->get_error_string);
  Sym(handle, "ncclGetLastError", &api->get_last_error);
  Sym(handle, "ncclCommGetAsyncError", &api->comm_get_async_error);
  Sym(handle, "ncclMemAlloc", &api->mem_alloc);
  Sym(handle, "ncclMemFree", &api->mem_free);
  if (api->comm_count == nullptr) return "ncclCommCount";
  if (api->comm_user_rank == nullptr) return "ncclCommUserRank";
  if (api->group_start == nullptr) return "ncclGroupStart";
  if (api->group_end == nullptr) return "ncclGroupEnd";
  if (api->send == nullptr) return "ncclSend";
  if (api->recv == nullptr) return "ncclRecv";
  if (api->all_gather == nullptr) return "ncclAllGather";
  if (api->broadcast == nullptr) return "ncclBroadcast";
  if (api->reduce_scatter == nullptr) return "ncclReduceScatter";
  if (api->get_error_string == nullptr) return "ncclGetErrorString";
  if ((api->mem_alloc == nullptr) != (api->mem_free == nullptr)) {
    api->mem_alloc = nullptr;
    api->mem_free = nullptr;
  }
  return nullptr;
}

struct NcclCtx {
  NcclApi api;
  void* comm = nullptr;
  void* library = nullptr;  // dlopen(RTLD_NOLOAD) handle, or nullptr (global symbols)
  int rank = 0;
  int size = 1;
  char* scratch = nullptr;  // barrier: `size` bytes of device memory

  ~NcclCtx() {
    if (scratch != nullptr && api.mem_free != nullptr) api.mem_free(scratch);
    if (library != nullptr) dlclose(library);
  }
};

muon_status_t ToMuon(Result r) {
  switch (r) {
    case nccl_abi::kSuccess:
      return MUON_OK;
    case nccl_abi::kInvalidArgument:
      return MUON_INVALID_ARGUMENT;
    case nccl_abi::kInvalidUsage:
      return MUON_FAILED_PRECONDITION;
    case nccl_abi::kSystemError:
    case nccl_abi::kRemoteError:
      return MUON_UNAVAILABLE;
    default:
      return MUON_INTERNAL;
  }
}

std::string Describe(const NcclApi& api, void* comm, Result r) {
  std::string text = absl::StrCat(api.get_error_string(r), " (ncclResult_t ", r, ")");
  if (api.get_last_error != nullptr) {
    const char* last = api.get_last_error(comm);
    if (last != nullptr && last[0] != '\0') absl::StrAppend(&text, ": ", last);
  }
  return text;
}

// A nonblocking communicator answers ncclInProgress while it enqueues: wait
// until the state settles (the work itself stays stream-ordered).
Result Settle(const NcclCtx& c, Result r) {
  if (r != nccl_abi::kInProgress || c.api.comm_get_async_error == nullptr) return r;
  Result state = nccl_abi::kInProgress;
  do {
    const Result q = c.api.comm_get_async_error(c.comm, &state);
    if (q != nccl_abi::kSuccess) return q;
    if (state == nccl_abi::kInProgress) sched_yield();
  } while (state == nccl_abi::kInProgress);
  return state;
}

muon_status_t Finish(const NcclCtx& c, Result r, const char* what) {
  r = Settle(c, r);
  if (r == nccl_abi::kSuccess) return MUON_OK;
  try {
    SetCallbackError(absl::StrCat(what, " failed: ", Describe(c.api, c.comm, r)).c_str());
  } catch (...) {
  }
  return ToMuon(r);
}

muon_status_t Fail(muon_status_t code, const std::string& message) {
  try {
    SetCallbackError(message.c_str());
  } catch (...) {
  }
  return code;
}

muon_status_t CAllGather(void* ctx, const void* send, void* recv, size_t bytes, void* stream) {
  const NcclCtx& c = *static_cast<NcclCtx*>(ctx);
  if (bytes == 0) return MUON_OK;  // the same on every rank
  return Finish(c, c.api.all_gather(send, recv, bytes, nccl_abi::kUint8, c.comm, stream),
                "ncclAllGather");
}

muon_status_t CAllToAllV(void* ctx, const void* send, const size_t* send_bytes,
                         const size_t* send_offsets, void* recv, const size_t* recv_bytes,
                         const size_t* recv_offsets, void* stream) {
  const NcclCtx& c = *static_cast<NcclCtx*>(ctx);
  bool any = false;
  for (int p = 0; p < c.size; ++p) any = any || send_bytes[p] != 0 || recv_bytes[p] != 0;
  if (!any) return MUON_OK;  // no peer expects anything from this rank
  Result first = Settle(c, c.api.group_start());
  if (first != nccl_abi::kSuccess) return Finish(c, first, "ncclGroupStart");
  const char* failed = nullptr;
  for (int p = 0; p < c.size && first == nccl_abi::kSuccess; ++p) {
    if (send_bytes[p] != 0) {
      first = c.api.send(static_cast<const char*>(send) + send_offsets[p], send_bytes[p],
                         nccl_abi::kUint8, p, c.comm, stream);
      if (first != nccl_abi::kSuccess) {
        failed = "ncclSend";
        break;
      }
    }
    if (recv_bytes[p] != 0) {
      first = c.api.recv(static_cast<char*>(recv) + recv_offsets[p], recv_bytes[p],
                         nccl_abi::kUint8, p, c.comm, stream);
      if (first != nccl_abi::kSuccess) failed = "ncclRecv";
    }
  }
  // The group is closed even after an error, so NCCL's group depth stays balanced.
  const Result end = Settle(c, c.api.group_end());
  if (failed != nullptr) return Finish(c, first, failed);
  return Finish(c, end, "ncclGroupEnd (all_to_all_v)");
}

muon_status_t CBroadcast(void* ctx, void* buf, size_t bytes, int32_t root, void* stream) {
  const NcclCtx& c = *static_cast<NcclCtx*>(ctx);
  if (root < 0 || root >= c.size) {
    return Fail(MUON_INVALID_ARGUMENT,
                absl::StrCat("broadcast root ", root, " is outside the group of ", c.size));
  }
  if (bytes == 0) return MUON_OK;
  return Finish(c, c.api.broadcast(buf, buf, bytes, nccl_abi::kUint8, root, c.comm, stream),
                "ncclBroadcast");
}

muon_status_t CReduceScatter(void* ctx, const void* send, void* recv, size_t count,
                             int32_t dtype, void* stream) {
  const NcclCtx& c = *static_cast<NcclCtx*>(ctx);
  int nccl_type;
  switch (dtype) {
    case MUON_DTYPE_FLOAT32:
      nccl_type = nccl_abi::kFloat32;
      break;
    case MUON_DTYPE_BFLOAT16:
      nccl_type = nccl_abi::kBfloat16;
      break;
    case MUON_DTYPE_FLOAT16:
      nccl_type = nccl_abi::kFloat16;
      break;
    default:
      return Fail(MUON_INVALID_ARGUMENT,
                  absl::StrCat("reduce_scatter dtype ", dtype,
                               " is unknown; use MUON_DTYPE_FLOAT32, BFLOAT16 or FLOAT16"));
  }
  if (count == 0) return MUON_OK;
  return Finish(c,
                c.api.reduce_scatter(send, recv, count, nccl_type, nccl_abi::kSum, c.comm, stream),
                "ncclReduceScatter");
}

muon_status_t CBarrier(void* ctx, void* stream) {
  NcclCtx& c = *static_cast<NcclCtx*>(ctx);
  if (c.scratch == nullptr) {
    if (c.api.mem_alloc == nullptr) {
      return Fail(MUON_UNAVAILABLE,
                  "barrier needs ncclMemAlloc (NCCL >= 2.19) for its scratch buffer; the loaded "
                  "NCCL does not export it");
    }
    void* p = nullptr;
    const Result r = c.api.mem_alloc(&p, static_cast<size_t>(c.size));
    if (r != nccl_abi::kSuccess) return Finish(c, r, "ncclMemAlloc (barrier scratch buffer)");
    c.scratch = static_cast<char*>(p);
  }
  return Finish(c,
                c.api.all_gather(c.scratch + c.rank, c.scratch, 1, nccl_abi::kUint8, c.comm,
                                 stream),
                "ncclAllGather (barrier)");
}

void CRelease(void* ctx) { delete static_cast<NcclCtx*>(ctx); }

}  // namespace

absl::Status MakeNcclComm(void* nccl_comm, muon_comm_t* out) {
  if (nccl_comm == nullptr) return absl::InvalidArgumentError("nccl_comm is NULL");
  if (out == nullptr) return absl::InvalidArgumentError("out is NULL");

  auto ctx = std::make_unique<NcclCtx>();
  const char* missing = Resolve(RTLD_DEFAULT, &ctx->api);
  std::string source = "the process's global symbols";
  if (missing != nullptr && std::strcmp(missing, "ncclCommCount") == 0) {
    // Not global: perhaps loaded with RTLD_LOCAL (as Python extensions load it).
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == nullptr) {
      return absl::UnavailableError(
          "no NCCL is loaded in this process: ncclCommCount is not among its global symbols "
          "and libnccl.so.2 is not loaded; load NCCL (create the ncclComm_t) first. libmuon "
          "never loads NCCL itself, so that it always uses the host's copy");
    }
    ctx->api = NcclApi();
    ctx->library = lib;
    missing = Resolve(lib, &ctx->api);
    source = "the loaded libnccl.so.2";
  }
  if (missing != nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "the NCCL in ", source, " does not export ", missing,
        "; the adapter needs NCCL >= 2.7 (ncclSend/ncclRecv)"));
  }
  ctx->comm = nccl_comm;
  int size = 0, rank = -1;
  Result r = Settle(*ctx, ctx->api.comm_count(nccl_comm, &size));
  if (r != nccl_abi::kSuccess) {
    return absl::InvalidArgumentError(absl::StrCat("ncclCommCount refused the communicator: ",
                                                   Describe(ctx->api, nccl_comm, r)));
  }
  r = Settle(*ctx, ctx->api.comm_user_rank(nccl_comm, &rank));
  if (r != nccl_abi::kSuccess) {
    return absl::InvalidArgumentError(absl::StrCat("ncclCommUserRank refused the communicator: ",
                                                   Describe(ctx->api, nccl_comm, r)));
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL reports rank ", rank, " of ", size, " for the communicator; is it initialized?"));
  }
  ctx->rank = rank;
  ctx->size = size;

  *out = MakeCommTable(ctx.release(), rank, size,
                       {CAllGather, CAllToAllV, CBroadcast, CReduceScatter, CBarrier, CRelease});
  return absl::OkStatus();
}

}  // namespace muon
