#include "muon/engine/checkpoint.h"

#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "muon/device/host_device.h"

namespace muon {
namespace {

// A reader for the documented layout, written independently of the library's.
class Cursor {
 public:
  explicit Cursor(const std::vector<unsigned char>& b) : b_(b) {}
  template <typename T>
  T Next() {
    T v;
    EXPECT_LE(at_ + sizeof v, b_.size());
    std::memcpy(&v, b_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string Text(size_t n) {
    std::string s(reinterpret_cast<const char*>(b_.data() + at_), n);
    at_ += n;
    return s;
  }
  size_t at() const { return at_; }

 private:
  const std::vector<unsigned char>& b_;
  size_t at_ = 0;
};

struct Storage {
  explicit Storage(std::vector<int64_t> s, DLDataType dt = {kDLFloat, 32, 1})
      : shape(std::move(s)), dtype(dt) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    value.assign(static_cast<size_t>(n) * dt.bits / 8, 0);
    grad = value;
  }
  DLTensor Dl(std::vector<unsigned char>* bytes) {
    DLTensor t{};
    t.data = bytes->data();
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    return t;
  }
  std::vector<int64_t> shape;
  DLDataType dtype;
  std::vector<unsigned char> value, grad;
};

std::vector<Param> TwoParams(Storage* a, Storage* b) {
  std::vector<Param> params;
  DLTensor av = a->Dl(&a->value), ag = a->Dl(&a->grad);
  DLTensor bv = b->Dl(&b->value), bg = b->Dl(&b->grad);
  auto pa = MakeParam(&av, &ag, "w", 0, false);
  auto pb = MakeParam(&bv, &bg, "moe", 2, false);
  EXPECT_TRUE(pa.ok() && pb.ok());
  params.push_back(std::move(pa).value());
  params.push_back(std::move(pb).value());
  // Recognizable momentum bytes, in host-device buffers.
  auto host = MakeHostDevice();
  for (size_t k = 0; k < params.size(); ++k) {
    auto buf = DeviceBuffer::Make(host, params[k].momentum_bytes(), "momentum");
    EXPECT_TRUE(buf.ok());
    params[k].momentum = std::move(buf).value();
    for (size_t i = 0; i < params[k].momentum.size(); ++i) {
      params[k].momentum.as<unsigned char>()[i] = static_cast<unsigned char>(17 * k + i);
    }
  }
  return params;
}

std::vector<const void*> Momenta(const std::vector<Param>& params) {
  std::vector<const void*> m;
  for (const Param& p : params) m.push_back(p.momentum.data());
  return m;
}

TEST(StateBlob, LayoutIsTheDocumentedOne) {
  Storage a({3, 5}), b({2, 4, 3}, {kDLBfloat, 16, 1});
  const std::vector<Param> params = TwoParams(&a, &b);
  std::vector<unsigned char> blob(StateBlobSize(params), 0xee);
  WriteStateBlob(params, 42, Momenta(params), nullptr, blob.data());

  Cursor c(blob);
  EXPECT_EQ(c.Text(8), "MUONSTAT");
  EXPECT_EQ(c.Next<uint32_t>(), 2u);  // format
  EXPECT_EQ(c.Next<uint32_t>(), 0u);  // reserved
  EXPECT_EQ(c.Next<int64_t>(), 42);   // step count
  EXPECT_EQ(c.Next<uint64_t>(), 2u);  // parameters

  struct Want {
    std::string name;
    uint8_t dtype;  // DType: 0 float32, 1 bfloat16
    uint8_t view;
    std::vector<int64_t> shape;
    size_t bytes;
  };
  const Want want[] = {{"w", 0, 0, {3, 5}, 15 * 4}, {"moe", 1, 2, {2, 4, 3}, 24 * 2}};
  for (size_t k = 0; k < 2; ++k) {
    const Want& w = want[k];
    ASSERT_EQ(c.Next<uint32_t>(), w.name.size());
    EXPECT_EQ(c.Text(w.name.size()), w.name);
    EXPECT_EQ(c.Next<uint8_t>(), w.dtype);
    EXPECT_EQ(c.Next<uint8_t>(), w.view);
    EXPECT_EQ(c.Next<uint8_t>(), kGlobalRuns);  // kind
    EXPECT_EQ(c.Next<uint8_t>(), 0u);           // padding
    ASSERT_EQ(c.Next<uint32_t>(), w.shape.size());  // local shape
    for (int64_t d : w.shape) EXPECT_EQ(c.Next<int64_t>(), d);
    ASSERT_EQ(c.Next<uint32_t>(), w.shape.size());  // global shape (one process: the same)
    for (int64_t d : w.shape) EXPECT_EQ(c.Next<int64_t>(), d);
    ASSERT_EQ(c.Next<uint64_t>(), 1u);  // one run: the whole tensor
    int64_t numel = 1;
    for (int64_t d : w.shape) numel *= d;
    EXPECT_EQ(c.Next<int64_t>(), 0);
    EXPECT_EQ(c.Next<int64_t>(), numel);
    ASSERT_EQ(c.Next<uint64_t>(), w.bytes);
    for (size_t i = 0; i < w.bytes; ++i) {
      ASSERT_EQ(c.Next<uint8_t>(), static_cast<unsigned char>(17 * k + i)) << k << " " << i;
    }
  }
  EXPECT_EQ(c.at(), blob.size());
}

TEST(StateBlob, ParsePointsIntoTheBlob) {
  Storage a({3, 5}), b({2, 4, 3});
  const std::vector<Param> params = TwoParams(&a, &b);
  std::vector<unsigned char> blob(StateBlobSize(params));
  WriteStateBlob(params, 7, Momenta(params), nullptr, blob.data());
  auto parsed = ParseStateBlob(blob.data(), blob.size(), "blob");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->format, 2u);
  EXPECT_EQ(parsed->step_count, 7);
  ASSERT_EQ(parsed->params.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const SavedParam& sp = parsed->params[k];
    EXPECT_EQ(sp.name, params[k].name);
    EXPECT_EQ(sp.global_shape, params[k].global_shape);
    EXPECT_EQ(sp.runs, params[k].piece.runs);
    ASSERT_EQ(sp.nbytes, params[k].momentum.size());
    ASSERT_GE(sp.bytes, blob.data());
    ASSERT_LE(sp.bytes + sp.nbytes, blob.data() + blob.size());
    EXPECT_EQ(0, std::memcmp(sp.bytes, params[k].momentum.data(), sp.nbytes));
  }
}

TEST(StateBlob, NoParameters) {
  const std::vector<Param> none;
  EXPECT_EQ(StateBlobSize(none), 32u);
  std::vector<unsigned char> blob(StateBlobSize(none));
  WriteStateBlob(none, 3, {}, nullptr, blob.data());
  auto parsed = ParseStateBlob(blob.data(), blob.size(), "blob");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->step_count, 3);
  EXPECT_TRUE(parsed->params.empty());
}

TEST(StateBlob, EveryFieldIsValidated) {
  Storage a({3, 5}), b({2, 4, 3});
  const std::vector<Param> params = TwoParams(&a, &b);
  std::vector<unsigned char> good(StateBlobSize(params));
  WriteStateBlob(params, 5, Momenta(params), nullptr, good.data());
  struct Case {
    size_t at;          // byte offset of the field
    int64_t value;      // written over it (little-endian, `width` bytes)
    size_t width;
    const char* words;  // what the message must say
  };
  const size_t w = 32 + 4 + 1;  // header, name length, "w": then dtype, view, kind, padding
  const size_t local_dims = w + 4 + 4, global_dims = local_dims + 16 + 4, runs = global_dims + 16;
  const Case cases[] = {
      {0, 0x58585858, 4, "bad magic"},
      {8, 4, 4, "format version 4 is not supported"},
      {12, 1, 4, "header word 'reserved' is 1"},
      {16, -1, 8, "step count -1 is negative"},
      {16, INT64_MIN, 8, "is negative"},
      {24, 3, 8, "ends too early"},  // another parameter count: the entries run out
      {w, 7, 1, "param 'w': unknown momentum dtype 7"},
      {w + 2, 4, 1, "param 'w': unknown entry kind 4"},
      {w + 3, 7, 1, "param 'w': padding word is 7"},
      {local_dims, -3, 8, "param 'w': local shape has a negative dimension"},
      {global_dims, -3, 8, "param 'w': global shape has a negative dimension"},
      {runs + 8, 12, 8, "param 'w': run [12, +15) is outside its 15 global elements"},
      {runs + 16, 0, 8, "param 'w': holds 60 momentum bytes for 0 elements"},
      {runs + 16, 99, 8, "param 'w': run [0, +99) is outside its 15 global elements"},
      // Found by fuzz/state_blob_fuzzer: the next muon_step overflowed the count.
      {16, INT64_MAX, 8, "step count 9223372036854775807 is out of range"},
  };
  for (const Case& c : cases) {
    std::vector<unsigned char> blob = good;
    std::memcpy(blob.data() + c.at, &c.value, c.width);
    auto parsed = ParseStateBlob(blob.data(), blob.size(), "state blob");
    ASSERT_FALSE(parsed.ok()) << c.words;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.words), std::string::npos) << parsed.status();
  }
  // Truncated anywhere, or with bytes after the end.
  for (size_t cut = 0; cut < good.size(); cut += 7) {
    EXPECT_FALSE(ParseStateBlob(good.data(), cut, "state blob").ok()) << cut;
  }
  std::vector<unsigned char> longer = good;
  longer.push_back(0);
  auto extra = ParseStateBlob(longer.data(), longer.size(), "state blob");
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.status().message().find("unexpected bytes after"), std::string::npos);
}

