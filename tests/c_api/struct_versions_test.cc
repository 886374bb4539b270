// The extensible structs across header versions, through the shipped
// libmuon.so: a caller built against an older header passes a shorter
// struct (its struct_size), and the library neither writes nor reads a byte
// past it; a struct_size that no published header had (one that ends inside
// a field, or between the versions) is refused, naming the struct, the size
// and the sizes accepted, and changes nothing; every published size is
// accepted and read as that version (the fields past it take their defaults).
#include <dlpack/dlpack.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "libmuon/muon.h"
#include "gtest/gtest.h"
#include "tests/c_api/host_matrix.h"

namespace {

constexpr unsigned char kGuard = 0xAB;
constexpr DLDataType kF32{kDLFloat, 32, 1};

// The sizes each released header had (LP64; tests/c_api/c99_test.c freezes
// the offsets they come from).
const std::vector<size_t> kOptionsSizes = {104, 144, 152, 184};     // 0.1, 0.2, 0.4, 0.5
const std::vector<size_t> kParamOptionsSizes = {24, 56};            // 0.1, 0.2
const std::vector<size_t> kStatsSizes = {80, 96, 128};              // 0.2, 0.4, 0.5
constexpr size_t kCustomLayoutSize = 56;                            // 0.2
constexpr size_t kCommSize = 72;                                    // 0.2

// A struct of `size` bytes at the start of a larger buffer whose other bytes
// are guard bytes.
struct Guarded {
  std::vector<unsigned char> bytes;
  size_t size;
  Guarded(size_t size, size_t room = 256) : bytes(size + room, kGuard), size(size) {}
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }
  // The first guard byte that changed, or -1.
  long FirstTouchedGuard() const {
    for (size_t i = size; i < bytes.size(); ++i) {
      if (bytes[i] != kGuard) return static_cast<long>(i);
    }
    return -1;
  }
};

// Every byte of `got` in [from, to) equals `want`'s.
void ExpectSameBytes(const void* got, const void* want, size_t from, size_t to,
                     const std::string& what) {
  const auto* g = static_cast<const unsigned char*>(got);
  const auto* w = static_cast<const unsigned char*>(want);
  for (size_t i = from; i < to; ++i) {
    ASSERT_EQ(g[i], w[i]) << what << ": byte " << i;
  }
}

bool Has(const std::string& text, const std::string& word) {
  return text.find(word) != std::string::npos;
}

// The message names the parameter, the size given, the struct and every
// accepted size.
void ExpectRefusal(muon_status_t st, const std::string& subject, size_t given,
                   const std::string& type, const std::vector<size_t>& accepted) {
  EXPECT_EQ(st, MUON_INVALID_ARGUMENT) << subject << " " << given;
  const std::string msg = muon_last_error_message();
  EXPECT_TRUE(Has(msg, subject + " is " + std::to_string(given))) << msg;
  EXPECT_TRUE(Has(msg, type)) << msg;
  for (size_t a : accepted) EXPECT_TRUE(Has(msg, std::to_string(a))) << a << ": " << msg;
}

muon_options_t FullOptions() {
  muon_options_t o;
  EXPECT_EQ(muon_options_init(&o, sizeof o), MUON_OK);
  return o;
}

using Matrix = muon_test::HostMatrix;

// ---------------------------------------------------------------------------
// *_init and the calls that fill a caller's struct write nothing past it.

TEST(StructVersions, OptionsInitWritesTheDefaultsUpToTheCallersSizeAndNothingPast) {
  const muon_options_t full = FullOptions();
  for (size_t size : kOptionsSizes) {
    Guarded buf(size);
    ASSERT_EQ(muon_options_init(buf.as<muon_options_t>(), size), MUON_OK)
        << size << ": " << muon_last_error_message();
    EXPECT_EQ(buf.FirstTouchedGuard(), -1) << "struct_size " << size;
    EXPECT_EQ(buf.as<muon_options_t>()->struct_size, size);
    ExpectSameBytes(buf.bytes.data(), &full, sizeof(size_t), size,
                    "muon_options_init " + std::to_string(size));
  }
}

