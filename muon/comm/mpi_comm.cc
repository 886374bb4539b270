#include "muon/comm/mpi_comm.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "muon/comm/codes.h"
#include "muon/comm/ordered_sum.h"
#include "muon/comm/table.h"
#include "muon/common/dtype.h"

namespace muon {
namespace {

// Largest message MPI is handed at once (counts are int).
constexpr size_t kMaxMessage = size_t{1} << 30;
constexpr int kTag = 0x6d75;  // all_to_all_v's messages, on the private duplicate

struct MpiCtx {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int thread_level = MPI_THREAD_SINGLE;
  size_t max_message = kMaxMessage;
  std::vector<unsigned char> gathered;  // reduce_scatter's blocks, reused
  std::vector<MPI_Request> requests;    // all_to_all_v's, reused

  ~MpiCtx() {
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (finalized || comm == MPI_COMM_NULL) return;  // nothing can be freed after MPI_Finalize
    int is_main = 1;
    if (thread_level < MPI_THREAD_SERIALIZED) MPI_Is_thread_main(&is_main);
    if (is_main) MPI_Comm_free(&comm);
  }
};

muon_status_t Fail(muon_status_t code, const std::string& message) {
  muon_set_callback_error(message.c_str());
  return code;
}

// OK for MPI_SUCCESS; otherwise the callback error names `what` and MPI's text.
muon_status_t FromMpi(int err, const char* what) {
  if (err == MPI_SUCCESS) return MUON_OK;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) len = 0;
  int cls = MPI_ERR_OTHER;
  MPI_Error_class(err, &cls);
  const bool caller = cls == MPI_ERR_COUNT || cls == MPI_ERR_TRUNCATE || cls == MPI_ERR_ARG ||
                      cls == MPI_ERR_ROOT || cls == MPI_ERR_BUFFER || cls == MPI_ERR_TYPE;
  return Fail(caller ? MUON_INVALID_ARGUMENT : MUON_INTERNAL,
              absl::StrCat(what, " failed: ", std::string(text, len), " (MPI error ", err, ")"));
}

muon_status_t Precheck(const MpiCtx& c, void* stream, const char* what) {
  if (stream != nullptr) {
    return Fail(MUON_UNIMPLEMENTED,
                absl::StrCat(what, ": the MPI communicator moves host memory only; the stream "
                                   "must be NULL (CPU tensors)"));
  }
  if (c.thread_level < MPI_THREAD_SERIALIZED) {
    int is_main = 0;
    MPI_Is_thread_main(&is_main);
    if (!is_main) {
      return Fail(MUON_FAILED_PRECONDITION,
                  absl::StrCat(what, ": called from a thread other than MPI's main thread, and "
                                     "MPI was initialized with thread level ",
                               c.thread_level,
                               " (below MPI_THREAD_SERIALIZED); initialize MPI with "
                               "MPI_Init_thread(MPI_THREAD_SERIALIZED) or higher, or keep every "
                               "call on the main thread (prefetch_count 0)"));
    }
  }
  return MUON_OK;
}

// A datatype of `len` bytes whose extent is `extent` bytes: consecutive
// elements of it are `extent` apart (chunk k of each rank's block).
class StridedBytes {
 public:
  StridedBytes(size_t len, size_t extent) {
    MPI_Datatype contiguous;
    err_ = MPI_Type_contiguous(static_cast<int>(len), MPI_BYTE, &contiguous);
    if (err_ != MPI_SUCCESS) return;
    err_ = MPI_Type_create_resized(contiguous, 0, static_cast<MPI_Aint>(extent), &type_);
    MPI_Type_free(&contiguous);
    if (err_ != MPI_SUCCESS) return;
    err_ = MPI_Type_commit(&type_);
    if (err_ != MPI_SUCCESS) MPI_Type_free(&type_);
    made_ = err_ == MPI_SUCCESS;
  }
  ~StridedBytes() {
    if (made_) MPI_Type_free(&type_);
  }
  StridedBytes(const StridedBytes&) = delete;
  StridedBytes& operator=(const StridedBytes&) = delete;
  int error() const { return err_; }
  MPI_Datatype type() const { return type_; }