// A format-2 blob of one float32 parameter "w" of local shape [3, 4], made
// up field by field (global shape, runs and byte count as given; the bytes
// count up from 1.0f), so that its runs can be what no writer produces.
std::vector<unsigned char> MadeUpBlob(const std::vector<int64_t>& global,
                                      const std::vector<Run>& runs, uint64_t nbytes) {
  std::vector<unsigned char> b;
  auto put = [&](const void* p, size_t n) {
    b.insert(b.end(), static_cast<const unsigned char*>(p),
             static_cast<const unsigned char*>(p) + n);
  };
  const uint32_t format = 2, zero = 0, name_len = 1, ndim = 2,
                 global_ndim = static_cast<uint32_t>(global.size());
  const int64_t step = 4, dims[2] = {3, 4};
  const uint64_t count = 1, num_runs = runs.size();
  const uint8_t dtype = 0, view = 0, kind = kGlobalRuns, pad = 0;
  put("MUONSTAT", 8);
  put(&format, 4);
  put(&zero, 4);
  put(&step, 8);
  put(&count, 8);
  put(&name_len, 4);
  put("w", 1);
  for (uint8_t v : {dtype, view, kind, pad}) put(&v, 1);
  put(&ndim, 4);
  put(dims, 16);
  put(&global_ndim, 4);
  put(global.data(), 8 * global.size());
  put(&num_runs, 8);
  for (const Run& r : runs) {
    put(&r.offset, 8);
    put(&r.length, 8);
  }
  put(&nbytes, 8);
  for (uint64_t i = 0; i < nbytes / 4; ++i) {
    const float v = static_cast<float>(i + 1);
    put(&v, 4);
  }
  return b;
}