TEST(StructVersions, ParamOptionsInitWritesTheDefaultsUpToTheCallersSizeAndNothingPast) {
  muon_param_options_t full;
  ASSERT_EQ(muon_param_options_init(&full, sizeof full), MUON_OK);
  for (size_t size : kParamOptionsSizes) {
    Guarded buf(size);
    ASSERT_EQ(muon_param_options_init(buf.as<muon_param_options_t>(), size), MUON_OK)
        << size << ": " << muon_last_error_message();
    EXPECT_EQ(buf.FirstTouchedGuard(), -1) << "struct_size " << size;
    EXPECT_EQ(buf.as<muon_param_options_t>()->struct_size, size);
    ExpectSameBytes(buf.bytes.data(), &full, sizeof(size_t), size,
                    "muon_param_options_init " + std::to_string(size));
  }
}

TEST(StructVersions, StatsInitZeroesUpToTheCallersSizeAndNothingPast) {
  for (size_t size : kStatsSizes) {
    Guarded buf(size);
    ASSERT_EQ(muon_stats_init(buf.as<muon_stats_t>(), size), MUON_OK)
        << size << ": " << muon_last_error_message();
    EXPECT_EQ(buf.FirstTouchedGuard(), -1) << "struct_size " << size;
    EXPECT_EQ(buf.as<muon_stats_t>()->struct_size, size);
    for (size_t i = sizeof(size_t); i < size; ++i) ASSERT_EQ(buf.bytes[i], 0) << size << " " << i;
  }
}

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer: heap blocks of exactly an old size, so that a write
// past them is reported where it happens.
TEST(StructVersions, InitIntoHeapBlocksOfExactlyAnOldSize) {
  for (size_t size : kOptionsSizes) {
    void* p = std::malloc(size);
    EXPECT_EQ(muon_options_init(static_cast<muon_options_t*>(p), size), MUON_OK);
    std::free(p);
  }
  for (size_t size : kParamOptionsSizes) {
    void* p = std::malloc(size);
    EXPECT_EQ(muon_param_options_init(static_cast<muon_param_options_t*>(p), size), MUON_OK);
    std::free(p);
  }
  for (size_t size : kStatsSizes) {
    void* p = std::malloc(size);
    EXPECT_EQ(muon_stats_init(static_cast<muon_stats_t*>(p), size), MUON_OK);
    std::free(p);
  }
}
#endif

TEST(StructVersions, GetOptionsAndGetStatsFillAnOldStructUpToItsSize) {
  muon_optimizer_t* opt = nullptr;
  muon_options_t o = FullOptions();
  o.lr = 0.25;
  ASSERT_EQ(muon_create(&o, &opt), MUON_OK) << muon_last_error_message();
  Matrix m(6, 4, 0.3f, 0.7f);
  int64_t id = -1;
  ASSERT_EQ(muon_register_param(opt, &m.v, &m.g, nullptr, &id), MUON_OK);
  ASSERT_EQ(muon_step(opt, nullptr), MUON_OK) << muon_last_error_message();

  muon_options_t full_options;
  full_options.struct_size = sizeof full_options;
  ASSERT_EQ(muon_get_options(opt, &full_options), MUON_OK);
  for (size_t size : kOptionsSizes) {
    Guarded buf(size);
    buf.as<muon_options_t>()->struct_size = size;
    ASSERT_EQ(muon_get_options(opt, buf.as<muon_options_t>()), MUON_OK)
        << size << ": " << muon_last_error_message();
    EXPECT_EQ(buf.FirstTouchedGuard(), -1) << "struct_size " << size;
    EXPECT_EQ(buf.as<muon_options_t>()->struct_size, size);
    EXPECT_EQ(buf.as<muon_options_t>()->lr, 0.25);
    ExpectSameBytes(buf.bytes.data(), &full_options, sizeof(size_t), size,
                    "muon_get_options " + std::to_string(size));
  }

  muon_stats_t full_stats;
  ASSERT_EQ(muon_stats_init(&full_stats, sizeof full_stats), MUON_OK);
  ASSERT_EQ(muon_get_stats(opt, &full_stats), MUON_OK);
  EXPECT_EQ(full_stats.steps, 1);
  for (size_t size : kStatsSizes) {
    Guarded buf(size);
    buf.as<muon_stats_t>()->struct_size = size;
    ASSERT_EQ(muon_get_stats(opt, buf.as<muon_stats_t>()), MUON_OK)
        << size << ": " << muon_last_error_message();
    EXPECT_EQ(buf.FirstTouchedGuard(), -1) << "struct_size " << size;
    EXPECT_EQ(buf.as<muon_stats_t>()->struct_size, size);
    ExpectSameBytes(buf.bytes.data(), &full_stats, sizeof(size_t), size,
                    "muon_get_stats " + std::to_string(size));
  }
  muon_destroy(opt);
}

