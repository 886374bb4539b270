// The NCCL adapter without a GPU: first in a process without NCCL, then
// against a stand-in libnccl.so.2 (fake_nccl.cc) loaded with RTLD_LOCAL, as
// Python extensions load NCCL, so that only dlopen(RTLD_NOLOAD) finds it.
#include "muon/comm/nccl_comm.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/comm/callback_error.h"

#if __has_include(<nccl.h>)
#include <nccl.h>
// The adapter declares NCCL's types itself; they must match the header's.
static_assert(ncclSuccess == muon::nccl_abi::kSuccess, "ncclSuccess");
static_assert(ncclUnhandledCudaError == muon::nccl_abi::kUnhandledCudaError, "ncclResult_t");
static_assert(ncclSystemError == muon::nccl_abi::kSystemError, "ncclResult_t");
static_assert(ncclInternalError == muon::nccl_abi::kInternalError, "ncclResult_t");
static_assert(ncclInvalidArgument == muon::nccl_abi::kInvalidArgument, "ncclResult_t");
static_assert(ncclInvalidUsage == muon::nccl_abi::kInvalidUsage, "ncclResult_t");
static_assert(ncclRemoteError == muon::nccl_abi::kRemoteError, "ncclResult_t");
static_assert(ncclInProgress == muon::nccl_abi::kInProgress, "ncclResult_t");
static_assert(ncclUint8 == muon::nccl_abi::kUint8, "ncclDataType_t");
static_assert(ncclFloat16 == muon::nccl_abi::kFloat16, "ncclDataType_t");
static_assert(ncclFloat32 == muon::nccl_abi::kFloat32, "ncclDataType_t");
static_assert(ncclBfloat16 == muon::nccl_abi::kBfloat16, "ncclDataType_t");
static_assert(ncclSum == muon::nccl_abi::kSum, "ncclRedOp_t");
static_assert(sizeof(ncclResult_t) == sizeof(int), "ncclResult_t is int-sized");
static_assert(sizeof(ncclDataType_t) == sizeof(int), "ncclDataType_t is int-sized");
static_assert(sizeof(ncclComm_t) == sizeof(void*), "ncclComm_t is a pointer");
#define MUON_CHECKED_AGAINST_NCCL_H 1
#endif

namespace muon {
namespace {

struct FakeComm {  // as in fake_nccl.cc
  int rank;
  int size;
  void* clique = nullptr;  // a lone rank
};

class FakeNccl {
 public:
  explicit FakeNccl(void* handle) : handle_(handle) {
    log_ = reinterpret_cast<const char* (*)()>(dlsym(handle, "fake_nccl_log"));
    clear_ = reinterpret_cast<void (*)()>(dlsym(handle, "fake_nccl_clear"));
    fail_next_ = reinterpret_cast<void (*)(int)>(dlsym(handle, "fake_nccl_fail_next"));
  }
  bool ok() const { return log_ && clear_ && fail_next_; }
  // The calls logged since the last Take().
  std::string Take() {
    std::string s = log_();
    clear_();
    return s;
  }
  void FailNext(int result) { fail_next_(result); }

