// The extern "C" entry points of the communicator adapters (muon.h section
// "Communicators"): in-process worlds, NCCL, and the callback error.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "capi/capi_internal.h"
#include "muon/comm/codes.h"
#include "libmuon/muon.h"
#include "muon/comm/callback_error.h"
#include "muon/comm/inprocess_comm.h"
#include "muon/comm/nccl_comm.h"

struct muon_inprocess_world {
  std::shared_ptr<muon::InProcessWorld> impl;
};

using muon::capi::Guard;
using muon::capi::NullArg;

namespace {

// A table handed to the host: the adapter's own table behind callbacks that
// also report the outcome as the calling thread's muon_last_error_message()
// ("<collective>: <detail>", cleared on success), so that a host calling the
// table itself learns why a call failed. The detail stays for the library,
// which takes it as the callback's (muon/comm/callback_error.h).
struct HostTable {
  muon_comm_t inner;
};

template <typename Body>
muon_status_t Forward(void* ctx, const char* collective, Body&& body) {
  try {
    if (ctx == nullptr) {
      const std::string detail = absl::StrCat(collective, ": ctx is NULL");
      muon::SetCallbackError(detail.c_str());
      return muon::capi::Report(collective, absl::InvalidArgumentError("ctx is NULL"));
    }
    const muon_status_t st = body(static_cast<HostTable*>(ctx)->inner);
    if (st == MUON_OK) {  // (allocates nothing: a step calls this)
      muon::capi::LastError().clear();
      return st;
    }
    const std::string detail = muon::PeekCallbackError();
    absl::string_view shown = detail;
    absl::ConsumePrefix(&shown, absl::StrCat(collective, ": "));  // said once
    muon::capi::Report(collective, muon::StatusFromC(st, detail.empty() ? muon::CStatusName(st)
                                                                        : std::string(shown)));
    return st;
  } catch (...) {
    return MUON_INTERNAL;
  }
}

muon_status_t HostAllGather(void* ctx, const void* send, void* recv, size_t bytes, void* stream) {
  return Forward(ctx, "all_gather", [&](const muon_comm_t& t) {
    return t.all_gather(t.ctx, send, recv, bytes, stream);
  });
}

muon_status_t HostAllToAllV(void* ctx, const void* send, const size_t* send_bytes,
                            const size_t* send_offsets, void* recv, const size_t* recv_bytes,
                            const size_t* recv_offsets, void* stream) {
  return Forward(ctx, "all_to_all_v", [&](const muon_comm_t& t) {
    return t.all_to_all_v(t.ctx, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets,
                          stream);
  });
}

muon_status_t HostBroadcast(void* ctx, void* buf, size_t bytes, int32_t root, void* stream) {
  return Forward(ctx, "broadcast", [&](const muon_comm_t& t) {
    return t.broadcast(t.ctx, buf, bytes, root, stream);
  });
}

muon_status_t HostReduceScatter(void* ctx, const void* send, void* recv, size_t count,
                                int32_t dtype, void* stream) {
  return Forward(ctx, "reduce_scatter", [&](const muon_comm_t& t) {
    return t.reduce_scatter(t.ctx, send, recv, count, dtype, stream);
  });
}

muon_status_t HostBarrier(void* ctx, void* stream) {
  return Forward(ctx, "barrier", [&](const muon_comm_t& t) { return t.barrier(t.ctx, stream); });
}

void HostRelease(void* ctx) {
  HostTable* host = static_cast<HostTable*>(ctx);
  if (host == nullptr) return;
  if (host->inner.release) host->inner.release(host->inner.ctx);
  delete host;
}

// `inner` behind `host` (allocated before the adapter made `inner`, so that
// nothing can fail here), as the table handed out.
muon_comm_t HostFacing(std::unique_ptr<HostTable> host, const muon_comm_t& inner) {
  muon_comm_t out = inner;
  out.ctx = host.get();
  out.all_gather = inner.all_gather ? HostAllGather : nullptr;
  out.all_to_all_v = inner.all_to_all_v ? HostAllToAllV : nullptr;
  out.broadcast = inner.broadcast ? HostBroadcast : nullptr;
  out.reduce_scatter = inner.reduce_scatter ? HostReduceScatter : nullptr;
  out.barrier = inner.barrier ? HostBarrier : nullptr;
  out.release = HostRelease;
  host->inner = inner;
  host.release();
  return out;
}

}  // namespace

extern "C" {

void muon_set_callback_error(const char* message) {
  try {
    muon::SetCallbackError(message);
  } catch (...) {
  }
}

muon_status_t muon_inprocess_world_create(int32_t size, muon_inprocess_world_t** out) {
  return Guard("muon_inprocess_world_create", [&]() -> absl::Status {
    if (out == nullptr) return NullArg("out");
    auto world = muon::InProcessWorld::Create(size);
    if (!world.ok()) return world.status();
    auto handle = std::make_unique<muon_inprocess_world>();
    handle->impl = *std::move(world);
    *out = handle.release();
    return absl::OkStatus();
  });
}

void muon_inprocess_world_destroy(muon_inprocess_world_t* world) {
  try {
    delete world;
  } catch (...) {
  }
}

void muon_inprocess_world_abort(muon_inprocess_world_t* world) {
  if (world == nullptr) return;
  try {
    world->impl->Abort();
  } catch (...) {
  }
}

muon_status_t muon_inprocess_comm(muon_inprocess_world_t* world, const int32_t* ranks,
                                  int32_t num_ranks, int32_t rank, muon_comm_t* out) {
  return Guard("muon_inprocess_comm", [&]() -> absl::Status {
    if (world == nullptr) return NullArg("world");
    if (out == nullptr) return NullArg("out");
    std::vector<int> list;
    if (ranks != nullptr) {
      if (num_ranks < 1 || num_ranks > world->impl->size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "num_ranks is ", num_ranks, "; a group has 1 to ", world->impl->size(),
            " ranks (the world's size)"));
      }
      list.assign(ranks, ranks + num_ranks);
    }
    auto host = std::make_unique<HostTable>();
    muon_comm_t table;
    absl::Status made = muon::MakeInProcessComm(world->impl, list, rank, &table);
    if (!made.ok()) return made;
    *out = HostFacing(std::move(host), table);
    return absl::OkStatus();
  });
}

muon_status_t muon_comm_from_nccl(void* nccl_comm, muon_comm_t* out) {
  return Guard("muon_comm_from_nccl", [&]() -> absl::Status {
    if (nccl_comm == nullptr) return NullArg("nccl_comm");
    if (out == nullptr) return NullArg("out");
    auto host = std::make_unique<HostTable>();
    muon_comm_t table;
    absl::Status made = muon::MakeNcclComm(nccl_comm, &table);
    if (!made.ok()) return made;
    *out = HostFacing(std::move(host), table);
    return absl::OkStatus();
  });
}

}  // extern "C"