// ---------------------------------------------------------------------------
// Sizes no header had are refused, and nothing changes.

// Sizes that end inside a field, on a field boundary between two published
// versions, or past this library's struct off its 8-byte alignment.
const std::vector<size_t> kTornOptions = {105, 112, 131, 140, 148, 180, 183, 185, 190};
const std::vector<size_t> kTornParamOptions = {25, 28, 32, 42, 50, 57, 60};
const std::vector<size_t> kTornStats = {84, 88, 100, 120, 131};

TEST(StructVersions, InitRefusesAnUnpublishedSizeAndWritesNothing) {
  for (size_t size : kTornOptions) {
    Guarded buf(size);
    buf.size = 0;  // not one byte may change
    ExpectRefusal(muon_options_init(buf.as<muon_options_t>(), size), "options->struct_size", size,
                  "muon_options_t", kOptionsSizes);
    EXPECT_EQ(buf.FirstTouchedGuard(), -1) << size;
  }
  for (size_t size : kTornParamOptions) {
    Guarded buf(size);
    buf.size = 0;
    ExpectRefusal(muon_param_options_init(buf.as<muon_param_options_t>(), size),
                  "options->struct_size", size, "muon_param_options_t", kParamOptionsSizes);
    EXPECT_EQ(buf.FirstTouchedGuard(), -1) << size;
  }
  for (size_t size : kTornStats) {
    Guarded buf(size);
    buf.size = 0;
    ExpectRefusal(muon_stats_init(buf.as<muon_stats_t>(), size), "stats->struct_size", size,
                  "muon_stats_t", kStatsSizes);
    EXPECT_EQ(buf.FirstTouchedGuard(), -1) << size;
  }
}

TEST(StructVersions, CreateRefusesOptionsOfAnUnpublishedSize) {
  for (size_t size : kTornOptions) {
    muon_options_t o = FullOptions();
    o.struct_size = size;
    muon_optimizer_t* sentinel = reinterpret_cast<muon_optimizer_t*>(uintptr_t{0x5a5a5a5a});
    muon_optimizer_t* opt = sentinel;
    ExpectRefusal(muon_create(&o, &opt), "options->struct_size", size, "muon_options_t",
                  kOptionsSizes);
    EXPECT_EQ(opt, sentinel) << size;
  }
}

TEST(StructVersions, GetOptionsAndGetStatsRefuseAnUnpublishedSize) {
  muon_optimizer_t* opt = nullptr;
  muon_options_t o = FullOptions();
  ASSERT_EQ(muon_create(&o, &opt), MUON_OK);
  for (size_t size : kTornOptions) {
    Guarded buf(size);
    buf.as<muon_options_t>()->struct_size = size;
    const std::vector<unsigned char> before = buf.bytes;
    ExpectRefusal(muon_get_options(opt, buf.as<muon_options_t>()), "out->struct_size", size,
                  "muon_options_t", kOptionsSizes);
    EXPECT_EQ(buf.bytes, before) << size;
  }
  for (size_t size : kTornStats) {
    Guarded buf(size);
    buf.as<muon_stats_t>()->struct_size = size;
    const std::vector<unsigned char> before = buf.bytes;
    ExpectRefusal(muon_get_stats(opt, buf.as<muon_stats_t>()), "stats->struct_size", size,
                  "muon_stats_t", kStatsSizes);
    EXPECT_EQ(buf.bytes, before) << size;
  }
  muon_destroy(opt);
}

TEST(StructVersions, RegistrationRefusesParamOptionsOfAnUnpublishedSize) {
  muon_optimizer_t* opt = nullptr;
  muon_options_t o = FullOptions();
  ASSERT_EQ(muon_create(&o, &opt), MUON_OK);
  Matrix m(4, 4, 0.3f, 0.7f);
  for (size_t size : kTornParamOptions) {
    muon_param_options_t po;
    ASSERT_EQ(muon_param_options_init(&po, sizeof po), MUON_OK);
    po.name = "w";
    po.struct_size = size;
    int64_t id = -7;
    ExpectRefusal(muon_register_param(opt, &m.v, &m.g, &po, &id), "options->struct_size", size,
                  "muon_param_options_t", kParamOptionsSizes);
    EXPECT_EQ(id, -7);
  }
  size_t count = 99;
  ASSERT_EQ(muon_num_params(opt, &count), MUON_OK);
  EXPECT_EQ(count, 0u);
  muon_destroy(opt);
}

