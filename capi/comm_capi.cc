// The extern "C" entry points of the communicator adapters (muon.h section
// "Communicators"): in-process worlds, NCCL, and the callback error.
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "capi/capi_internal.h"
#include "capi/muon.h"
#include "muon/comm/callback_error.h"
#include "muon/comm/inprocess_comm.h"
#include "muon/comm/nccl_comm.h"

struct muon_inprocess_world {
  std::shared_ptr<muon::InProcessWorld> impl;
};

using muon::capi::Guard;
using muon::capi::NullArg;

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
    muon_comm_t table;
    absl::Status made = muon::MakeInProcessComm(world->impl, list, rank, &table);
    if (!made.ok()) return made;
    *out = table;
    return absl::OkStatus();
  });
}

muon_status_t muon_comm_from_nccl(void* nccl_comm, muon_comm_t* out) {
  return Guard("muon_comm_from_nccl", [&]() -> absl::Status {
    if (nccl_comm == nullptr) return NullArg("nccl_comm");
    if (out == nullptr) return NullArg("out");
    muon_comm_t table;
    absl::Status made = muon::MakeNcclComm(nccl_comm, &table);
    if (!made.ok()) return made;
    *out = table;
    return absl::OkStatus();
  });
}

}  // extern "C"