// (Inside a TEST, `Run` is gtest's.)
using Runs = std::vector<Run>;

absl::Status ParseMadeUp(const std::vector<int64_t>& global, const std::vector<Run>& runs,
                         uint64_t nbytes) {
  const std::vector<unsigned char> b = MadeUpBlob(global, runs, nbytes);
  return ParseStateBlob(b.data(), b.size(), "state blob 1").status();
}

TEST(StateBlob, RunsInIncreasingOrderWithoutOverlapAreAccepted) {
  // What writers produce: one run, runs with gaps (a column shard), runs that
  // touch; an empty run in order is harmless.
  const std::vector<Runs> good = {
      {{0, 12}}, {{0, 2}, {4, 2}, {8, 2}}, {{0, 6}, {6, 6}}, {{0, 0}, {0, 12}}, {}};
  for (const Runs& runs : good) {
    int64_t held = 0;
    for (const muon::Run& r : runs) held += r.length;
    const std::vector<unsigned char> b = MadeUpBlob({3, 4}, runs, 4 * held);
    auto parsed = ParseStateBlob(b.data(), b.size(), "state blob");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->params[0].runs, runs);
    EXPECT_EQ(parsed->params[0].held, held);
  }
}

TEST(StateBlob, RunsAreCheckedTogether) {
  struct Case {
    std::vector<int64_t> global;
    Runs runs;
    uint64_t nbytes;
    const char* words;
  };
  constexpr int64_t kHalf = INT64_MAX / 2 + 1;  // 2^62: two of them pass INT64_MAX
  const Case cases[] = {
      // The same 12 elements twice, with bytes for both: each run on its own
      // is inside the tensor, and the byte count matches their sum.
      {{3, 4}, {{0, 12}, {0, 12}}, 24 * 4,
       "run 1 [0, +12) starts before the end 12 of run 0 (runs are in increasing global "
       "order, without overlap)"},
      {{3, 4}, {{0, 6}, {4, 4}}, 10 * 4, "run 1 [4, +4) starts before the end 6 of run 0"},
      {{3, 4}, {{6, 6}, {0, 6}}, 12 * 4, "run 1 [0, +6) starts before the end 12 of run 0"},
      {{3, 4}, {{0, 2}, {4, 2}, {5, 1}}, 5 * 4, "run 2 [5, +1) starts before the end 6 of run 1"},
      // Their sum overflowed int64 (undefined behaviour; UBSan reported it).
      {{INT64_MAX, 1}, {{0, kHalf}, {0, kHalf}}, 0,
       "run 1 [0, +4611686018427387904) starts before the end 4611686018427387904 of run 0"},
      {{INT64_MAX}, {{kHalf - 1, kHalf}, {0, kHalf}}, 0,
       "run 1 [0, +4611686018427387904) starts before the end 9223372036854775807 of run 0"},
      // Each outside the tensor on its own.
      {{3, 4}, {{-1, 2}}, 2 * 4, "run [-1, +2) is outside its 12 global elements"},
      {{3, 4}, {{2, -1}}, 0, "run [2, +-1) is outside its 12 global elements"},
      {{3, 4}, {{13, 0}}, 0, "run [13, +0) is outside its 12 global elements"},
      {{3, 4}, {{0, 6}, {11, 2}}, 8 * 4, "run [11, +2) is outside its 12 global elements"},
      {{3, 4}, {{INT64_MAX, INT64_MAX}}, 0, "is outside its 12 global elements"},
      // 2^62 + 3 elements of float32 are 2^64 + 12 bytes: the product wrapped
      // to 12, and 12 bytes were taken for them.
      {{kHalf + 3}, {{0, kHalf + 3}}, 12,
       "holds 12 momentum bytes for 4611686018427387907 elements of float32"},
      {{3, 4}, {{0, 6}, {6, 6}}, 12 * 4 + 2, "holds 50 momentum bytes for 12 elements"},
  };
  for (const Case& c : cases) {
    const absl::Status st = ParseMadeUp(c.global, c.runs, c.nbytes);
    EXPECT_FALSE(st.ok()) << "accepted, should say: " << c.words;
    if (st.ok()) continue;
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    // The blob, the parameter and the cause.
    EXPECT_NE(st.message().find("state blob 1, param 'w': "), std::string::npos) << st;
    EXPECT_NE(st.message().find(c.words), std::string::npos) << st;
  }
}