 private:
  void* handle_;
  const char* (*log_)() = nullptr;
  void (*clear_)() = nullptr;
  void (*fail_next_)(int) = nullptr;
};

void ExpectUnavailableWithoutNccl() {
  FakeComm fake{0, 1};
  muon_comm_t out;
  std::memset(&out, 0xab, sizeof out);
  const absl::Status s = MakeNcclComm(&fake, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(std::string(s.message()).find("no NCCL is loaded"), std::string::npos) << s;
  EXPECT_NE(std::string(s.message()).find("libnccl.so.2"), std::string::npos) << s;
  EXPECT_EQ(out.struct_size, static_cast<size_t>(0xabababababababab));  // untouched
}

TEST(NcclComm, TypesMatchNcclHeader) {
#ifdef MUON_CHECKED_AGAINST_NCCL_H
  std::printf("NCCL enum values checked against nccl.h (NCCL %d.%d.%d)\n", NCCL_MAJOR, NCCL_MINOR,
              NCCL_PATCH);
#else
  std::printf("nccl.h is not available (no CUDA toolkit): enum values not checked\n");
#endif
}

TEST(NcclComm, UnavailableUntilNcclIsLoadedThenDrivesIt) {
  // 1. No NCCL in this process.
  ASSERT_EQ(dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD), nullptr)
      << "this test must run in a process without NCCL";
  ExpectUnavailableWithoutNccl();
  EXPECT_EQ(MakeNcclComm(nullptr, nullptr).code(), absl::StatusCode::kInvalidArgument);

  // 2. The stand-in, loaded locally (not in the global scope).
  const char* path = std::getenv("FAKE_NCCL");
  ASSERT_NE(path, nullptr) << "FAKE_NCCL names the stand-in libnccl.so.2";
  std::string lib = path;
  if (lib.find('/') == std::string::npos) lib = "./" + lib;
  void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  ASSERT_EQ(dlsym(RTLD_DEFAULT, "ncclCommCount"), nullptr);  // really local
  FakeNccl nccl(handle);
  ASSERT_TRUE(nccl.ok());

  // A communicator NCCL refuses.
  FakeComm broken{0, 0};
  muon_comm_t t;
  absl::Status s = MakeNcclComm(&broken, &t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("ncclCommCount refused"), std::string::npos) << s;

  // 3. One rank: data moves (the stand-in copies host memory).
  FakeComm one{0, 1};
  ASSERT_TRUE(MakeNcclComm(&one, &t).ok());
  EXPECT_EQ(t.struct_size, sizeof(muon_comm_t));
  EXPECT_EQ(t.rank, 0);
  EXPECT_EQ(t.size, 1);
  nccl.Take();
  {
    const char send[6] = "hello";
    char recv[6] = {};
    ASSERT_EQ(t.all_gather(t.ctx, send, recv, 6, nullptr), MUON_OK);
    EXPECT_STREQ(recv, "hello");
    size_t sb[1] = {5}, so[1] = {0}, rb[1] = {5}, ro[1] = {1};
    char a2a[8] = {};
    ASSERT_EQ(t.all_to_all_v(t.ctx, "world", sb, so, a2a, rb, ro, nullptr), MUON_OK);
    EXPECT_STREQ(a2a + 1, "world");
    float rs_send[3] = {1.5f, 2.5f, 3.5f}, rs_recv[3] = {};
    ASSERT_EQ(t.reduce_scatter(t.ctx, rs_send, rs_recv, 3, MUON_DTYPE_FLOAT32, nullptr), MUON_OK);
    EXPECT_EQ(rs_recv[2], 3.5f);
    EXPECT_EQ(nccl.Take(),
              "AllGather(6,1);GroupStart;Send(0,5,1);Recv(0,5,1);GroupEnd;"
              "ReduceScatter(3,7,op0);");
  }
  t.release(t.ctx);
  EXPECT_EQ(nccl.Take(), "");  // no barrier, no scratch buffer to free

  // 4. Rank 1 of 3: the calls the adapter makes.
  FakeComm three{1, 3};
  ASSERT_TRUE(MakeNcclComm(&three, &t).ok());
  EXPECT_EQ(t.rank, 1);
  EXPECT_EQ(t.size, 3);
  nccl.Take();
  int stream_token = 0;
  void* stream = &stream_token;
  {
    std::vector<char> send(16), recv(16);
    size_t sb[3] = {2, 0, 3}, so[3] = {0, 2, 2}, rb[3] = {0, 4, 1}, ro[3] = {0, 0, 4};
    ASSERT_EQ(
        t.all_to_all_v(t.ctx, send.data(), sb, so, recv.data(), rb, ro, stream), MUON_OK);
    EXPECT_EQ(nccl.Take(), "GroupStart;Send(0,2,1);Recv(1,4,1);Send(2,3,1);Recv(2,1,1);GroupEnd;");
    // Nothing to move: no group at all.
    size_t zero[3] = {0, 0, 0};
    ASSERT_EQ(t.all_to_all_v(t.ctx, nullptr, zero, zero, nullptr, zero, zero, stream), MUON_OK);
    EXPECT_EQ(nccl.Take(), "");

    char buf[4] = {};
    ASSERT_EQ(t.broadcast(t.ctx, buf, 4, 2, stream), MUON_OK);
    EXPECT_EQ(nccl.Take(), "Broadcast(4,1,root2,inplace);");
    EXPECT_EQ(t.broadcast(t.ctx, buf, 4, 3, stream), MUON_INVALID_ARGUMENT);
    EXPECT_NE(TakeCallbackError().find("root 3 is outside the group of 3"), std::string::npos);

    uint16_t half[6] = {};
    ASSERT_EQ(t.reduce_scatter(t.ctx, half, half, 2, MUON_DTYPE_BFLOAT16, stream), MUON_OK);
    ASSERT_EQ(t.reduce_scatter(t.ctx, half, half, 2, MUON_DTYPE_FLOAT16, stream), MUON_OK);
    ASSERT_EQ(t.reduce_scatter(t.ctx, half, half, 0, MUON_DTYPE_FLOAT16, stream), MUON_OK);
    EXPECT_EQ(nccl.Take(), "ReduceScatter(2,9,op0);ReduceScatter(2,6,op0);");
    EXPECT_EQ(t.reduce_scatter(t.ctx, half, half, 2, 5, stream), MUON_INVALID_ARGUMENT);
    EXPECT_NE(TakeCallbackError().find("dtype 5 is unknown"), std::string::npos);

    char gather[6] = {};
    ASSERT_EQ(t.all_gather(t.ctx, gather + 2, gather, 2, stream), MUON_OK);
    EXPECT_EQ(nccl.Take(), "AllGather(2,1,inplace,stream);");

    // The barrier: a scratch buffer once, then a 1-byte in-place all-gather each time.
    ASSERT_EQ(t.barrier(t.ctx, stream), MUON_OK);
    ASSERT_EQ(t.barrier(t.ctx, stream), MUON_OK);
    EXPECT_EQ(nccl.Take(), "MemAlloc(3);AllGather(1,1,inplace,stream);AllGather(1,1,inplace,stream);");
  }

  // 5. Errors carry NCCL's text; a nonblocking communicator's ncclInProgress settles.
  {
    char gather[6] = {};
    nccl.FailNext(5);  // ncclInvalidUsage
    EXPECT_EQ(t.all_gather(t.ctx, gather, gather, 2, stream), MUON_FAILED_PRECONDITION);
    const std::string msg = TakeCallbackError();
    EXPECT_NE(msg.find("ncclAllGather failed: fake error string (ncclResult_t 5): fake last error"),
              std::string::npos)
        << msg;
    nccl.FailNext(2);  // ncclSystemError
    EXPECT_EQ(t.barrier(t.ctx, stream), MUON_UNAVAILABLE);
    EXPECT_NE(TakeCallbackError().find("barrier"), std::string::npos);
    nccl.Take();

    nccl.FailNext(7);  // ncclInProgress, settling after two polls
    EXPECT_EQ(t.all_gather(t.ctx, gather, gather, 2, stream), MUON_OK);
    EXPECT_EQ(nccl.Take(), "AllGather(2,1,stream);GetAsyncError;GetAsyncError;GetAsyncError;");

    // A failing ncclSend still closes the group.
    std::vector<char> send(16), recv(16);
    size_t sb[3] = {2, 0, 3}, so[3] = {0, 2, 2}, rb[3] = {0, 4, 1}, ro[3] = {0, 0, 4};
    nccl.FailNext(3);  // ncclInternalError
    EXPECT_EQ(t.all_to_all_v(t.ctx, send.data(), sb, so, recv.data(), rb, ro, stream),
              MUON_INTERNAL);
    EXPECT_NE(TakeCallbackError().find("ncclSend failed"), std::string::npos);
    EXPECT_EQ(nccl.Take(), "GroupStart;Send(0,2,1);GroupEnd;");
  }
  t.release(t.ctx);
  EXPECT_EQ(nccl.Take(), "MemFree;");

  // 6. Once NCCL is global (RTLD_GLOBAL), it is found among the global symbols.
  void* global = dlopen(lib.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
  ASSERT_NE(global, nullptr);
  ASSERT_NE(dlsym(RTLD_DEFAULT, "ncclCommCount"), nullptr);
  ASSERT_TRUE(MakeNcclComm(&three, &t).ok());
  EXPECT_EQ(t.rank, 1);
  t.release(t.ctx);
  dlclose(global);
  dlclose(handle);
}

}  // namespace
}  // namespace muon