// A world of one in-process rank, for the custom path (which needs a world).
struct WorldOfOne {
  muon_inprocess_world_t* world = nullptr;
  muon_optimizer_t* opt = nullptr;
  WorldOfOne() {
    muon_options_t o = FullOptions();
    EXPECT_EQ(muon_create(&o, &opt), MUON_OK);
    EXPECT_EQ(muon_inprocess_world_create(1, &world), MUON_OK);
    muon_comm_t c;
    EXPECT_EQ(muon_inprocess_comm(world, nullptr, 0, 0, &c), MUON_OK);
    int32_t gid = -1;
    EXPECT_EQ(muon_set_world(opt, &c, &gid), MUON_OK) << muon_last_error_message();
  }
  ~WorldOfOne() {
    muon_destroy(opt);
    muon_inprocess_world_destroy(world);
  }
};

int32_t OwnerZero(void*, const char*, int32_t) { return 0; }
// Never called: these tests register and do not step.
muon_status_t NoGather(void*, const float*, int64_t, int32_t, muon_gathered_t*, void*) {
  return MUON_INTERNAL;
}
muon_status_t NoRedistribute(void*, const float*, int64_t, int64_t, int32_t, float*, int64_t,
                             void*) {
  return MUON_INTERNAL;
}

muon_custom_layout_t Layout(int64_t rows, int64_t cols) {
  muon_custom_layout_t l;
  std::memset(&l, 0, sizeof l);
  l.struct_size = sizeof l;
  l.global_rows = rows;
  l.global_cols = cols;
  l.assign_fn = &OwnerZero;
  l.gather_fn = &NoGather;
  l.redistribute_fn = &NoRedistribute;
  return l;
}

TEST(StructVersions, CustomRegistrationRefusesUnpublishedSizes) {
  WorldOfOne w;
  Matrix m(4, 4, 0.3f, 0.7f);
  for (size_t size : kTornParamOptions) {
    muon_param_options_t po;
    ASSERT_EQ(muon_param_options_init(&po, sizeof po), MUON_OK);
    po.name = "c";
    po.struct_size = size;
    muon_custom_layout_t l = Layout(4, 4);
    int64_t id = -7;
    ExpectRefusal(muon_register_param_custom(w.opt, &m.v, &m.g, &po, &l, &id),
                  "options->struct_size", size, "muon_param_options_t", kParamOptionsSizes);
    EXPECT_EQ(id, -7);
  }
  for (size_t size : {size_t{0}, size_t{40}, size_t{50}, size_t{60}, size_t{63}}) {
    muon_param_options_t po;
    ASSERT_EQ(muon_param_options_init(&po, sizeof po), MUON_OK);
    po.name = "c";
    muon_custom_layout_t l = Layout(4, 4);
    l.struct_size = size;
    int64_t id = -7;
    ExpectRefusal(muon_register_param_custom(w.opt, &m.v, &m.g, &po, &l, &id),
                  "layout->struct_size", size, "muon_custom_layout_t", {kCustomLayoutSize});
    EXPECT_EQ(id, -7);
  }
  size_t count = 99;
  ASSERT_EQ(muon_num_params(w.opt, &count), MUON_OK);
  EXPECT_EQ(count, 0u);
}

// The release a refused table must not see.
int released = 0;
void CountRelease(void*) { ++released; }

// A table of a refused size is read no further than its struct_size: not
// even its release, which may lie past the caller's struct (the host keeps
// it, and releases the table itself). Each table here is a heap block of
// exactly its struct_size (at least the field itself), so that
// AddressSanitizer sees a read past it. Found by fuzz/api_sequence_fuzzer:
// the library called the release of a refused table, reading past a
// shorter one.
TEST(StructVersions, SetWorldAndAddGroupRefuseACommOfAnUnpublishedSize) {
  muon_inprocess_world_t* world = nullptr;
  ASSERT_EQ(muon_inprocess_world_create(1, &world), MUON_OK);
  for (bool as_world : {true, false}) {
    for (size_t size : {size_t{0}, size_t{64}, size_t{70}, size_t{76}, size_t{77}, size_t{81}}) {
      muon_optimizer_t* opt = nullptr;
      muon_options_t o = FullOptions();
      ASSERT_EQ(muon_create(&o, &opt), MUON_OK);
      int32_t gid = -1;
      if (!as_world) {
        muon_comm_t w;
        ASSERT_EQ(muon_inprocess_comm(world, nullptr, 0, 0, &w), MUON_OK);
        ASSERT_EQ(muon_set_world(opt, &w, &gid), MUON_OK);
      }
      muon_comm_t c;
      ASSERT_EQ(muon_inprocess_comm(world, nullptr, 0, 0, &c), MUON_OK);
      muon_comm_t counted = c;
      counted.release = &CountRelease;
      counted.struct_size = size;
      const size_t bytes = std::max(size, sizeof(size_t));
      std::unique_ptr<unsigned char[]> block(new unsigned char[bytes]);
      std::memcpy(block.get(), &counted, std::min(bytes, sizeof counted));
      muon_comm_t* table = reinterpret_cast<muon_comm_t*>(block.get());
      released = 0;
      int32_t out = -7;
      const muon_status_t st =
          as_world ? muon_set_world(opt, table, &out) : muon_add_group(opt, table, &out);
      ExpectRefusal(st, as_world ? "world->struct_size" : "group 1->struct_size", size,
                    "muon_comm_t", {kCommSize});
      EXPECT_EQ(out, -7);
      EXPECT_EQ(released, 0) << size;
      c.release(c.ctx);  // still the host's
      muon_destroy(opt);
      EXPECT_EQ(released, 0) << size;
    }
  }
  muon_inprocess_world_destroy(world);
}