TEST(StateBlob, Format1BlobsAreStillRead) {
  // libmuon 0.3's layout: no kind, global shape or runs; a u16 padding word.
  std::vector<unsigned char> v1;
  auto put = [&](const void* p, size_t n) {
    v1.insert(v1.end(), static_cast<const unsigned char*>(p),
              static_cast<const unsigned char*>(p) + n);
  };
  const uint32_t format = 1, zero = 0, name_len = 1, ndim = 2;
  const int64_t step = 9, dims[2] = {2, 3};
  const uint64_t count = 1, nbytes = 6 * 4;
  const uint8_t dtype = 0, view = 0;
  const uint16_t pad = 0;
  const float momentum[6] = {1, 2, 3, 4, 5, 6};
  put("MUONSTAT", 8);
  put(&format, 4);
  put(&zero, 4);
  put(&step, 8);
  put(&count, 8);
  put(&name_len, 4);
  put("w", 1);
  put(&dtype, 1);
  put(&view, 1);
  put(&pad, 2);
  put(&ndim, 4);
  put(dims, 16);
  put(&nbytes, 8);
  put(momentum, sizeof momentum);
  auto parsed = ParseStateBlob(v1.data(), v1.size(), "state blob");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->format, 1u);
  EXPECT_EQ(parsed->step_count, 9);
  ASSERT_EQ(parsed->params.size(), 1u);
  EXPECT_EQ(parsed->params[0].kind, kLocalOnly);
  EXPECT_EQ(parsed->params[0].local_shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(0, std::memcmp(parsed->params[0].bytes, momentum, sizeof momentum));
}

}  // namespace
}  // namespace muon