 private:
  int err_ = MPI_SUCCESS;
  bool made_ = false;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

template <typename Body>
muon_status_t Guarded(void* ctx, const char* what, Body&& body) {
  try {
    if (ctx == nullptr) return Fail(MUON_INVALID_ARGUMENT, absl::StrCat(what, ": ctx is NULL"));
    MpiCtx& c = *static_cast<MpiCtx*>(ctx);
    return body(c);
  } catch (const std::bad_alloc&) {
    muon_set_callback_error(absl::StrCat(what, ": out of host memory").c_str());
    return MUON_RESOURCE_EXHAUSTED;
  } catch (...) {
    return MUON_INTERNAL;
  }
}

muon_status_t CAllGather(void* ctx, const void* send, void* recv, size_t bytes, void* stream) {
  return Guarded(ctx, "all_gather", [&](MpiCtx& c) {
    muon_status_t st = Precheck(c, stream, "all_gather");
    if (st != MUON_OK || bytes == 0) return st;
    char* out = static_cast<char*>(recv);
    // In place: this rank's contribution already sits in its block of recv.
    const bool in_place = send == out + static_cast<size_t>(c.rank) * bytes;
    for (size_t off = 0; off < bytes; off += c.max_message) {
      const size_t len = std::min(c.max_message, bytes - off);
      const void* src = in_place ? MPI_IN_PLACE : static_cast<const char*>(send) + off;
      int err;
      if (len == bytes) {
        err = MPI_Allgather(src, static_cast<int>(len), MPI_BYTE, out, static_cast<int>(len),
                            MPI_BYTE, c.comm);
      } else {
        // Piece `off` of every rank's block: rank r's lands at r * bytes + off.
        StridedBytes piece(len, bytes);
        err = piece.error();
        if (err == MPI_SUCCESS) {
          err = MPI_Allgather(src, static_cast<int>(len), MPI_BYTE, out + off, 1, piece.type(),
                              c.comm);
        }
      }
      st = FromMpi(err, "MPI_Allgather");
      if (st != MUON_OK) return st;
    }
    return MUON_OK;
  });
}

muon_status_t CAllToAllV(void* ctx, const void* send, const size_t* send_bytes,
                         const size_t* send_offsets, void* recv, const size_t* recv_bytes,
                         const size_t* recv_offsets, void* stream) {
  return Guarded(ctx, "all_to_all_v", [&](MpiCtx& c) {
    muon_status_t st = Precheck(c, stream, "all_to_all_v");
    if (st != MUON_OK) return st;
    const int n = c.size;
    const int me = c.rank;
    c.requests.clear();
    int err = MPI_SUCCESS;
    const char* failed = nullptr;
    // Receives first, from me-1, me-2, ...; then sends to me+1, me+2, ...
    for (int k = 1; k < n && err == MPI_SUCCESS; ++k) {
      const int p = (me - k + n) % n;
      char* base = static_cast<char*>(recv) + recv_offsets[p];
      for (size_t off = 0; off < recv_bytes[p] && err == MPI_SUCCESS; off += c.max_message) {
        const size_t len = std::min(c.max_message, recv_bytes[p] - off);
        c.requests.emplace_back();
        err = MPI_Irecv(base + off, static_cast<int>(len), MPI_BYTE, p, kTag, c.comm,
                        &c.requests.back());
        if (err != MPI_SUCCESS) {
          c.requests.pop_back();
          failed = "MPI_Irecv";
        }
      }
    }
    for (int k = 1; k < n && err == MPI_SUCCESS; ++k) {
      const int p = (me + k) % n;
      const char* base = static_cast<const char*>(send) + send_offsets[p];
      for (size_t off = 0; off < send_bytes[p] && err == MPI_SUCCESS; off += c.max_message) {
        const size_t len = std::min(c.max_message, send_bytes[p] - off);
        c.requests.emplace_back();
        err = MPI_Isend(base + off, static_cast<int>(len), MPI_BYTE, p, kTag, c.comm,
                        &c.requests.back());
        if (err != MPI_SUCCESS) {
          c.requests.pop_back();
          failed = "MPI_Isend";
        }
      }
    }
    if (err != MPI_SUCCESS) {
      // Withdraw what was posted so no request outlives the call.
      for (MPI_Request& r : c.requests) MPI_Cancel(&r);
      MPI_Waitall(static_cast<int>(c.requests.size()), c.requests.data(), MPI_STATUSES_IGNORE);
      return FromMpi(err, failed);
    }
    // This rank's own block, while the messages travel.
    if (send_bytes[me] != 0) {
      std::memmove(static_cast<char*>(recv) + recv_offsets[me],
                   static_cast<const char*>(send) + send_offsets[me], send_bytes[me]);
    }
    err = MPI_Waitall(static_cast<int>(c.requests.size()), c.requests.data(),
                      MPI_STATUSES_IGNORE);
    return FromMpi(err, "MPI_Waitall (all_to_all_v)");
  });
}

muon_status_t CBroadcast(void* ctx, void* buf, size_t bytes, int32_t root, void* stream) {
  return Guarded(ctx, "broadcast", [&](MpiCtx& c) {
    muon_status_t st = Precheck(c, stream, "broadcast");
    if (st != MUON_OK) return st;
    if (root < 0 || root >= c.size) {
      return Fail(MUON_INVALID_ARGUMENT,
                  absl::StrCat("broadcast root ", root, " is outside the group of ", c.size));
    }
    for (size_t off = 0; off < bytes; off += c.max_message) {
      const size_t len = std::min(c.max_message, bytes - off);
      st = FromMpi(MPI_Bcast(static_cast<char*>(buf) + off, static_cast<int>(len), MPI_BYTE, root,
                             c.comm),
                   "MPI_Bcast");
      if (st != MUON_OK) return st;
    }
    return MUON_OK;
  });
}

muon_status_t CReduceScatter(void* ctx, const void* send, void* recv, size_t count,
                             int32_t dtype, void* stream) {
  return Guarded(ctx, "reduce_scatter", [&](MpiCtx& c) {
    muon_status_t st = Precheck(c, stream, "reduce_scatter");
    if (st != MUON_OK) return st;
    DType t;
    if (!FromCDType(dtype, &t)) {
      return Fail(MUON_INVALID_ARGUMENT,
                  absl::StrCat("reduce_scatter dtype ", dtype,
                               " is unknown; use MUON_DTYPE_FLOAT32, BFLOAT16 or FLOAT16"));
    }
    if (count == 0) return MUON_OK;
    const size_t es = SizeOf(t);
    const size_t block = count * es;
    const size_t chunk = std::max<size_t>(1, c.max_message / es);  // elements per piece
    const size_t n = static_cast<size_t>(c.size);
    c.gathered.resize(n * std::min(count, chunk) * es);
    std::vector<const void*> blocks(n);
    for (size_t i0 = 0; i0 < count; i0 += chunk) {
      const size_t len = std::min(chunk, count - i0);
      const size_t piece_bytes = len * es;
      int err;
      if (piece_bytes == block) {
        err = MPI_Alltoall(send, static_cast<int>(block), MPI_BYTE, c.gathered.data(),
                           static_cast<int>(block), MPI_BYTE, c.comm);
      } else {
        // Elements [i0, i0 + len) of the block for each rank.
        StridedBytes piece(piece_bytes, block);
        err = piece.error();
        if (err == MPI_SUCCESS) {
          err = MPI_Alltoall(static_cast<const char*>(send) + i0 * es, 1, piece.type(),
                             c.gathered.data(), static_cast<int>(piece_bytes), MPI_BYTE, c.comm);
        }
      }
      st = FromMpi(err, "MPI_Alltoall (reduce_scatter)");
      if (st != MUON_OK) return st;
      for (size_t r = 0; r < n; ++r) blocks[r] = c.gathered.data() + r * piece_bytes;
      SumInRankOrder(t, blocks.data(), c.size, len, static_cast<char*>(recv) + i0 * es);
    }
    return MUON_OK;
  });
}

muon_status_t CBarrier(void* ctx, void* stream) {
  return Guarded(ctx, "barrier", [&](MpiCtx& c) {
    muon_status_t st = Precheck(c, stream, "barrier");
    if (st != MUON_OK) return st;
    return FromMpi(MPI_Barrier(c.comm), "MPI_Barrier");
  });
}

void CRelease(void* ctx) {
  try {
    delete static_cast<MpiCtx*>(ctx);
  } catch (...) {
  }
}

}  // namespace

absl::Status MakeMpiComm(void* mpi_comm, muon_comm_t* out) {
  if (mpi_comm == nullptr) {
    return absl::InvalidArgumentError("mpi_comm is NULL (pass a pointer to an MPI_Comm)");
  }
  if (out == nullptr) return absl::InvalidArgumentError("out is NULL");
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized) {
    return absl::FailedPreconditionError(
        "MPI is not initialized; call MPI_Init or MPI_Init_thread first");
  }
  if (finalized) return absl::FailedPreconditionError("MPI is already finalized");
  const MPI_Comm host = *static_cast<const MPI_Comm*>(mpi_comm);
  if (host == MPI_COMM_NULL) return absl::InvalidArgumentError("*mpi_comm is MPI_COMM_NULL");
  int inter = 0;
  if (MPI_Comm_test_inter(host, &inter) != MPI_SUCCESS || inter) {
    return absl::InvalidArgumentError("*mpi_comm must be an intracommunicator");
  }
  auto ctx = std::make_unique<MpiCtx>();
  const char* hook = std::getenv("MUON_MPI_MAX_MESSAGE_BYTES");
  if (hook != nullptr) {
    const long long v = std::atoll(hook);
    if (v > 0 && static_cast<unsigned long long>(v) < kMaxMessage) {
      ctx->max_message = static_cast<size_t>(v);
    }
  }
  MPI_Query_thread(&ctx->thread_level);
  MPI_Comm dup = MPI_COMM_NULL;
  int err = MPI_Comm_dup(host, &dup);
  if (err != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, text, &len) != MPI_SUCCESS) len = 0;
    return absl::InternalError(absl::StrCat("MPI_Comm_dup failed: ", std::string(text, len)));
  }
  ctx->comm = dup;  // freed by ~MpiCtx from here on
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  MPI_Comm_rank(dup, &ctx->rank);
  MPI_Comm_size(dup, &ctx->size);

  const int rank_in_group = ctx->rank, group_size = ctx->size;
  *out = MakeCommTable(ctx.release(), rank_in_group, group_size,
                       {CAllGather, CAllToAllV, CBroadcast, CReduceScatter, CBarrier, CRelease});
  return absl::OkStatus();
}

}  // namespace muon