// ---------------------------------------------------------------------------
// Every published size is accepted and read as that version.

// Options whose every field past `size` holds a value the library refuses,
// so that reading any of them fails the call.
muon_options_t OptionsWithJunkPast(size_t size) {
  muon_options_t o = FullOptions();
  o.lr = 0.125;  // in every version
  auto past = [size](size_t offset) { return offset >= size; };
  if (past(offsetof(muon_options_t, assignment))) {
    o.assignment = 77;
    o.prefetch_count = -3;
    o.reserved1 = 5;
    o.round_bytes = ~size_t{0};
  } else {
    o.assignment = MUON_ASSIGNMENT_ROUND_ROBIN;
  }
  if (past(offsetof(muon_options_t, skip_nonfinite))) {
    o.skip_nonfinite = 3;
  } else {
    o.skip_nonfinite = 1;
  }
  if (past(offsetof(muon_options_t, allocate))) {
    // One hook without the other: refused when read.
    o.allocate = reinterpret_cast<decltype(o.allocate)>(uintptr_t{0x10});
    o.release = nullptr;
    o.update_in_grad = 9;
  } else {
    o.update_in_grad = 1;
  }
  o.struct_size = size;
  return o;
}

TEST(StructVersions, EveryPublishedOptionsSizeIsReadAsItsVersion) {
  const muon_options_t defaults = FullOptions();
  for (size_t size : kOptionsSizes) {
    muon_options_t o = OptionsWithJunkPast(size);
    muon_optimizer_t* opt = nullptr;
    ASSERT_EQ(muon_create(&o, &opt), MUON_OK) << size << ": " << muon_last_error_message();
    muon_options_t got;
    got.struct_size = sizeof got;
    ASSERT_EQ(muon_get_options(opt, &got), MUON_OK);
    EXPECT_EQ(got.lr, 0.125) << size;
    const bool has_02 = size > offsetof(muon_options_t, assignment);
    const bool has_04 = size > offsetof(muon_options_t, skip_nonfinite);
    const bool has_05 = size > offsetof(muon_options_t, allocate);
    EXPECT_EQ(got.assignment, has_02 ? MUON_ASSIGNMENT_ROUND_ROBIN : defaults.assignment) << size;
    EXPECT_EQ(got.prefetch_count, defaults.prefetch_count) << size;
    EXPECT_EQ(got.skip_nonfinite, has_04 ? 1 : defaults.skip_nonfinite) << size;
    EXPECT_EQ(got.update_in_grad, has_05 ? 1 : defaults.update_in_grad) << size;
    EXPECT_EQ(got.allocate, nullptr) << size;
    muon_destroy(opt);
  }
  // The junk is refused when the struct does reach it: the fields are read.
  muon_options_t o = OptionsWithJunkPast(kOptionsSizes[0]);
  o.struct_size = sizeof o;
  muon_optimizer_t* opt = nullptr;
  EXPECT_NE(muon_create(&o, &opt), MUON_OK);
}

TEST(StructVersions, EveryPublishedParamOptionsSizeIsReadAsItsVersion) {
  muon_optimizer_t* opt = nullptr;
  muon_options_t o = FullOptions();
  ASSERT_EQ(muon_create(&o, &opt), MUON_OK);
  Matrix a(4, 6, 0.3f, 0.7f), b(4, 6, 0.3f, 0.7f);
  // 0.1 (24 bytes): the 0.2 fields past it hold values refused when read.
  muon_param_options_t po;
  ASSERT_EQ(muon_param_options_init(&po, sizeof po), MUON_OK);
  po.name = "a";
  po.global_ndim = -4;
  po.num_placements = 3;
  po.replicated_mode = 7;
  po.reserved1 = 1;
  po.struct_size = kParamOptionsSizes[0];
  int64_t id = -1;
  ASSERT_EQ(muon_register_param(opt, &a.v, &a.g, &po, &id), MUON_OK)
      << muon_last_error_message();
  EXPECT_EQ(id, 0);
  // 0.2 (56 bytes): they are read.
  po.name = "b";
  po.struct_size = kParamOptionsSizes[1];
  EXPECT_EQ(muon_register_param(opt, &b.v, &b.g, &po, &id), MUON_INVALID_ARGUMENT);
  po.global_ndim = 0;
  po.num_placements = 0;
  po.replicated_mode = MUON_REPLICATED_HOST_AVERAGED;
  po.reserved1 = 0;
  ASSERT_EQ(muon_register_param(opt, &b.v, &b.g, &po, &id), MUON_OK)
      << muon_last_error_message();
  EXPECT_EQ(id, 1);
  ASSERT_EQ(muon_step(opt, nullptr), MUON_OK) << muon_last_error_message();
  muon_destroy(opt);
}

TEST(StructVersions, ThePublishedCustomLayoutAndCommSizesAreAccepted) {
  WorldOfOne w;  // muon_set_world with a muon_comm_t of 72 bytes
  Matrix m(4, 4, 0.3f, 0.7f);
  muon_param_options_t po;
  ASSERT_EQ(muon_param_options_init(&po, kParamOptionsSizes[0]), MUON_OK);
  po.name = "c";
  muon_custom_layout_t l = Layout(4, 4);
  ASSERT_EQ(l.struct_size, kCustomLayoutSize);
  int64_t id = -1;
  EXPECT_EQ(muon_register_param_custom(w.opt, &m.v, &m.g, &po, &l, &id), MUON_OK)
      << muon_last_error_message();
  EXPECT_EQ(id, 0);
}

// A caller built against a newer header passes a larger struct (a multiple
// of 8 bytes): the fields this library knows are read and written, the rest
// is zeroed by *_init and otherwise left alone.
TEST(StructVersions, ANewerHeadersLargerStructIsAccepted) {
  const size_t bigger = sizeof(muon_options_t) + 16;
  Guarded buf(bigger);
  ASSERT_EQ(muon_options_init(buf.as<muon_options_t>(), bigger), MUON_OK)
      << muon_last_error_message();
  EXPECT_EQ(buf.FirstTouchedGuard(), -1);
  for (size_t i = sizeof(muon_options_t); i < bigger; ++i) EXPECT_EQ(buf.bytes[i], 0) << i;
  muon_optimizer_t* opt = nullptr;
  ASSERT_EQ(muon_create(buf.as<muon_options_t>(), &opt), MUON_OK) << muon_last_error_message();

  Guarded pbuf(sizeof(muon_param_options_t) + 8);
  ASSERT_EQ(muon_param_options_init(pbuf.as<muon_param_options_t>(), pbuf.size), MUON_OK);
  EXPECT_EQ(pbuf.FirstTouchedGuard(), -1);
  pbuf.as<muon_param_options_t>()->name = "w";
  Matrix m(4, 4, 0.3f, 0.7f);
  int64_t id = -1;
  ASSERT_EQ(muon_register_param(opt, &m.v, &m.g, pbuf.as<muon_param_options_t>(), &id), MUON_OK)
      << muon_last_error_message();

  Guarded sbuf(sizeof(muon_stats_t) + 8);
  ASSERT_EQ(muon_stats_init(sbuf.as<muon_stats_t>(), sbuf.size), MUON_OK);
  std::memset(sbuf.bytes.data() + sizeof(muon_stats_t), 0x11, 8);  // the newer fields
  ASSERT_EQ(muon_get_stats(opt, sbuf.as<muon_stats_t>()), MUON_OK);
  EXPECT_EQ(sbuf.FirstTouchedGuard(), -1);
  for (size_t i = sizeof(muon_stats_t); i < sbuf.size; ++i) EXPECT_EQ(sbuf.bytes[i], 0x11) << i;
  muon_destroy(opt);
}

}  // namespace
