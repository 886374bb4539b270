// The C API used wrongly, one entry point and one mistake per case, against
// the shipped libmuon.so. Every case is a row of one table (Cases() below):
// it runs on a fresh fixture and asserts
//   1. the muon_status_t the header documents,
//   2. the words of muon_last_error_message() that name the offending
//      argument, option, field or parameter,
//   3. that nothing changed: every out-parameter still holds its sentinel
//      bytes, the parameter count, step count, options, statistics and saved
//      state (momentum) are the same, no host tensor was written, and a valid
//      call that follows (a registration and a step) still works.
// The last line printed counts the cases by outcome. A case the library does
// not yet answer clearly would be marked as an expected failure (Case::
// known_failure): printed with its reason, never silently passed, and
// reported as a failure once it passes; none is marked at present.
//
// Not cases, because the header makes them well defined: in and out of
// muon_orthogonalize may differ in dtype; a NULL grad in muon_rebind_param
// without a world skips the parameter; SPLIT_SIZES reads exactly one size per
// group rank, so "not one size per rank" cannot be expressed through the C
// API (sizes that do not add up or are negative can, and are cases). The
// functions without a status (muon_destroy, muon_get_version, ...) are
// checked with NULL in DocumentedNoOps.
#include <dlpack/dlpack.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "libmuon/muon.h"
#include "gtest/gtest.h"

namespace {

constexpr unsigned char kSentinel = 0xA5;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kSlice = 64;  // floats per storage slice of the arena

DLDataType F32() { return {kDLFloat, 32, 1}; }
DLDataType BF16() { return {kDLBfloat, 16, 1}; }

// ---------------------------------------------------------------------------
// Out-parameters, every one pre-filled with sentinel bytes.
struct Outs {
  int64_t id;
  size_t count;
  size_t size;
  int64_t steps;
  int32_t group_id;
  muon_optimizer_t* opt;
  muon_inprocess_world_t* world;
  DLDataType dtype;
  muon_comm_t comm;
  muon_stats_t stats;
  muon_options_t options;
  muon_param_options_t param_options;
  unsigned char buffer[512];
};

// A communicator table whose callbacks are never reached (registration is
// not collective) and whose release is counted.
struct StubCtx {
  int released = 0;
};
muon_status_t StubAllGather(void*, const void*, void*, size_t, void*) { return MUON_UNAVAILABLE; }
muon_status_t StubAllToAllV(void*, const void*, const size_t*, const size_t*, void*, const size_t*,
                            const size_t*, void*) {
  return MUON_UNAVAILABLE;
}
muon_status_t StubReduceScatter(void*, const void*, void*, size_t, int32_t, void*) {
  return MUON_UNAVAILABLE;
}
void StubRelease(void* ctx) { ++static_cast<StubCtx*>(ctx)->released; }

// Custom-path callbacks, never reached either.
int32_t CustomAssign(void*, const char*, int32_t) { return 0; }
muon_status_t CustomGather(void*, const float*, int64_t, int32_t, muon_gathered_t*, void*) {
  return MUON_UNAVAILABLE;
}
muon_status_t CustomRedistribute(void*, const float*, int64_t, int64_t, int32_t, float*, int64_t,
                                 void*) {
  return MUON_UNAVAILABLE;
}

// What a case starts from.
enum class Setup {
  kEmpty,     // an optimizer, nothing registered
  kOneParam,  // param "w" (4x4 float32) registered, momentum set to a pattern
  kStepped,   // the same after one step (registration closed)
  kWorld1,    // an in-process world of one rank set as the world, nothing registered
  kWorld2,    // rank 0 of an in-process world of two set as the world (never stepped)
};

const char* SetupName(Setup s) {
  switch (s) {
    case Setup::kEmpty:
      return "empty";
    case Setup::kOneParam:
      return "one param";
    case Setup::kStepped:
      return "stepped";
    case Setup::kWorld1:
      return "world of 1";
    case Setup::kWorld2:
      return "world of 2";
  }
  return "?";
}

class Fixture {
 public:
  explicit Fixture(Setup setup) : arena(16 * kSlice), setup_(setup) {
    std::memset(&out, kSentinel, sizeof out);
    for (size_t i = 0; i < arena.size(); ++i) arena[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
    muon_options_t o;
    Expect(muon_options_init(&o, sizeof o), "muon_options_init");
    Expect(muon_create(&o, &opt), "muon_create");
    if (setup == Setup::kWorld1 || setup == Setup::kWorld2) {
      const int32_t n = setup == Setup::kWorld1 ? 1 : 2;
      Expect(muon_inprocess_world_create(n, &world), "muon_inprocess_world_create");
      muon_comm_t t;
      Expect(muon_inprocess_comm(world, nullptr, 0, 0, &t), "muon_inprocess_comm");
      Expect(muon_set_world(opt, &t, &world_group), "muon_set_world");
    }
    if (setup == Setup::kOneParam || setup == Setup::kStepped) {
      DLTensor p = Mat(W(), {4, 4}), g = Mat(GW(), {4, 4});
      muon_param_options_t po;
      Expect(muon_param_options_init(&po, sizeof po), "muon_param_options_init");
      po.name = "w";
      int64_t id = -1;
      Expect(muon_register_param(opt, &p, &g, &po, &id), "muon_register_param");
      has_w = true;
      std::vector<float> pattern(16);
      for (int i = 0; i < 16; ++i) pattern[i] = 0.5f - 0.03f * static_cast<float>(i);
      DLTensor m = Mat(pattern.data(), {4, 4});
      Expect(muon_set_state(opt, 0, &m), "muon_set_state");
    }
    if (setup == Setup::kStepped) Expect(muon_step(opt, nullptr), "muon_step");
  }

  ~Fixture() {
    // Whatever a case's call made when it unexpectedly succeeded.
    Outs fresh;
    std::memset(&fresh, kSentinel, sizeof fresh);
    if (std::memcmp(&out.opt, &fresh.opt, sizeof out.opt) != 0) muon_destroy(out.opt);
    if (std::memcmp(&out.comm, &fresh.comm, sizeof out.comm) != 0 && out.comm.release) {
      out.comm.release(out.comm.ctx);
    }
    if (table.release) table.release(table.ctx);
    muon_destroy(opt);
    for (muon_optimizer_t* o : others) muon_destroy(o);
    if (std::memcmp(&out.world, &fresh.world, sizeof out.world) != 0) {
      muon_inprocess_world_destroy(out.world);
    }
    muon_inprocess_world_destroy(world);
    muon_inprocess_world_destroy(spare_world);
  }

  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;

  Setup setup() const { return setup_; }

  // Storage slices of the arena (each kSlice floats).
  float* Slice(int i) { return arena.data() + i * kSlice; }
  float* W() { return Slice(0); }   // the registered param "w"
  float* GW() { return Slice(1); }  // its grad
  float* A() { return Slice(2); }   // a new param's storage
  float* GA() { return Slice(3); }  // its grad
  float* B() { return Slice(4); }
  float* GB() { return Slice(5); }
  float* Z() { return Slice(14); }  // the follow-up registration's
  float* GZ() { return Slice(15); }

  int64_t* Shape(std::vector<int64_t> s) {
    shapes.push_back(std::move(s));
    return shapes.back().empty() ? nullptr : shapes.back().data();
  }
  muon_placement_t* Placements(std::vector<muon_placement_t> p) {
    placements.push_back(std::move(p));
    return placements.back().data();
  }

  DLTensor Mat(void* data, std::vector<int64_t> shape, DLDataType dtype = F32()) {
    DLTensor t;
    std::memset(&t, 0, sizeof t);
    t.data = data;
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = Shape(std::move(shape));
    return t;
  }

  muon_param_options_t Named(const char* name) {
    muon_param_options_t po;
    muon_param_options_init(&po, sizeof po);
    po.name = name;
    return po;
  }

  muon_comm_t Stub(int32_t rank, int32_t size) {
    muon_comm_t c;
    std::memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.ctx = &stub;
    c.rank = rank;
    c.size = size;
    c.all_gather = StubAllGather;
    c.all_to_all_v = StubAllToAllV;
    c.reduce_scatter = StubReduceScatter;
    c.release = StubRelease;
    return c;
  }

  muon_custom_layout_t Layout(int64_t rows, int64_t cols) {
    muon_custom_layout_t l;
    std::memset(&l, 0, sizeof l);
    l.struct_size = sizeof l;
    l.global_rows = rows;
    l.global_cols = cols;
    l.assign_fn = CustomAssign;
    l.gather_fn = CustomGather;
    l.redistribute_fn = CustomRedistribute;
    return l;
  }

  // The whole state blob of `o`.
  std::vector<unsigned char> Save(muon_optimizer_t* o) {
    size_t n = 0;
    Expect(muon_save_state(o, nullptr, 0, &n), "muon_save_state");
    std::vector<unsigned char> b(n);
    Expect(muon_save_state(o, b.data(), b.size(), &n), "muon_save_state");
    return b;
  }

  // Another optimizer with `params` (name, shape, dtype) registered in order.
  muon_optimizer_t* Other(const std::vector<std::pair<const char*, std::vector<int64_t>>>& params,
                          DLDataType dtype = F32()) {
    muon_options_t o;
    muon_options_init(&o, sizeof o);
    muon_optimizer_t* other = nullptr;
    Expect(muon_create(&o, &other), "muon_create");
    others.push_back(other);
    for (const auto& p : params) {
      other_storage.emplace_back(kSlice * 2, 0.25f);
      float* s = other_storage.back().data();
      DLTensor v = Mat(s, p.second, dtype), g = Mat(s + kSlice, p.second, dtype);
      muon_param_options_t po = Named(p.first);
      int64_t id = -1;
      Expect(muon_register_param(other, &v, &g, &po, &id), "muon_register_param (other)");
    }
    return other;
  }

  // An in-process world of `n` ranks for the adapter's own checks.
  muon_inprocess_world_t* SpareWorld(int32_t n) {
    Expect(muon_inprocess_world_create(n, &spare_world), "muon_inprocess_world_create");
    return spare_world;
  }

  void Expect(muon_status_t st, const char* what) {
    if (st != MUON_OK) {
      setup_errors.push_back(std::string(what) +
                             " failed in the fixture: " + muon_last_error_message());
    }
  }

  muon_optimizer_t* opt = nullptr;
  muon_inprocess_world_t* world = nullptr;
  muon_inprocess_world_t* spare_world = nullptr;
  int32_t world_group = -1;
  bool has_w = false;
  std::vector<float> arena;
  std::vector<unsigned char> blob;  // a state blob a case edits
  muon_comm_t table{};              // an adapter table a case calls directly
  StubCtx stub;
  Outs out;
  std::vector<std::string> setup_errors;

 private:
  Setup setup_;
  std::deque<std::vector<int64_t>> shapes;
  std::deque<std::vector<muon_placement_t>> placements;
  std::vector<muon_optimizer_t*> others;
  std::deque<std::vector<float>> other_storage;
};

// ---------------------------------------------------------------------------
// What "nothing changed" compares.
struct Snapshot {
  size_t num_params = 0;
  int64_t steps = 0;
  muon_options_t options;
  muon_stats_t stats;
  std::vector<unsigned char> state;
  std::vector<float> arena;
  Outs out;
};

Snapshot Take(Fixture& f) {
  Snapshot s;
  std::memset(&s.options, 0, sizeof s.options);
  std::memset(&s.stats, 0, sizeof s.stats);
  muon_num_params(f.opt, &s.num_params);
  muon_step_count(f.opt, &s.steps);
  muon_options_init(&s.options, sizeof s.options);
  muon_get_options(f.opt, &s.options);
  muon_stats_init(&s.stats, sizeof s.stats);
  muon_get_stats(f.opt, &s.stats);
  s.state = f.Save(f.opt);
  s.arena = f.arena;
  std::memcpy(&s.out, &f.out, sizeof s.out);
  return s;
}

std::vector<std::string> Compare(const Snapshot& before, const Snapshot& after) {
  std::vector<std::string> diff;
  if (before.num_params != after.num_params) {
    diff.push_back("the parameter count changed from " + std::to_string(before.num_params) +
                   " to " + std::to_string(after.num_params));
  }
  if (before.steps != after.steps) diff.push_back("the step count changed");
  if (std::memcmp(&before.options, &after.options, sizeof before.options) != 0) {
    diff.push_back("the options changed");
  }
  if (std::memcmp(&before.stats, &after.stats, sizeof before.stats) != 0) {
    diff.push_back("the statistics changed");
  }
  if (before.state != after.state) diff.push_back("the saved state (momentum) changed");
  if (std::memcmp(before.arena.data(), after.arena.data(), before.arena.size() * sizeof(float)) !=
      0) {
    diff.push_back("a host tensor was written");
  }
  const unsigned char* b = reinterpret_cast<const unsigned char*>(&before.out);
  const unsigned char* a = reinterpret_cast<const unsigned char*>(&after.out);
  for (size_t i = 0; i < sizeof(Outs); ++i) {
    if (a[i] != b[i]) {
      diff.push_back("an out-parameter was written (byte " + std::to_string(i) + " of Outs)");
      break;
    }
  }
  return diff;
}

// A valid call after the misuse: a registration (while registration is
// open) and, where this rank can step alone, a step that updates "w".
std::vector<std::string> FollowUp(Fixture& f) {
  std::vector<std::string> problems;
  size_t before = 0;
  muon_num_params(f.opt, &before);
  if (f.setup() != Setup::kStepped) {
    DLTensor p = f.Mat(f.Z(), {4, 4}), g = f.Mat(f.GZ(), {4, 4});
    muon_param_options_t po = f.Named("valid_after_misuse");
    int64_t id = -1;
    if (muon_register_param(f.opt, &p, &g, &po, &id) != MUON_OK) {
      problems.push_back(std::string("a valid registration then fails: ") +
                         muon_last_error_message());
    } else if (id != static_cast<int64_t>(before)) {
      problems.push_back("a valid registration then gets id " + std::to_string(id) + ", expected " +
                         std::to_string(before));
    }
  }
  if (f.setup() == Setup::kWorld2) return problems;  // rank 1 never steps
  int64_t steps = -1;
  muon_step_count(f.opt, &steps);
  const std::vector<float> w(f.W(), f.W() + 16);
  if (muon_step(f.opt, nullptr) != MUON_OK) {
    problems.push_back(std::string("a valid step then fails: ") + muon_last_error_message());
    return problems;
  }
  int64_t after = -1;
  muon_step_count(f.opt, &after);
  if (after != steps + 1) problems.push_back("the step count did not advance");
  if (f.has_w && std::memcmp(w.data(), f.W(), sizeof(float) * 16) == 0) {
    problems.push_back("the step did not update param 'w' in its registered storage");
  }
  return problems;
}

// ---------------------------------------------------------------------------
using Call = std::function<muon_status_t(Fixture&)>;
using Prepare = std::function<void(Fixture&)>;
using Verify = std::function<std::vector<std::string>(Fixture&)>;

struct Case {
  std::string name;
  Setup setup;
  muon_status_t expected;
  std::vector<std::string> words;
  Call call;
  Prepare prepare;                      // optional, before the snapshot
  Verify verify;                        // optional, extra checks after the call
  const char* known_failure = nullptr;  // the reason, for an expected failure
};

// Registers param "x" from storage A/GA (4x4 float32) after `edit`.
using RegisterEdit =
    std::function<void(Fixture&, DLTensor& p, DLTensor& g, muon_param_options_t& o)>;
Call RegisterWith(RegisterEdit edit) {
  return [edit](Fixture& f) {
    DLTensor p = f.Mat(f.A(), {4, 4}), g = f.Mat(f.GA(), {4, 4});
    muon_param_options_t o = f.Named("x");
    edit(f, p, g, o);
    return muon_register_param(f.opt, &p, &g, &o, &f.out.id);
  };
}

// A 2-D global shape and placements for param "x" (its local tensor `local`).
RegisterEdit Placed(std::vector<int64_t> global, std::vector<muon_placement_t> placements,
                    std::vector<int64_t> local = {4, 4}) {
  return
      [global, placements, local](Fixture& f, DLTensor& p, DLTensor& g, muon_param_options_t& o) {
        p = f.Mat(f.A(), local);
        g = f.Mat(f.GA(), local);
        o.global_ndim = static_cast<int32_t>(global.size());
        o.global_shape = f.Shape(global);
        o.num_placements = static_cast<int32_t>(placements.size());
        o.placements = placements.empty() ? nullptr : f.Placements(placements);
      };
}

muon_placement_t Shard(int32_t group, int32_t dim, int32_t split = MUON_SPLIT_EVEN,
                       const int64_t* sizes = nullptr) {
  muon_placement_t p;
  std::memset(&p, 0, sizeof p);
  p.kind = MUON_PLACEMENT_SHARD;
  p.group = group;
  p.dim = dim;
  p.split = split;
  p.sizes = sizes;
  return p;
}
muon_placement_t FlatRange(int32_t group, int64_t start, int64_t length) {
  muon_placement_t p;
  std::memset(&p, 0, sizeof p);
  p.kind = MUON_PLACEMENT_FLAT_RANGE;
  p.group = group;
  p.start = start;
  p.length = length;
  return p;
}
// A placement of an unknown kind (otherwise a shard of dim 0 over the world).
muon_placement_t OfKind(int32_t kind) {
  muon_placement_t p = Shard(0, 0);
  p.kind = kind;
  return p;
}
muon_placement_t Replicate(int32_t group) {
  muon_placement_t p;
  std::memset(&p, 0, sizeof p);
  p.kind = MUON_PLACEMENT_REPLICATE;
  p.group = group;
  return p;
}

// muon_create with default options after `edit`.
Call CreateWith(std::function<void(muon_options_t&)> edit) {
  return [edit](Fixture& f) {
    muon_options_t o;
    muon_options_init(&o, sizeof o);
    edit(o);
    return muon_create(&o, &f.out.opt);
  };
}

// Loads f.blob after `edit` (f.blob starts as f.opt's own saved state).
Call LoadEdited(std::function<void(std::vector<unsigned char>&)> edit) {
  return [edit](Fixture& f) {
    if (f.blob.empty()) f.blob = f.Save(f.opt);
    edit(f.blob);
    return muon_load_state(f.opt, f.blob.data(), f.blob.size());
  };
}

template <typename T>
void Poke(std::vector<unsigned char>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

// Offsets in the blob of one 4x4 float32 param named "w" (checkpoint format 2).
constexpr size_t kMagicEnd = 8, kFormatAt = 8, kReservedAt = 12, kStepAt = 16, kCountAt = 24,
                 kNameLenAt = 32, kNameAt = 36, kDtypeAt = 37, kViewAt = 38, kKindAt = 39,
                 kPadAt = 40, kNdimAt = 41, kDimsAt = 45, kGlobalNdimAt = 61,
                 kGlobalDimsAt = 65, kRunCountAt = 81, kRunAt = 89, kNbytesAt = 105,
                 kMomentumAt = 113, kBlobEnd = 177;

// Runs that are each right on their own but wrong together: the blob's one
// run of "w" made [0, +first) and followed by [offset, +length), of a global
// shape [rows, 4], with `elements` momentum values (new ones, none the
// optimizer's) and the step count 7, so that a blob loaded despite its runs
// shows in the state.
std::function<void(std::vector<unsigned char>&)> TwoRuns(int64_t rows, int64_t first,
                                                         int64_t offset, int64_t length,
                                                         uint64_t elements) {
  return [=](std::vector<unsigned char>& b) {
    Poke<int64_t>(b, kStepAt, 7);
    Poke<int64_t>(b, kGlobalDimsAt, rows);
    Poke<uint64_t>(b, kRunCountAt, 2);
    Poke<int64_t>(b, kRunAt + 8, first);
    b.resize(kNbytesAt + 16 + 8 + 4 * elements);  // a second run, the byte count, the bytes
    Poke<int64_t>(b, kNbytesAt, offset);
    Poke<int64_t>(b, kNbytesAt + 8, length);
    Poke<uint64_t>(b, kNbytesAt + 16, 4 * elements);
    for (uint64_t i = 0; i < elements; ++i) {
      Poke<float>(b, kMomentumAt + 16 + 4 * i, 0.25f + static_cast<float>(i));
    }
  };
}

// muon_load_states of f.opt's own blob after `edit`, as the only blob.
Call LoadStatesEdited(std::function<void(std::vector<unsigned char>&)> edit) {
  return [edit](Fixture& f) {
    if (f.blob.empty()) f.blob = f.Save(f.opt);
    edit(f.blob);
    const void* b[1] = {f.blob.data()};
    size_t n[1] = {f.blob.size()};
    return muon_load_states(f.opt, b, n, 1);
  };
}

// A tensor whose device code is `code`, whatever DLDeviceType lists.
void SetDeviceCode(DLTensor& t, int32_t code) {
  static_assert(sizeof t.device.device_type == sizeof code, "32-bit device code");
  std::memcpy(&t.device.device_type, &code, sizeof code);
}

// The state tensor cases: `edit` spoils a 4x4 float32 host tensor on slice B.
Call StateWith(bool set, std::function<void(Fixture&, DLTensor&)> edit, int64_t id = 0) {
  return [set, edit, id](Fixture& f) {
    DLTensor t = f.Mat(f.B(), {4, 4});
    edit(f, t);
    return set ? muon_set_state(f.opt, id, &t) : muon_get_state(f.opt, id, &t);
  };
}

// muon_orthogonalize of A into B (4x4 float32, host) after `edit`.
Call OrthoWith(std::function<void(Fixture&, DLTensor& in, DLTensor& out, int32_t& view)> edit) {
  return [edit](Fixture& f) {
    DLTensor in = f.Mat(f.A(), {4, 4}), out = f.Mat(f.B(), {4, 4});
    int32_t view = MUON_MATRIX_VIEW_2D;
    edit(f, in, out, view);
    return muon_orthogonalize(f.opt, &in, &out, view, nullptr);
  };
}

// A table whose struct_size is refused is not read at all: its release
// does not run (the host still owns it).
Verify NotReleased() {
  return [](Fixture& f) {
    std::vector<std::string> p;
    if (f.stub.released != 0) {
      p.push_back("the release of a table of a refused struct_size ran " +
                  std::to_string(f.stub.released) + " times, expected never");
    }
    return p;
  };
}

Verify ReleasedOnce() {
  return [](Fixture& f) {
    std::vector<std::string> p;
    if (f.stub.released != 1) {
      p.push_back("the table's release ran " + std::to_string(f.stub.released) +
                  " times, expected once");
    }
    return p;
  };
}

// Prepares f.table: world rank 0's communicator of an in-process world of one.
void InProcessTable(Fixture& f) {
  f.Expect(muon_inprocess_comm(f.SpareWorld(1), nullptr, 0, 0, &f.table), "muon_inprocess_comm");
}

std::vector<Case> Cases() {
  std::vector<Case> t;
  auto add = [&t](std::string name, Setup setup, muon_status_t expected,
                  std::vector<std::string> words, Call call) -> Case& {
    t.push_back(Case{std::move(name), setup, expected, std::move(words), std::move(call)});
    return t.back();
  };
  const Setup E = Setup::kEmpty, P = Setup::kOneParam, S = Setup::kStepped, W1 = Setup::kWorld1,
              W2 = Setup::kWorld2;
  const muon_status_t IA = MUON_INVALID_ARGUMENT, FP = MUON_FAILED_PRECONDITION,
                      NF = MUON_NOT_FOUND;

  // ---- *_init of the extensible structs ----
  add("options_init_null", E, IA, {"muon_options_init", "options is NULL"},
      [](Fixture&) { return muon_options_init(nullptr, sizeof(muon_options_t)); });
  add("options_init_size_zero", E, IA, {"options->struct_size is 0"},
      [](Fixture& f) { return muon_options_init(&f.out.options, 0); });
  add("options_init_size_too_small", E, IA, {"options->struct_size is 16", "smallest"},
      [](Fixture& f) { return muon_options_init(&f.out.options, 16); });
  add("param_options_init_null", E, IA, {"muon_param_options_init", "options is NULL"},
      [](Fixture&) { return muon_param_options_init(nullptr, sizeof(muon_param_options_t)); });
  add("param_options_init_size_zero", E, IA, {"options->struct_size is 0"},
      [](Fixture& f) { return muon_param_options_init(&f.out.param_options, 0); });
  add("param_options_init_size_too_small", E, IA, {"options->struct_size is 16"},
      [](Fixture& f) { return muon_param_options_init(&f.out.param_options, 16); });
  add("stats_init_null", E, IA, {"muon_stats_init", "stats is NULL"},
      [](Fixture&) { return muon_stats_init(nullptr, sizeof(muon_stats_t)); });
  add("stats_init_size_zero", E, IA, {"stats->struct_size is 0"},
      [](Fixture& f) { return muon_stats_init(&f.out.stats, 0); });
  add("stats_init_size_too_small", E, IA, {"stats->struct_size is 16"},
      [](Fixture& f) { return muon_stats_init(&f.out.stats, 16); });

  // ---- muon_create: pointers, struct_size, every option ----
  add("create_null_options", E, IA, {"muon_create", "options is NULL"},
      [](Fixture& f) { return muon_create(nullptr, &f.out.opt); });
  add("create_null_out", E, IA, {"muon_create", "out is NULL"}, [](Fixture&) {
    muon_options_t o;
    muon_options_init(&o, sizeof o);
    return muon_create(&o, nullptr);
  });
  add("create_struct_size_zero", E, IA, {"options->struct_size is 0"},
      CreateWith([](muon_options_t& o) { o.struct_size = 0; }));
  add("create_struct_size_too_small", E, IA, {"options->struct_size is 16"},
      CreateWith([](muon_options_t& o) { o.struct_size = 16; }));
  add("create_lr_negative", E, IA, {"options->lr", "-0.5"},
      CreateWith([](muon_options_t& o) { o.lr = -0.5; }));
  add("create_lr_nan", E, IA, {"options->lr", "nan"},
      CreateWith([](muon_options_t& o) { o.lr = kNaN; }));
  add("create_lr_inf", E, IA, {"options->lr", "inf"},
      CreateWith([](muon_options_t& o) { o.lr = kInf; }));
  add("create_weight_decay_negative", E, IA, {"options->weight_decay", "-0.1"},
      CreateWith([](muon_options_t& o) { o.weight_decay = -0.1; }));
  add("create_weight_decay_nan", E, IA, {"options->weight_decay", "nan"},
      CreateWith([](muon_options_t& o) { o.weight_decay = kNaN; }));
  add("create_weight_decay_inf", E, IA, {"options->weight_decay", "inf"},
      CreateWith([](muon_options_t& o) { o.weight_decay = kInf; }));
  add("create_momentum_one", E, IA, {"options->momentum", "[0, 1)"},
      CreateWith([](muon_options_t& o) { o.momentum = 1.0; }));
  add("create_momentum_negative", E, IA, {"options->momentum", "-0.25"},
      CreateWith([](muon_options_t& o) { o.momentum = -0.25; }));
  add("create_momentum_nan", E, IA, {"options->momentum", "nan"},
      CreateWith([](muon_options_t& o) { o.momentum = kNaN; }));
  add("create_ns_steps_negative", E, IA, {"options->ns_steps", "-1"},
      CreateWith([](muon_options_t& o) { o.ns_steps = -1; }));
  add("create_ns_steps_100", E, IA, {"options->ns_steps", "100"},
      CreateWith([](muon_options_t& o) { o.ns_steps = 100; }));
  add("create_eps_zero", E, IA, {"options->eps", "0"},
      CreateWith([](muon_options_t& o) { o.eps = 0; }));
  add("create_eps_negative", E, IA, {"options->eps", "-1e-07"},
      CreateWith([](muon_options_t& o) { o.eps = -1e-7; }));
  add("create_eps_inf", E, IA, {"options->eps", "inf"},
      CreateWith([](muon_options_t& o) { o.eps = kInf; }));
  add("create_ns_a_nan", E, IA, {"options->ns_a", "nan"},
      CreateWith([](muon_options_t& o) { o.ns_a = kNaN; }));
  add("create_ns_c_inf", E, IA, {"options->ns_c", "inf"},
      CreateWith([](muon_options_t& o) { o.ns_c = kInf; }));
  add("create_ns_coefficients_unknown", E, IA,
      {"options->ns_coefficients", "unknown value 7", "POLAR_EXPRESS"},
      CreateWith([](muon_options_t& o) { o.ns_coefficients = 7; }));
  add("create_update_scale_negative", E, IA,
      {"options->update_scale: -1 is invalid", "finite number >= 0"},
      CreateWith([](muon_options_t& o) { o.update_scale = -1; }));
  add("create_update_scale_nan", E, IA, {"options->update_scale", "nan"},
      CreateWith([](muon_options_t& o) { o.update_scale = std::nan(""); }));
  add("create_normuon_beta2_negative", E, IA,
      {"options->normuon_beta2: -0.5 is invalid", "[0, 1)"},
      CreateWith([](muon_options_t& o) { o.normuon = 1; o.normuon_beta2 = -0.5; }));
  add("create_normuon_beta2_one", E, IA, {"options->normuon_beta2: 1 is invalid"},
      CreateWith([](muon_options_t& o) { o.normuon = 1; o.normuon_beta2 = 1; }));
  add("create_normuon_eps_zero", E, IA, {"options->normuon_eps: 0 is invalid", "> 0"},
      CreateWith([](muon_options_t& o) { o.normuon = 1; o.normuon_eps = 0; }));
  add("create_reserved3", E, IA, {"options->reserved3 is 1; it must be 0"},
      CreateWith([](muon_options_t& o) { o.reserved3 = 1; }));
  add("create_cubic5_with_4_steps", E, IA,
      {"options->ns_steps is 4", "CUBIC5 is a 5-iteration schedule", "set ns_steps = 5"},
      CreateWith([](muon_options_t& o) {
        o.ns_coefficients = MUON_NS_COEFFICIENTS_CUBIC5;
        o.ns_steps = 4;
      }));
  add("create_aol_with_5_steps", E, IA,
      {"options->ns_steps is 5", "AOL is a 4-iteration schedule", "set ns_steps = 4"},
      CreateWith([](muon_options_t& o) { o.ns_coefficients = MUON_NS_COEFFICIENTS_AOL; }));
  add("create_aol_gram", E, IA, {"ns_algorithm", "GRAM does not run the AOL schedule"},
      CreateWith([](muon_options_t& o) {
        o.ns_coefficients = MUON_NS_COEFFICIENTS_AOL;
        o.ns_steps = 4;
        o.ns_algorithm = MUON_NS_GRAM;
      }));
  add("create_deepseek_v4_with_5_steps", E, IA,
      {"options->ns_steps is 5", "DEEPSEEK_V4 is a 10-iteration schedule", "ns_steps = 10"},
      CreateWith([](muon_options_t& o) { o.ns_coefficients = MUON_NS_COEFFICIENTS_DEEPSEEK_V4; }));
  add("create_ns_coefficients_negative", E, IA, {"options->ns_coefficients", "-1"},
      CreateWith([](muon_options_t& o) { o.ns_coefficients = -1; }));
  add("create_ns_table_null", E, IA, {"options->ns_table", "NULL"},
      CreateWith([](muon_options_t& o) {
        o.ns_coefficients = MUON_NS_COEFFICIENTS_TABLE;
        o.ns_table_rows = 2;
        o.ns_table = nullptr;
      }));
  add("create_ns_table_rows_zero", E, IA, {"options->ns_table_rows is 0"},
      CreateWith([](muon_options_t& o) {
        static const double table[3] = {3.4445, -4.775, 2.0315};
        o.ns_coefficients = MUON_NS_COEFFICIENTS_TABLE;
        o.ns_table_rows = 0;
        o.ns_table = table;
      }));
  add("create_ns_table_rows_negative", E, IA, {"options->ns_table_rows is -3"},
      CreateWith([](muon_options_t& o) {
        static const double table[3] = {3.4445, -4.775, 2.0315};
        o.ns_coefficients = MUON_NS_COEFFICIENTS_TABLE;
        o.ns_table_rows = -3;
        o.ns_table = table;
      }));
  add("create_ns_table_row_not_finite", E, IA, {"options->ns_table", "row 1", "inf"},
      CreateWith([](muon_options_t& o) {
        static const double table[6] = {3.4445, -4.775, 2.0315, 3.0, kInf, 1.0};
        o.ns_coefficients = MUON_NS_COEFFICIENTS_TABLE;
        o.ns_table_rows = 2;
        o.ns_table = table;
      }));
  add("create_adjust_lr_unknown", E, IA,
      {"options->adjust_lr", "unknown value 5", "SPECTRAL (4)"},
      CreateWith([](muon_options_t& o) { o.adjust_lr = 5; }));
  add("create_adjust_lr_negative", E, IA, {"options->adjust_lr", "unknown value -1"},
      CreateWith([](muon_options_t& o) { o.adjust_lr = -1; }));
  add("create_ns_dtype_unknown", E, IA, {"options->ns_dtype", "unknown value 3", "FP16 (2)"},
      CreateWith([](muon_options_t& o) { o.ns_dtype = 3; }));
  add("create_ns_dtype_negative", E, IA, {"options->ns_dtype", "unknown value -1"},
      CreateWith([](muon_options_t& o) { o.ns_dtype = -1; }));
  add("create_ns_algorithm_unknown", E, IA, {"options->ns_algorithm", "unknown value 2",
                                             "MUON_NS_GRAM (1)"},
      CreateWith([](muon_options_t& o) { o.ns_algorithm = 2; }));
  add("create_assignment_unknown", E, IA, {"options->assignment", "unknown value 5"},
      CreateWith([](muon_options_t& o) { o.assignment = 5; }));
  add("create_assignment_negative", E, IA, {"options->assignment", "unknown value -1"},
      CreateWith([](muon_options_t& o) { o.assignment = -1; }));
  add("create_assignment_custom_without_fn", E, IA, {"options->assign_fn", "CUSTOM"},
      CreateWith([](muon_options_t& o) {
        o.assignment = MUON_ASSIGNMENT_CUSTOM;
        o.assign_fn = nullptr;
      }));
  add("create_prefetch_count_negative", E, IA, {"options->prefetch_count", "-1"},
      CreateWith([](muon_options_t& o) { o.prefetch_count = -1; }));
  add("create_prefetch_count_too_large", E, IA, {"options->prefetch_count", "65"},
      CreateWith([](muon_options_t& o) { o.prefetch_count = 65; }));
  add("create_round_bytes_too_large", E, IA, {"options->round_bytes", "18446744073709551615"},
      CreateWith([](muon_options_t& o) { o.round_bytes = SIZE_MAX; }));
  add("create_reserved0_nonzero", E, IA, {"options->reserved0", "1"},
      CreateWith([](muon_options_t& o) { o.reserved0 = 1; }));
  add("create_reserved1_nonzero", E, IA, {"options->reserved1", "2"},
      CreateWith([](muon_options_t& o) { o.reserved1 = 2; }));
  add("create_reserved2_nonzero", E, IA, {"options->reserved2 is 3", "must be 0"},
      CreateWith([](muon_options_t& o) { o.reserved2 = 3; }));

  // ---- muon_get_options and the setters ----
  add("get_options_null_opt", P, IA, {"muon_get_options", "opt is NULL"},
      [](Fixture& f) { return muon_get_options(nullptr, &f.out.options); });
  add("get_options_null_out", P, IA, {"muon_get_options", "out is NULL"},
      [](Fixture& f) { return muon_get_options(f.opt, nullptr); });
  add("get_options_size_zero", P, IA, {"out->struct_size is 0"}, [](Fixture& f) {
    return muon_get_options(f.opt, &f.out.options);
  }).prepare = [](Fixture& f) { f.out.options.struct_size = 0; };
  add("get_options_size_too_small", P, IA, {"out->struct_size is 24"}, [](Fixture& f) {
    return muon_get_options(f.opt, &f.out.options);
  }).prepare = [](Fixture& f) { f.out.options.struct_size = 24; };
  add("set_lr_null_opt", P, IA, {"muon_set_lr", "opt is NULL"},
      [](Fixture&) { return muon_set_lr(nullptr, 0.1); });
  add("set_lr_negative", P, IA, {"muon_set_lr", "lr", "-1"},
      [](Fixture& f) { return muon_set_lr(f.opt, -1.0); });
  add("set_lr_nan", P, IA, {"lr", "nan"}, [](Fixture& f) { return muon_set_lr(f.opt, kNaN); });
  add("set_lr_inf", P, IA, {"lr", "inf"}, [](Fixture& f) { return muon_set_lr(f.opt, kInf); });
  add("set_lr_minus_inf", P, IA, {"lr", "-inf"},
      [](Fixture& f) { return muon_set_lr(f.opt, -kInf); });
  add("set_weight_decay_null_opt", P, IA, {"muon_set_weight_decay", "opt is NULL"},
      [](Fixture&) { return muon_set_weight_decay(nullptr, 0.1); });
  add("set_weight_decay_negative", P, IA, {"weight_decay", "-0.001"},
      [](Fixture& f) { return muon_set_weight_decay(f.opt, -1e-3); });
  add("set_weight_decay_nan", P, IA, {"weight_decay", "nan"},
      [](Fixture& f) { return muon_set_weight_decay(f.opt, kNaN); });
  add("set_weight_decay_inf", P, IA, {"weight_decay", "inf"},
      [](Fixture& f) { return muon_set_weight_decay(f.opt, kInf); });
  add("set_momentum_null_opt", P, IA, {"muon_set_momentum", "opt is NULL"},
      [](Fixture&) { return muon_set_momentum(nullptr, 0.5); });
  add("set_momentum_one", P, IA, {"momentum", "1", "[0, 1)"},
      [](Fixture& f) { return muon_set_momentum(f.opt, 1.0); });
  add("set_momentum_above_one", P, IA, {"momentum", "1.5"},
      [](Fixture& f) { return muon_set_momentum(f.opt, 1.5); });
  add("set_momentum_negative", P, IA, {"momentum", "-0.01"},
      [](Fixture& f) { return muon_set_momentum(f.opt, -0.01); });
  add("set_momentum_nan", P, IA, {"momentum", "nan"},
      [](Fixture& f) { return muon_set_momentum(f.opt, kNaN); });
  add("push_hyperparameters_null_opt", P, IA, {"muon_push_hyperparameters", "opt is NULL"},
      [](Fixture&) { return muon_push_hyperparameters(nullptr, nullptr); });

  // ---- muon_register_param: pointers ----
  add("register_null_opt", P, IA, {"muon_register_param", "opt is NULL"}, [](Fixture& f) {
    DLTensor p = f.Mat(f.A(), {4, 4}), g = f.Mat(f.GA(), {4, 4});
    return muon_register_param(nullptr, &p, &g, nullptr, &f.out.id);
  });
  add("register_null_param_id", P, IA, {"muon_register_param", "param_id is NULL"}, [](Fixture& f) {
    DLTensor p = f.Mat(f.A(), {4, 4}), g = f.Mat(f.GA(), {4, 4});
    return muon_register_param(f.opt, &p, &g, nullptr, nullptr);
  });
  add("register_null_param", P, IA, {"param 'x'", "DLTensor pointer is NULL"}, [](Fixture& f) {
    DLTensor g = f.Mat(f.GA(), {4, 4});
    muon_param_options_t o = f.Named("x");
    return muon_register_param(f.opt, nullptr, &g, &o, &f.out.id);
  });
  add("register_null_grad", P, IA, {"grad of param 'x'", "DLTensor pointer is NULL"},
      [](Fixture& f) {
        DLTensor p = f.Mat(f.A(), {4, 4});
        muon_param_options_t o = f.Named("x");
        return muon_register_param(f.opt, &p, nullptr, &o, &f.out.id);
      });
  // ---- per-parameter multipliers ----
  add("register_lr_scale_negative", P, IA, {"options->lr_scale: -0.5 is invalid", ">= 0"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.lr_scale = -0.5;
      }));
  add("register_weight_decay_scale_nan", P, IA, {"options->weight_decay_scale: nan"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.weight_decay_scale = std::nan("");
      }));
  // ---- split blocks (x is 4 x 4) ----
  add("register_split_sizes_not_dividing", P, IA,
      {"param 'x'", "split_sizes {3} add up to 3", "does not divide the 4 rows"},
      RegisterWith([](Fixture& f, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.num_split_sizes = 1;
        o.split_sizes = f.Shape({3});
      }));
  add("register_split_size_zero", P, IA, {"param 'x'", "split_sizes[1] is 0"},
      RegisterWith([](Fixture& f, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.num_split_sizes = 2;
        o.split_sizes = f.Shape({2, 0});
      }));
  add("register_split_dim_2", P, IA, {"param 'x'", "split_dim 2 is invalid"},
      RegisterWith([](Fixture& f, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.split_dim = 2;
        o.num_split_sizes = 1;
        o.split_sizes = f.Shape({2});
      }));
  add("register_split_sizes_null", P, IA, {"options->num_split_sizes: 2 is invalid"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.num_split_sizes = 2;
      }));
  add("register_split_dim_without_sizes", P, IA,
      {"options->split_dim: 1 is set but no split_sizes are given"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.split_dim = 1;
      }));
  // ---- tensors ----
  add("register_null_data", P, IA, {"param 'x'", "data pointer is NULL"},
      RegisterWith(
          [](Fixture&, DLTensor& p, DLTensor&, muon_param_options_t&) { p.data = nullptr; }));
  add("register_null_grad_data", P, IA, {"grad of param 'x'", "data pointer is NULL"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor& g, muon_param_options_t&) { g.data = nullptr; }));
  add("register_null_data_with_byte_offset", P, IA,
      {"param 'x'", "data pointer is NULL with byte_offset 16"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor& g, muon_param_options_t&) {
        p = f.Mat(nullptr, {0, 4});
        p.byte_offset = 16;
        g = f.Mat(f.GA(), {0, 4});
      }));
  add("register_null_shape", P, IA, {"param 'x'", "shape pointer is NULL"},
      RegisterWith(
          [](Fixture&, DLTensor& p, DLTensor&, muon_param_options_t&) { p.shape = nullptr; }));
  add("register_negative_dim", P, IA, {"param 'x'", "dimension 1 has negative size -4"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor&, muon_param_options_t&) {
        p.shape = f.Shape({4, -4});
      }));
  add("register_ndim_negative", P, IA, {"param 'x'", "ndim -1 is out of range"},
      RegisterWith([](Fixture&, DLTensor& p, DLTensor&, muon_param_options_t&) { p.ndim = -1; }));
  add("register_ndim_too_large", P, IA, {"param 'x'", "ndim 17 is out of range"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor&, muon_param_options_t&) {
        p.ndim = 17;
        p.shape = f.Shape(std::vector<int64_t>(17, 1));
      }));
  add("register_dtype_int32", P, IA, {"param 'x'", "unsupported dtype", "code 0, bits 32"},
      RegisterWith([](Fixture&, DLTensor& p, DLTensor& g, muon_param_options_t&) {
        p.dtype = g.dtype = DLDataType{kDLInt, 32, 1};
      }));
  add("register_dtype_float64", P, IA, {"param 'x'", "unsupported dtype", "bits 64"},
      RegisterWith([](Fixture&, DLTensor& p, DLTensor& g, muon_param_options_t&) {
        p.dtype = g.dtype = DLDataType{kDLFloat, 64, 1};
      }));
  add("register_dtype_lanes_2", P, IA, {"param 'x'", "unsupported dtype", "lanes 2"},
      RegisterWith([](Fixture&, DLTensor& p, DLTensor& g, muon_param_options_t&) {
        p.dtype = g.dtype = DLDataType{kDLFloat, 32, 2};
      }));
  add("register_grad_dtype_int32", P, IA, {"grad of param 'x'", "unsupported dtype"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor& g, muon_param_options_t&) {
        g.dtype = DLDataType{kDLInt, 32, 1};
      }));
  add("register_strides_transposed", P, IA,
      {"param 'x'", "strides [1, 4]", "not row-major contiguous"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor&, muon_param_options_t&) {
        p.strides = f.Shape({1, 4});
      }));
  add("register_grad_strides_padded", P, IA, {"grad of param 'x'", "strides [8, 1]"},
      RegisterWith([](Fixture& f, DLTensor&, DLTensor& g, muon_param_options_t&) {
        g.strides = f.Shape({8, 1});
      }));
  add("register_device_code_12345", P, IA, {"param 'x'", "DLPack device type 12345"},
      RegisterWith([](Fixture&, DLTensor& p, DLTensor&, muon_param_options_t&) {
        SetDeviceCode(p, 12345);
      }));
  add("register_device_opencl", P, IA, {"param 'x'", "DLPack device type 4"},
      RegisterWith([](Fixture&, DLTensor& p, DLTensor& g, muon_param_options_t&) {
        p.device.device_type = g.device.device_type = kDLOpenCL;
      }));
  add("register_grad_device_code_negative", P, IA, {"grad of param 'x'", "device type -2"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor& g, muon_param_options_t&) { SetDeviceCode(g, -2); }));
  add("register_cuda_ordinal_negative", P, IA, {"param 'x'", "CUDA device ordinal -1"},
      RegisterWith([](Fixture&, DLTensor& p, DLTensor& g, muon_param_options_t&) {
        p.device = g.device = DLDevice{kDLCUDA, -1};
      }));
  add("register_grad_on_other_device", P, IA, {"param 'x'", "grad is on cuda:0, param on cpu"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor& g, muon_param_options_t&) {
        g.device = DLDevice{kDLCUDA, 0};
      }));
  add("register_byte_size_overflows", P, IA,
      {"param 'x'", "shape [2147483648, 2147483648]", "64-bit"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor& g, muon_param_options_t&) {
        p.shape = g.shape = f.Shape({int64_t{1} << 31, int64_t{1} << 31});
      }));
  add("register_element_count_overflows", P, IA,
      {"param 'x'", "shape [4294967296, 4294967296]", "too many elements"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor& g, muon_param_options_t&) {
        p.shape = g.shape = f.Shape({int64_t{1} << 32, int64_t{1} << 32});
      }));
  add("register_grad_shape_mismatch", P, IA,
      {"param 'x'", "grad shape [4, 2]", "param shape [4, 4]"},
      RegisterWith([](Fixture& f, DLTensor&, DLTensor& g, muon_param_options_t&) {
        g.shape = f.Shape({4, 2});
      }));
  add("register_grad_dtype_mismatch", P, IA,
      {"param 'x'", "grad dtype bfloat16", "param dtype float32"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor& g, muon_param_options_t&) { g.dtype = BF16(); }));
  // ---- storage, names, order ----
  add("register_same_storage_as_w", P, IA,
      {"param 'x'", "param storage overlaps the param of param 'w'"},
      RegisterWith(
          [](Fixture& f, DLTensor& p, DLTensor&, muon_param_options_t&) { p.data = f.W(); }));
  add("register_grad_overlaps_grad_of_w", P, IA,
      {"param 'x'", "grad storage overlaps the grad of param 'w'"},
      RegisterWith(
          [](Fixture& f, DLTensor&, DLTensor& g, muon_param_options_t&) { g.data = f.GW() + 8; }));
  add("register_grad_is_param_of_w", P, IA,
      {"param 'x'", "grad storage overlaps the param of param 'w'"},
      RegisterWith(
          [](Fixture& f, DLTensor&, DLTensor& g, muon_param_options_t&) { g.data = f.W(); }));
  add("register_param_and_grad_share_storage", P, IA, {"param 'x'", "param and grad share storage"},
      RegisterWith(
          [](Fixture& f, DLTensor&, DLTensor& g, muon_param_options_t&) { g.data = f.A() + 4; }));
  add("register_name_twice", P, MUON_ALREADY_EXISTS, {"param 'w'", "name is registered"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) { o.name = "w"; }));
  add("register_default_name_taken", P, MUON_ALREADY_EXISTS,
      {"param 'param2'", "name is registered"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.name = nullptr;  // its default name, "param2" (id 2), is taken below
      }))
      .prepare = [](Fixture& f) {
    DLTensor p = f.Mat(f.B(), {4, 4}), g = f.Mat(f.GB(), {4, 4});
    muon_param_options_t o = f.Named("param2");
    int64_t id = -1;
    f.Expect(muon_register_param(f.opt, &p, &g, &o, &id), "register param2");
  };
  add("register_after_first_step", S, FP, {"param 'x'", "registration is closed"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor&, muon_param_options_t&) {}));
  // ---- shapes and matrix views ----
  add("register_0d", P, IA, {"param 'x'", "0 dimension(s)", "AdamW"},
      RegisterWith([](Fixture&, DLTensor& p, DLTensor& g, muon_param_options_t&) {
        p.ndim = g.ndim = 0;
        p.shape = g.shape = nullptr;
      }));
  add("register_1d", P, IA, {"param 'x'", "1 dimension(s) [16]", "AdamW"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor& g, muon_param_options_t&) {
        p = f.Mat(f.A(), {16});
        g = f.Mat(f.GA(), {16});
      }));
  add("register_3d_without_view", P, IA,
      {"param 'x'", "[2, 4, 2]", "FLATTEN_TRAILING", "BATCHED_LEADING"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor& g, muon_param_options_t&) {
        p = f.Mat(f.A(), {2, 4, 2});
        g = f.Mat(f.GA(), {2, 4, 2});
      }));
  add("register_batched_leading_on_2d", P, IA,
      {"param 'x'", "BATCHED_LEADING needs at least 3 dimensions"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.matrix_view = MUON_MATRIX_VIEW_BATCHED_LEADING;
      }));
  add("register_matrix_view_unknown", P, IA, {"param 'x'", "matrix_view 3 is unknown"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) { o.matrix_view = 3; }));
  add("register_matrix_view_negative", P, IA, {"param 'x'", "matrix_view -1 is unknown"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) { o.matrix_view = -1; }));
  // ---- param options ----
  add("register_options_size_zero", P, IA, {"options->struct_size is 0"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) { o.struct_size = 0; }));
  add("register_options_size_too_small", P, IA, {"options->struct_size is 16"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) { o.struct_size = 16; }));
  add("register_options_reserved0", P, IA, {"options->reserved0"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) { o.reserved0 = 1; }));
  add("register_options_reserved1", P, IA, {"options->reserved1"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) { o.reserved1 = 1; }));
  add("register_replicated_mode_unknown", P, IA,
      {"options->replicated_mode", "unknown value 2", "ZERO2"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) { o.replicated_mode = 2; }));
  add("register_replicated_mode_negative", P, IA, {"options->replicated_mode", "unknown value -1"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) { o.replicated_mode = -1; }));
  add("register_zero2_without_layout", P, IA,
      {"param 'x'", "MUON_REPLICATED_ZERO2 needs global_shape"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.replicated_mode = MUON_REPLICATED_ZERO2;
      }));
  add("register_global_shape_null", P, IA,
      {"param 'x'", "options->global_ndim (2) and global_shape"},
      RegisterWith([](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.global_ndim = 2;
        o.global_shape = nullptr;
      }));
  add("register_global_ndim_too_large", P, IA, {"param 'x'", "options->global_ndim (17)"},
      RegisterWith([](Fixture& f, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.global_ndim = 17;
        o.global_shape = f.Shape(std::vector<int64_t>(17, 1));
      }));
  add("register_placements_null", W1, IA,
      {"param 'x'", "options->num_placements (1) and placements disagree"},
      RegisterWith([](Fixture& f, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.global_ndim = 2;
        o.global_shape = f.Shape({4, 4});
        o.num_placements = 1;
        o.placements = nullptr;
      }));
  add("register_num_placements_negative", W1, IA, {"param 'x'", "options->num_placements (-1)"},
      RegisterWith([](Fixture& f, DLTensor&, DLTensor&, muon_param_options_t& o) {
        o.global_ndim = 2;
        o.global_shape = f.Shape({4, 4});
        o.num_placements = -1;
      }));
  add("register_global_shape_differs_from_local", P, IA,
      {"param 'x'", "the local tensor has 16 elements", "gives this rank 32"},
      RegisterWith(Placed({8, 4}, {})));
  add("register_global_shape_negative", P, IA, {"param 'x'", "global shape [8, -4]", "negative"},
      RegisterWith(Placed({8, -4}, {})));
  add("register_global_shape_overflows", P, IA,
      {"param 'x'", "global shape [4294967296, 4294967296]", "too many elements"},
      RegisterWith(Placed({int64_t{1} << 32, int64_t{1} << 32}, {})));
  // ---- placements ----
  add("placement_without_world", P, FP, {"param 'x'", "placements need a world communicator"},
      RegisterWith(Placed({4, 4}, {Replicate(0)})));
  add("placement_kind_unknown", W2, IA, {"param 'x'", "placement 0 has unknown kind 7"},
      RegisterWith(Placed({8, 4}, {OfKind(7)})));
  add("placement_kind_negative", W2, IA, {"param 'x'", "placement 0 has unknown kind -1"},
      RegisterWith(Placed({8, 4}, {OfKind(-1)})));
  add("placement_split_unknown", W2, IA, {"param 'x'", "placement 0 has unknown split 5"},
      RegisterWith(Placed({8, 4}, {Shard(0, 0, 5)})));
  add("placement_dim_does_not_exist", W2, IA,
      {"param 'x'", "placement 0", "dim 2 does not exist in shape [8, 4]"},
      RegisterWith(Placed({8, 4}, {Shard(0, 2)})));
  add("placement_dim_negative", W2, IA, {"param 'x'", "dim -1 does not exist"},
      RegisterWith(Placed({8, 4}, {Shard(0, -1)})));
  add("placement_even_split_uneven", W2, IA,
      {"param 'x'", "dim 0 of size 5 does not split evenly over 2 ranks"},
      RegisterWith(Placed({5, 4}, {Shard(0, 0)})));
  add("placement_sizes_do_not_add_up", W2, IA,
      {"param 'x'", "sizes add up to 6, but dim 0 has size 8"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor& g, muon_param_options_t& o) {
        Placed({8, 4}, {Shard(0, 0, MUON_SPLIT_SIZES, f.Shape({3, 3}))}, {3, 4})(f, p, g, o);
      }));
  add("placement_sizes_negative", W2, IA, {"param 'x'", "negative size -1"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor& g, muon_param_options_t& o) {
        Placed({8, 4}, {Shard(0, 0, MUON_SPLIT_SIZES, f.Shape({-1, 9}))})(f, p, g, o);
      }));
  add("placement_sizes_null", W2, IA, {"param 'x'", "SPLIT_SIZES but sizes is NULL"},
      RegisterWith(Placed({8, 4}, {Shard(0, 0, MUON_SPLIT_SIZES, nullptr)})));
  add("placement_flat_range_outside", W2, IA,
      {"param 'x'", "range [30, 38) does not lie inside the 32 elements"},
      RegisterWith(Placed({8, 4}, {FlatRange(0, 30, 8)}, {8})));
  add("placement_flat_range_negative_start", W2, IA, {"param 'x'", "range [-4, 4)"},
      RegisterWith(Placed({8, 4}, {FlatRange(0, -4, 8)}, {8})));
  add("placement_flat_range_length_huge", W2, IA,
      {"param 'x'", "9223372036854775807", "does not lie inside the 32 elements"},
      RegisterWith(Placed({8, 4}, {FlatRange(0, 1, std::numeric_limits<int64_t>::max())}, {8})));
  add("placement_group_unknown", W2, IA, {"param 'x'", "group 9 is not known"},
      RegisterWith(Placed({8, 4}, {Shard(9, 0)})));
  add("placement_group_negative", W2, IA, {"param 'x'", "group -1 is not known"},
      RegisterWith(Placed({8, 4}, {Replicate(-1)})));
  add("placement_sizes_group_unknown", W2, IA, {"param 'x'", "placement 0", "group 7 is not known"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor& g, muon_param_options_t& o) {
        Placed({8, 4}, {Shard(7, 0, MUON_SPLIT_SIZES, f.Shape({4, 4}))})(f, p, g, o);
      }));
  add("placement_group_used_twice", W2, IA,
      {"param 'x'", "placement 1", "already used by an earlier placement"},
      RegisterWith(Placed({8, 4}, {Shard(0, 0), Shard(0, 1)})));
  add("placement_local_numel_differs", W2, IA,
      {"param 'x'", "the local tensor has 32 elements", "gives this rank 16"},
      RegisterWith(Placed({8, 4}, {Shard(0, 0)}, {8, 4})));
  add("placement_zero2_without_replicate", W2, IA,
      {"param 'x'", "MUON_REPLICATED_ZERO2 needs exactly one placement, a REPLICATE"},
      RegisterWith([](Fixture& f, DLTensor& p, DLTensor& g, muon_param_options_t& o) {
        Placed({8, 4}, {Shard(0, 0)})(f, p, g, o);
        o.replicated_mode = MUON_REPLICATED_ZERO2;
      }));
  add("placement_global_shape_overflows", W2, IA,
      {"param 'x'", "global shape [4294967296, 4294967296]", "too many elements"},
      RegisterWith(Placed({int64_t{1} << 32, int64_t{1} << 32}, {Replicate(0)})));
  add("register_without_name_in_world", W1, IA, {"param 0", "a name is required"},
      RegisterWith(
          [](Fixture&, DLTensor&, DLTensor&, muon_param_options_t& o) { o.name = nullptr; }));

  // ---- muon_register_param_custom ----
  auto custom =
      [](std::function<void(Fixture&, DLTensor&, muon_param_options_t&, muon_custom_layout_t&)>
             edit) -> Call {
    return [edit](Fixture& f) {
      DLTensor p = f.Mat(f.A(), {2, 4}), g = f.Mat(f.GA(), {2, 4});
      muon_param_options_t o = f.Named("x");
      muon_custom_layout_t l = f.Layout(4, 4);
      edit(f, p, o, l);
      return muon_register_param_custom(f.opt, &p, &g, &o, &l, &f.out.id);
    };
  };
  auto nothing = [](Fixture&, DLTensor&, muon_param_options_t&, muon_custom_layout_t&) {};
  add("custom_without_world", E, FP, {"param 'x'", "custom path needs a world"}, custom(nothing));
  add("custom_null_opt", W1, IA, {"muon_register_param_custom", "opt is NULL"}, [](Fixture& f) {
    DLTensor p = f.Mat(f.A(), {2, 4}), g = f.Mat(f.GA(), {2, 4});
    muon_param_options_t o = f.Named("x");
    muon_custom_layout_t l = f.Layout(4, 4);
    return muon_register_param_custom(nullptr, &p, &g, &o, &l, &f.out.id);
  });
  add("custom_null_param_id", W1, IA, {"param_id is NULL"}, [](Fixture& f) {
    DLTensor p = f.Mat(f.A(), {2, 4}), g = f.Mat(f.GA(), {2, 4});
    muon_param_options_t o = f.Named("x");
    muon_custom_layout_t l = f.Layout(4, 4);
    return muon_register_param_custom(f.opt, &p, &g, &o, &l, nullptr);
  });
  add("custom_null_options", W1, IA, {"options", "is NULL", "name is required"}, [](Fixture& f) {
    DLTensor p = f.Mat(f.A(), {2, 4}), g = f.Mat(f.GA(), {2, 4});
    muon_custom_layout_t l = f.Layout(4, 4);
    return muon_register_param_custom(f.opt, &p, &g, nullptr, &l, &f.out.id);
  });
  add("custom_null_layout", W1, IA, {"layout is NULL"}, [](Fixture& f) {
    DLTensor p = f.Mat(f.A(), {2, 4}), g = f.Mat(f.GA(), {2, 4});
    muon_param_options_t o = f.Named("x");
    return muon_register_param_custom(f.opt, &p, &g, &o, nullptr, &f.out.id);
  });
  add("custom_null_param", W1, IA, {"param 'x'", "DLTensor pointer is NULL"}, [](Fixture& f) {
    DLTensor g = f.Mat(f.GA(), {2, 4});
    muon_param_options_t o = f.Named("x");
    muon_custom_layout_t l = f.Layout(4, 4);
    return muon_register_param_custom(f.opt, nullptr, &g, &o, &l, &f.out.id);
  });
  add("custom_layout_size_zero", W1, IA, {"layout->struct_size is 0"},
      custom([](Fixture&, DLTensor&, muon_param_options_t&, muon_custom_layout_t& l) {
        l.struct_size = 0;
      }));
  add("custom_options_size_zero", W1, IA, {"options->struct_size is 0"},
      custom([](Fixture&, DLTensor&, muon_param_options_t& o, muon_custom_layout_t&) {
        o.struct_size = 0;
      }));
  add("custom_without_name", W1, IA, {"param 0", "a name is required on the custom path"},
      custom([](Fixture&, DLTensor&, muon_param_options_t& o, muon_custom_layout_t&) {
        o.name = nullptr;
      }));
  add("custom_rows_zero", W1, IA, {"param 'x'", "global_rows and global_cols", "0 x 4"},
      custom([](Fixture&, DLTensor&, muon_param_options_t&, muon_custom_layout_t& l) {
        l.global_rows = 0;
      }));
  add("custom_cols_negative", W1, IA, {"param 'x'", "4 x -2"},
      custom([](Fixture&, DLTensor&, muon_param_options_t&, muon_custom_layout_t& l) {
        l.global_cols = -2;
      }));
  add("custom_gather_fn_missing", W1, IA, {"param 'x'", "gather_fn", "required"},
      custom([](Fixture&, DLTensor&, muon_param_options_t&, muon_custom_layout_t& l) {
        l.gather_fn = nullptr;
      }));
  add("custom_with_placements", W1, IA,
      {"param 'x'", "custom-path parameter takes no global_shape, placements"},
      custom([](Fixture& f, DLTensor&, muon_param_options_t& o, muon_custom_layout_t&) {
        o.global_ndim = 2;
        o.global_shape = f.Shape({4, 4});
      }));
  add("custom_matrix_larger_than_an_owner_holds", W1, IA,
      {"param 'x'", "a 1152921504606846976 x 4 custom-path matrix has more than the "
                    "576460752303423487 elements its owner can hold"},
      custom([](Fixture&, DLTensor&, muon_param_options_t&, muon_custom_layout_t& l) {
        l.global_rows = int64_t{1} << 60;
        l.global_cols = 4;
      }));
  add("custom_local_larger_than_matrix", W1, IA,
      {"param 'x'", "the local tensor has 8 elements, more than the 2 x 2 matrix"},
      custom([](Fixture&, DLTensor&, muon_param_options_t&, muon_custom_layout_t& l) {
        l.global_rows = 2;
        l.global_cols = 2;
      }));
  add("custom_name_twice", W1, MUON_ALREADY_EXISTS, {"param 'x'", "name is registered"},
      custom(nothing))
      .prepare = [](Fixture& f) {
    DLTensor p = f.Mat(f.B(), {4, 4}), g = f.Mat(f.GB(), {4, 4});
    muon_param_options_t o = f.Named("x");
    int64_t id = -1;
    f.Expect(muon_register_param(f.opt, &p, &g, &o, &id), "register x");
  };

  // ---- muon_rebind_param ----
  auto rebind =
      [](std::function<void(Fixture&, DLTensor & p, DLTensor & g, int64_t & id)> edit) -> Call {
    return [edit](Fixture& f) {
      DLTensor p = f.Mat(f.A(), {4, 4}), g = f.Mat(f.GA(), {4, 4});
      int64_t id = 0;
      edit(f, p, g, id);
      return muon_rebind_param(f.opt, id, &p, &g);
    };
  };
  add("rebind_null_opt", P, IA, {"muon_rebind_param", "opt is NULL"}, [](Fixture& f) {
    DLTensor p = f.Mat(f.A(), {4, 4}), g = f.Mat(f.GA(), {4, 4});
    return muon_rebind_param(nullptr, 0, &p, &g);
  });
  add("rebind_null_param", P, IA, {"muon_rebind_param", "param is NULL"}, [](Fixture& f) {
    DLTensor g = f.Mat(f.GA(), {4, 4});
    return muon_rebind_param(f.opt, 0, nullptr, &g);
  });
  add("rebind_unknown_id", P, NF, {"param_id 5 is not registered"},
      rebind([](Fixture&, DLTensor&, DLTensor&, int64_t& id) { id = 5; }));
  add("rebind_negative_id", P, NF, {"param_id -1 is not registered"},
      rebind([](Fixture&, DLTensor&, DLTensor&, int64_t& id) { id = -1; }));
  add("rebind_shape_mismatch", P, IA,
      {"param 'w'", "the new tensor is float32 [4, 2]", "registered one float32 [4, 4]"},
      rebind([](Fixture& f, DLTensor& p, DLTensor&, int64_t&) {
        p.shape = f.Shape({4, 2});
      }));
  add("rebind_dtype_mismatch", P, IA, {"param 'w'", "the new tensor is bfloat16"},
      rebind([](Fixture&, DLTensor& p, DLTensor&, int64_t&) { p.dtype = BF16(); }));
  add("rebind_grad_shape_mismatch", P, IA, {"grad of param 'w'", "[2, 8]"},
      rebind([](Fixture& f, DLTensor&, DLTensor& g, int64_t&) {
        g.shape = f.Shape({2, 8});
      }));
  add("rebind_device_code_12345", P, IA, {"param 'w'", "DLPack device type 12345"},
      rebind([](Fixture&, DLTensor& p, DLTensor&, int64_t&) { SetDeviceCode(p, 12345); }));
  add("rebind_grad_on_cuda", P, IA, {"grad of param 'w'", "cuda:0", "the optimizer's on cpu"},
      rebind([](Fixture&, DLTensor&, DLTensor& g, int64_t&) {
        g.device = {kDLCUDA, 0};
      }));
  add("rebind_null_grad_with_world", W1, FP, {"param 'w'", "a gradient is required with a world"},
      [](Fixture& f) {
        DLTensor p = f.Mat(f.A(), {4, 4});
        return muon_rebind_param(f.opt, 0, &p, nullptr);
      })
      .prepare = [](Fixture& f) {
    DLTensor p = f.Mat(f.B(), {4, 4}), g = f.Mat(f.GB(), {4, 4});
    muon_param_options_t o = f.Named("w");
    int64_t id = -1;
    f.Expect(muon_register_param(f.opt, &p, &g, &o, &id), "register w");
  };
  add("rebind_param_and_grad_share_storage", P, IA, {"param 'w'", "param and grad share storage"},
      rebind([](Fixture& f, DLTensor&, DLTensor& g, int64_t&) { g.data = f.A(); }));

  // ---- counts, statistics, step ----
  add("num_params_null_opt", P, IA, {"muon_num_params", "opt is NULL"},
      [](Fixture& f) { return muon_num_params(nullptr, &f.out.count); });
  add("num_params_null_count", P, IA, {"muon_num_params", "count is NULL"},
      [](Fixture& f) { return muon_num_params(f.opt, nullptr); });
  add("step_count_null_opt", P, IA, {"muon_step_count", "opt is NULL"},
      [](Fixture& f) { return muon_step_count(nullptr, &f.out.steps); });
  add("step_count_null_count", P, IA, {"muon_step_count", "count is NULL"},
      [](Fixture& f) { return muon_step_count(f.opt, nullptr); });
  add("get_stats_null_opt", S, IA, {"muon_get_stats", "opt is NULL"},
      [](Fixture& f) { return muon_get_stats(nullptr, &f.out.stats); });
  add("get_stats_null_stats", S, IA, {"muon_get_stats", "stats is NULL"},
      [](Fixture& f) { return muon_get_stats(f.opt, nullptr); });
  add("get_stats_size_zero", S, IA, {"stats->struct_size is 0"}, [](Fixture& f) {
    return muon_get_stats(f.opt, &f.out.stats);
  }).prepare = [](Fixture& f) { f.out.stats.struct_size = 0; };
  add("get_stats_size_too_small", S, IA, {"stats->struct_size is 24"}, [](Fixture& f) {
    return muon_get_stats(f.opt, &f.out.stats);
  }).prepare = [](Fixture& f) { f.out.stats.struct_size = 24; };
  add("step_null_opt", P, IA, {"muon_step", "opt is NULL"},
      [](Fixture&) { return muon_step(nullptr, nullptr); });
  add("step_without_params", E, FP, {"muon_step", "no parameters are registered"},
      [](Fixture& f) { return muon_step(f.opt, nullptr); });
  add("step_without_params_in_world", W1, FP,
      {"muon_step", "no parameters are registered on any rank"},
      [](Fixture& f) { return muon_step(f.opt, nullptr); });

  // ---- muon_orthogonalize (in and out 4x4 float32 on the host) ----
  add("orthogonalize_null_opt", E, IA, {"muon_orthogonalize", "opt is NULL"}, [](Fixture& f) {
    DLTensor in = f.Mat(f.A(), {4, 4}), out = f.Mat(f.B(), {4, 4});
    return muon_orthogonalize(nullptr, &in, &out, 0, nullptr);
  });
  add("orthogonalize_null_in", E, IA, {"muon_orthogonalize", "in is NULL"}, [](Fixture& f) {
    DLTensor out = f.Mat(f.B(), {4, 4});
    return muon_orthogonalize(f.opt, nullptr, &out, 0, nullptr);
  });
  add("orthogonalize_null_out", E, IA, {"muon_orthogonalize", "out is NULL"}, [](Fixture& f) {
    DLTensor in = f.Mat(f.A(), {4, 4});
    return muon_orthogonalize(f.opt, &in, nullptr, 0, nullptr);
  });
  add("orthogonalize_shape_mismatch", E, IA, {"out: shape [4, 2] differs from in's [4, 4]"},
      OrthoWith([](Fixture& f, DLTensor&, DLTensor& out, int32_t&) {
        out.shape = f.Shape({4, 2});
      }));
  add("orthogonalize_in_dtype_int32", E, IA, {"in: unsupported dtype"},
      OrthoWith([](Fixture&, DLTensor& in, DLTensor&, int32_t&) {
        in.dtype = DLDataType{kDLInt, 32, 1};
      }));
  add("orthogonalize_out_dtype_float64", E, IA, {"out: unsupported dtype", "bits 64"},
      OrthoWith([](Fixture&, DLTensor&, DLTensor& out, int32_t&) {
        out.dtype = DLDataType{kDLFloat, 64, 1};
      }));
  add("orthogonalize_overlapping_buffers", E, IA, {"out: overlaps in"},
      OrthoWith([](Fixture& f, DLTensor&, DLTensor& out, int32_t&) { out.data = f.A() + 4; }));
  add("orthogonalize_matrix_view_unknown", E, IA, {"in: matrix_view 9 is unknown"},
      OrthoWith([](Fixture&, DLTensor&, DLTensor&, int32_t& view) { view = 9; }));
  add("orthogonalize_1d", E, IA, {"in: has 1 dimension(s)", "AdamW"},
      OrthoWith([](Fixture& f, DLTensor& in, DLTensor& out, int32_t&) {
        in = f.Mat(f.A(), {16});
        out = f.Mat(f.B(), {16});
      }));
  add("orthogonalize_3d_with_2d_view", E, IA, {"in: shape [2, 4, 2] has 3 dimensions"},
      OrthoWith([](Fixture& f, DLTensor& in, DLTensor& out, int32_t&) {
        in = f.Mat(f.A(), {2, 4, 2});
        out = f.Mat(f.B(), {2, 4, 2});
      }));
  add("orthogonalize_batched_on_2d", E, IA, {"in: MUON_MATRIX_VIEW_BATCHED_LEADING needs"},
      OrthoWith([](Fixture&, DLTensor&, DLTensor&, int32_t& view) {
        view = MUON_MATRIX_VIEW_BATCHED_LEADING;
      }));
  add("orthogonalize_in_device_code_12345", E, IA, {"in: tensor is on DLPack device type 12345"},
      OrthoWith([](Fixture&, DLTensor& in, DLTensor&, int32_t&) { SetDeviceCode(in, 12345); }));
  add("orthogonalize_out_device_code_12345", E, IA, {"out: tensor is on DLPack device type 12345"},
      OrthoWith([](Fixture&, DLTensor&, DLTensor& out, int32_t&) { SetDeviceCode(out, 12345); }));
  add("orthogonalize_in_not_contiguous", E, IA, {"in: strides [1, 4]"},
      OrthoWith([](Fixture& f, DLTensor& in, DLTensor&, int32_t&) {
        in.strides = f.Shape({1, 4});
      }));
  add("orthogonalize_out_null_data", E, IA, {"out: data pointer is NULL"},
      OrthoWith([](Fixture&, DLTensor&, DLTensor& out, int32_t&) { out.data = nullptr; }));
  add("orthogonalize_in_on_other_device", P, IA,
      {"in: is on cuda:0", "the optimizer's parameters on cpu"},
      OrthoWith([](Fixture&, DLTensor& in, DLTensor&, int32_t&) {
        in.device = {kDLCUDA, 0};
      }));
  add("orthogonalize_out_on_other_device", P, IA, {"out: is on cuda:0", "the backend on cpu"},
      OrthoWith([](Fixture&, DLTensor&, DLTensor& out, int32_t&) {
        out.device = {kDLCUDA, 0};
      }));

  // ---- QK-Clip: layers of param "w" (4 x 4) ----
  auto qk_layer = [](std::function<void(muon_qk_clip_layer_t&)> edit) {
    return [edit](Fixture& f) {
      muon_qk_clip_layer_t l;
      muon_qk_clip_layer_init(&l, sizeof l);
      l.q_param = l.k_param = 0;
      l.num_heads = 1;
      l.q_head_rows = l.k_head_rows = 2;
      l.k_first_row = 2;
      edit(l);
      int64_t id = -7;
      const muon_status_t st = muon_register_qk_clip(f.opt, &l, &id);
      return st != MUON_OK || id == 0 ? st : MUON_INTERNAL;
    };
  };
  add("qk_clip_layer_init_null", E, IA, {"muon_qk_clip_layer_init", "layer is NULL"},
      [](Fixture&) { return muon_qk_clip_layer_init(nullptr, sizeof(muon_qk_clip_layer_t)); });
  add("qk_clip_layer_init_size_16", E, IA, {"layer->struct_size is 16"}, [](Fixture&) {
    muon_qk_clip_layer_t l;
    return muon_qk_clip_layer_init(&l, 16);
  });
  add("register_qk_clip_null_layer", S, IA, {"muon_register_qk_clip", "layer is NULL"},
      [](Fixture& f) {
        int64_t id;
        return muon_register_qk_clip(f.opt, nullptr, &id);
      });
  add("register_qk_clip_unset_param", S, IA, {"layer->q_param: -1 is not a registered"},
      qk_layer([](muon_qk_clip_layer_t& l) { l.q_param = -1; }));
  add("register_qk_clip_unknown_param", S, NF, {"param_id 3 is not registered"},
      qk_layer([](muon_qk_clip_layer_t& l) { l.k_param = 3; }));
  add("register_qk_clip_no_heads", S, IA, {"layer->num_heads: 0"},
      qk_layer([](muon_qk_clip_layer_t& l) { l.num_heads = 0; }));
  add("register_qk_clip_heads_past_the_rows", S, IA,
      {"qk_clip keys (param 'w')", "heads end at row 6; the matrix has 4 rows"},
      qk_layer([](muon_qk_clip_layer_t& l) { l.k_first_row = 4; }));
  add("register_qk_clip_q_meets_k", S, IA, {"query head 0's rows [0, 2) meet key head 0's"},
      qk_layer([](muon_qk_clip_layer_t& l) { l.k_first_row = 1; }));
  add("register_qk_clip_key_rotary", S, IA, {"k_head_stride", "out of range"},
      qk_layer([](muon_qk_clip_layer_t& l) { l.k_head_stride = -2; }));
  add("register_qk_clip_alpha", S, IA, {"qk_clip: alpha 1.5 must be in [0, 1]"},
      qk_layer([](muon_qk_clip_layer_t& l) { l.alpha = 1.5; }));
  add("qk_clip_unknown_layer", S, NF, {"layer_id 0 is not a registered QK-Clip layer (0 are)"},
      [](Fixture& f) {
        const float logits[1] = {200.0f};
        return muon_qk_clip(f.opt, 0, logits, 1, 100.0, nullptr);
      });
  add("qk_clip_null_logits", S, IA, {"muon_qk_clip", "max_logits is NULL"},
      [](Fixture& f) { return muon_qk_clip(f.opt, 0, nullptr, 1, 100.0, nullptr); });
  add("qk_clip_on_stream_null_opt", S, IA, {"muon_qk_clip_on_stream", "opt is NULL"},
      [](Fixture&) {
        const float logits[1] = {200.0f};
        return muon_qk_clip_on_stream(nullptr, 0, logits, 1, 100.0, nullptr, nullptr);
      });
  add("qk_clip_on_stream_null_logits", S, IA, {"muon_qk_clip_on_stream", "max_logits is NULL"},
      [](Fixture& f) {
        return muon_qk_clip_on_stream(f.opt, 0, nullptr, 1, 100.0, nullptr, nullptr);
      });

  // ---- state tensors (after a step: momentum holds values) ----
  add("get_state_dtype_null_opt", S, IA, {"muon_get_state_dtype", "opt is NULL"},
      [](Fixture& f) { return muon_get_state_dtype(nullptr, 0, &f.out.dtype); });
  add("get_state_dtype_null_dtype", S, IA, {"muon_get_state_dtype", "dtype is NULL"},
      [](Fixture& f) { return muon_get_state_dtype(f.opt, 0, nullptr); });
  add("get_state_dtype_unknown_id", S, NF, {"param_id 1 is not registered"},
      [](Fixture& f) { return muon_get_state_dtype(f.opt, 1, &f.out.dtype); });
  add("get_state_dtype_negative_id", S, NF, {"param_id -3 is not registered"},
      [](Fixture& f) { return muon_get_state_dtype(f.opt, -3, &f.out.dtype); });
  for (bool set : {false, true}) {
    const std::string fn = set ? "set_state" : "get_state";
    const std::string api = set ? "muon_set_state" : "muon_get_state";
    add(fn + "_null_opt", S, IA, {api, "opt is NULL"}, [set](Fixture& f) {
      DLTensor t = f.Mat(f.B(), {4, 4});
      return set ? muon_set_state(nullptr, 0, &t) : muon_get_state(nullptr, 0, &t);
    });
    add(fn + "_null_tensor", S, IA, {api, "state tensor for param 'w'", "DLTensor pointer is NULL"},
        [set](Fixture& f) {
          return set ? muon_set_state(f.opt, 0, nullptr) : muon_get_state(f.opt, 0, nullptr);
        });
    add(fn + "_unknown_id", S, NF, {api, "param_id 7 is not registered"},
        StateWith(
            set, [](Fixture&, DLTensor&) {}, 7));
    add(fn + "_wrong_shape", S, IA,
        {"state tensor for param 'w'", "shape [4, 2] differs from the parameter's [4, 4]"},
        StateWith(set, [](Fixture& f, DLTensor& t) {
          t.shape = f.Shape({4, 2});
        }));
    add(fn + "_wrong_dtype", S, IA,
        {"state tensor for param 'w'", "dtype bfloat16 differs from the state dtype float32"},
        StateWith(set, [](Fixture&, DLTensor& t) { t.dtype = BF16(); }));
    add(fn + "_unsupported_dtype", S, IA, {"state tensor for param 'w'", "unsupported dtype"},
        StateWith(set, [](Fixture&, DLTensor& t) {
          t.dtype = DLDataType{kDLFloat, 64, 1};
        }));
    add(fn + "_not_contiguous", S, IA, {"state tensor for param 'w'", "strides [1, 4]"},
        StateWith(set, [](Fixture& f, DLTensor& t) {
          t.strides = f.Shape({1, 4});
        }));
    add(fn + "_device_code_12345", S, IA,
        {"state tensor for param 'w'", "DLPack device type 12345"},
        StateWith(set, [](Fixture&, DLTensor& t) { SetDeviceCode(t, 12345); }));
    add(fn + "_on_other_device", S, IA,
        {"state tensor for param 'w'", "is on cuda:0", "pass host memory or a tensor on cpu"},
        StateWith(set, [](Fixture&, DLTensor& t) {
          t.device = {kDLCUDA, 0};
        }));
    add(fn + "_null_data", S, IA, {"state tensor for param 'w'", "data pointer is NULL"},
        StateWith(set, [](Fixture&, DLTensor& t) { t.data = nullptr; }));
  }

  // ---- muon_save_state ----
  add("save_state_null_opt", S, IA, {"muon_save_state", "opt is NULL"},
      [](Fixture& f) { return muon_save_state(nullptr, nullptr, 0, &f.out.size); });
  add("save_state_null_size", S, IA, {"muon_save_state", "size is NULL"}, [](Fixture& f) {
    return muon_save_state(f.opt, f.out.buffer, sizeof f.out.buffer, nullptr);
  });
  add("save_state_capacity_too_small", S, MUON_OUT_OF_RANGE,
      {"muon_save_state", "capacity 10 is too small", "needs 177 bytes"},
      [](Fixture& f) { return muon_save_state(f.opt, f.out.buffer, 10, &f.out.size); });
  add("save_state_capacity_zero", S, MUON_OUT_OF_RANGE, {"capacity 0 is too small"},
      [](Fixture& f) { return muon_save_state(f.opt, f.out.buffer, 0, &f.out.size); });
  add("save_state_capacity_one_short", S, MUON_OUT_OF_RANGE, {"capacity 176 is too small"},
      [](Fixture& f) { return muon_save_state(f.opt, f.out.buffer, kBlobEnd - 1, &f.out.size); });

  // ---- muon_load_states (several ranks' blobs) ----
  add("load_states_null_opt", S, IA, {"muon_load_states", "opt is NULL"}, [](Fixture& f) {
    f.blob = f.Save(f.opt);
    const void* b[1] = {f.blob.data()};
    size_t n[1] = {f.blob.size()};
    return muon_load_states(nullptr, b, n, 1);
  });
  add("load_states_null_buffers", S, IA, {"muon_load_states", "buffers is NULL"},
      [](Fixture& f) {
        size_t n[1] = {kBlobEnd};
        return muon_load_states(f.opt, nullptr, n, 1);
      });
  add("load_states_null_sizes", S, IA, {"muon_load_states", "sizes is NULL"}, [](Fixture& f) {
    f.blob = f.Save(f.opt);
    const void* b[1] = {f.blob.data()};
    return muon_load_states(f.opt, b, nullptr, 1);
  });
  add("load_states_no_blob", S, IA, {"muon_load_states", "count: 0 blobs"}, [](Fixture& f) {
    const void* b[1] = {nullptr};
    size_t n[1] = {0};
    return muon_load_states(f.opt, b, n, 0);
  });
  add("load_states_null_entry", S, IA, {"muon_load_states", "buffers[1] is NULL"},
      [](Fixture& f) {
        f.blob = f.Save(f.opt);
        const void* b[2] = {f.blob.data(), nullptr};
        size_t n[2] = {f.blob.size(), f.blob.size()};
        return muon_load_states(f.opt, b, n, 2);
      });
  add("load_states_corrupt_second_blob", S, IA, {"state blob 1", "bad magic"}, [](Fixture& f) {
    f.blob = f.Save(f.opt);
    std::vector<unsigned char> bad = f.blob;
    bad[0] = 'X';
    const void* b[2] = {f.blob.data(), bad.data()};
    size_t n[2] = {f.blob.size(), bad.size()};
    return muon_load_states(f.opt, b, n, 2);
  });
  add("load_states_blobs_of_other_steps", S, IA,
      {"state blobs 0 and 1 were saved at different steps"}, [](Fixture& f) {
        f.blob = f.Save(f.opt);
        std::vector<unsigned char> later = f.blob;
        Poke<int64_t>(later, kStepAt, 7);
        const void* b[2] = {f.blob.data(), later.data()};
        size_t n[2] = {f.blob.size(), later.size()};
        return muon_load_states(f.opt, b, n, 2);
      });
  add("load_states_elements_missing", S, IA,
      {"state for param 'w'", "global elements [8, 16) are in none of the 1 blobs"},
      [](Fixture& f) {
        f.blob = f.Save(f.opt);
        Poke<int64_t>(f.blob, kRunAt + 8, 8);        // the run holds elements [0, 8) only
        Poke<uint64_t>(f.blob, kNbytesAt, 8 * 4);    // and their bytes
        f.blob.resize(kMomentumAt + 8 * 4);
        const void* b[1] = {f.blob.data()};
        size_t n[1] = {f.blob.size()};
        return muon_load_states(f.opt, b, n, 1);
      });
  // Runs checked together, not one by one: the same 16 elements twice (both
  // copies new values), and two runs whose sum passes INT64_MAX (of a global
  // shape [INT64_MAX, 4] no optimizer has: the blob alone is refused).
  add("load_states_runs_overlap", S, IA,
      {"state blob 0, param 'w'", "run 1 [0, +16) starts before the end 16 of run 0",
       "increasing global order, without overlap"},
      LoadStatesEdited(TwoRuns(4, 16, 0, 16, 32)));
  add("load_states_runs_overlap_in_part", S, IA,
      {"state blob 0, param 'w'", "run 1 [8, +8) starts before the end 16 of run 0"},
      LoadStatesEdited(TwoRuns(4, 16, 8, 8, 24)));
  add("load_states_run_sum_overflows", S, IA,
      {"state blob 0, param 'w'",
       "run 1 [0, +4611686018427387904) starts before the end 4611686018427387904 of run 0"},
      LoadStatesEdited(TwoRuns(INT64_MAX / 4, INT64_MAX / 2 + 1, 0, INT64_MAX / 2 + 1, 0)));
  add("load_states_other_global_shape", P, IA,
      {"state for param 'w'", "blob 0 saved it as [2, 8]", "the optimizer has [4, 4]"},
      [](Fixture& f) {
        const void* b[1] = {f.blob.data()};
        size_t n[1] = {f.blob.size()};
        return muon_load_states(f.opt, b, n, 1);
      })
      .prepare = [](Fixture& f) {
    f.blob = f.Save(f.Other({{"w", {2, 8}}}));
  };

  // ---- muon_load_state ----
  add("load_state_null_opt", S, IA, {"muon_load_state", "opt is NULL"}, [](Fixture& f) {
    f.blob = f.Save(f.opt);
    return muon_load_state(nullptr, f.blob.data(), f.blob.size());
  });
  add("load_state_null_buffer", S, IA, {"muon_load_state", "buffer is NULL"},
      [](Fixture& f) { return muon_load_state(f.opt, nullptr, kBlobEnd); });
  add("load_state_empty", S, IA, {"state blob", "bad magic"}, [](Fixture& f) {
    static const unsigned char none = 0;
    return muon_load_state(f.opt, &none, 0);
  });
  add("load_state_bad_magic", S, IA, {"state blob", "bad magic"},
      LoadEdited([](std::vector<unsigned char>& b) { b[0] = 'X'; }));
  add("load_state_other_format_version", S, IA, {"state blob", "format version 4"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<uint32_t>(b, kFormatAt, 4); }));
  add("load_state_reserved_nonzero", S, IA, {"state blob", "'reserved' is 1"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<uint32_t>(b, kReservedAt, 1); }));
  add("load_state_negative_step_count", S, IA, {"state blob", "step count -1 is negative"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<int64_t>(b, kStepAt, -1); }));
  add("load_state_other_param_count", S, IA, {"state blob, parameter 1", "truncated"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<uint64_t>(b, kCountAt, 2); }));
  add("load_state_zero_param_count", S, IA, {"state blob", "unexpected bytes after the last"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<uint64_t>(b, kCountAt, 0); }));
  add("load_state_other_name", S, IA, {"state blob, param 'w'", "the blob has 'x'"},
      LoadEdited([](std::vector<unsigned char>& b) { b[kNameAt] = 'x'; }));
  add("load_state_name_length_huge", S, IA, {"state blob, parameter 0", "truncated"},
      LoadEdited(
          [](std::vector<unsigned char>& b) { Poke<uint32_t>(b, kNameLenAt, 0xFFFFFFFFu); }));
  add("load_state_padding_nonzero", S, IA, {"state blob, param 'w'", "padding word is 1"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<uint8_t>(b, kPadAt, 1); }));
  add("load_state_unknown_entry_kind", S, IA, {"state blob, param 'w'", "unknown entry kind 5"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<uint8_t>(b, kKindAt, 5); }));
  add("load_state_global_dim_negative", S, IA,
      {"state blob, param 'w'", "global shape has a negative dimension"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<int64_t>(b, kGlobalDimsAt, -4); }));
  add("load_state_run_outside_the_tensor", S, IA,
      {"state blob, param 'w'", "run [8, +16) is outside its 16 global elements"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<int64_t>(b, kRunAt, 8); }));
  add("load_state_runs_overlap", S, IA,
      {"state blob, param 'w'", "run 1 [0, +16) starts before the end 16 of run 0"},
      LoadEdited(TwoRuns(4, 16, 0, 16, 32)));
  // A custom-path entry (a local piece, no runs) for a parameter with a
  // layout: the same bytes, but not what saving this optimizer writes.
  add("load_state_custom_path_entry", S, IA,
      {"state blob, param 'w'", "the blob saved it on the custom path (a local piece only), "
       "the optimizer has it with a layout"},
      LoadEdited([](std::vector<unsigned char>& b) {
        Poke<int64_t>(b, kStepAt, 7);
        Poke<uint8_t>(b, kKindAt, 1);
        Poke<uint64_t>(b, kRunCountAt, 0);
        b.erase(b.begin() + kRunAt, b.begin() + kRunAt + 16);
      }));
  add("load_state_run_count_huge", S, IA, {"state blob, param 'w'", "truncated"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<uint64_t>(b, kRunCountAt, ~0ull); }));
  add("load_state_other_dtype", S, IA,
      {"state blob, param 'w'", "holds 64 momentum bytes for 16 elements of bfloat16"},
      LoadEdited([](std::vector<unsigned char>& b) { b[kDtypeAt] = 1; }));
  add("load_state_unknown_dtype", S, IA, {"state blob, param 'w'", "unknown momentum dtype 9"},
      LoadEdited([](std::vector<unsigned char>& b) { b[kDtypeAt] = 9; }));
  add("load_state_other_view", S, IA, {"state blob, param 'w'", "(view 1)", "(view 0)"},
      LoadEdited([](std::vector<unsigned char>& b) { b[kViewAt] = 1; }));
  add("load_state_other_shape", S, IA,
      {"state blob, param 'w'", "saved shape [8, 4]", "registered [4, 4]"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<int64_t>(b, kDimsAt, 8); }));
  add("load_state_ndim_huge", S, IA, {"state blob, param 'w'", "truncated"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<uint32_t>(b, kNdimAt, 0x7FFFFFFFu); }));
  add("load_state_other_byte_count", S, IA,
      {"state blob, param 'w'", "holds 65 momentum bytes for 16 elements of float32"},
      LoadEdited([](std::vector<unsigned char>& b) { Poke<uint64_t>(b, kNbytesAt, 65); }));
  add("load_state_trailing_byte", S, IA, {"state blob", "unexpected bytes after the last"},
      LoadEdited([](std::vector<unsigned char>& b) { b.push_back(0); }));
  // Truncated inside every section of the blob.
  const struct {
    const char* section;
    size_t size;
    const char* who;
  } cuts[] = {
      {"magic", 4, "bad magic"},
      {"format", kFormatAt + 2, "state blob header"},
      {"reserved", kReservedAt + 2, "state blob header"},
      {"step_count", kStepAt + 4, "state blob header"},
      {"param_count", kCountAt + 4, "state blob header"},
      {"name_length", kNameLenAt + 2, "state blob, parameter 0"},
      {"name", kNameAt, "state blob, parameter 0"},
      {"dtype", kDtypeAt, "state blob, param 'w'"},
      {"view", kViewAt, "state blob, param 'w'"},
      {"kind", kKindAt, "state blob, param 'w'"},
      {"padding", kPadAt, "state blob, param 'w'"},
      {"ndim", kNdimAt + 2, "state blob, param 'w'"},
      {"dims", kDimsAt + 12, "state blob, param 'w'"},
      {"global_ndim", kGlobalNdimAt + 2, "state blob, param 'w'"},
      {"global_dims", kGlobalDimsAt + 12, "state blob, param 'w'"},
      {"run_count", kRunCountAt + 4, "state blob, param 'w'"},
      {"runs", kRunAt + 12, "state blob, param 'w'"},
      {"byte_count", kNbytesAt + 4, "state blob, param 'w'"},
      {"momentum", kMomentumAt + 30, "state blob, param 'w'"},
      {"last_byte", kBlobEnd - 1, "state blob, param 'w'"},
  };
  for (const auto& cut : cuts) {
    std::vector<std::string> words = {cut.who};
    if (std::strcmp(cut.section, "magic") != 0) words.push_back("truncated");
    const size_t size = cut.size;
    add(std::string("load_state_truncated_in_") + cut.section, S, IA, words,
        LoadEdited([size](std::vector<unsigned char>& b) { b.resize(size); }));
  }
  // Blobs of other optimizers.
  add("load_state_other_param_order", E, IA,
      {"state blob, param 'a'", "the blob has 'b' at this position", "order"},
      [](Fixture& f) { return muon_load_state(f.opt, f.blob.data(), f.blob.size()); })
      .prepare = [](Fixture& f) {
    for (const char* name : {"a", "b"}) {
      float* s = name[0] == 'a' ? f.A() : f.B();
      DLTensor p = f.Mat(s, {4, 4}), g = f.Mat(s + kSlice, {4, 4});
      muon_param_options_t o = f.Named(name);
      int64_t id = -1;
      f.Expect(muon_register_param(f.opt, &p, &g, &o, &id), "register");
    }
    f.blob = f.Save(f.Other({{"b", {4, 4}}, {"a", {4, 4}}}));
  };
  add("load_state_other_param_shapes", P, IA,
      {"state blob, param 'w'", "saved shape [2, 8]", "registered [4, 4]"},
      [](Fixture& f) { return muon_load_state(f.opt, f.blob.data(), f.blob.size()); })
      .prepare = [](Fixture& f) {
    f.blob = f.Save(f.Other({{"w", {2, 8}}}));
  };
  add("load_state_other_param_dtypes", P, IA,
      {"state blob, param 'w'", "saved momentum dtype bfloat16", "float32"},
      [](Fixture& f) { return muon_load_state(f.opt, f.blob.data(), f.blob.size()); })
      .prepare = [](Fixture& f) {
    f.blob = f.Save(f.Other({{"w", {4, 4}}}, BF16()));
  };
  add("load_state_more_params", P, IA, {"state blob", "holds 2 parameters, the optimizer has 1"},
      [](Fixture& f) { return muon_load_state(f.opt, f.blob.data(), f.blob.size()); })
      .prepare = [](Fixture& f) {
    f.blob = f.Save(f.Other({{"w", {4, 4}}, {"v", {4, 4}}}));
  };
  add("load_state_other_names", P, IA, {"state blob, param 'w'", "the blob has 'v'"},
      [](Fixture& f) { return muon_load_state(f.opt, f.blob.data(), f.blob.size()); })
      .prepare = [](Fixture& f) {
    f.blob = f.Save(f.Other({{"v", {4, 4}}}));
  };

  // ---- worlds and groups ----
  add("set_world_null_world", E, IA, {"muon_set_world", "world is NULL"},
      [](Fixture& f) { return muon_set_world(f.opt, nullptr, &f.out.group_id); });
  add("set_world_null_opt", E, IA, {"muon_set_world", "opt is NULL"}, [](Fixture& f) {
    muon_comm_t c = f.Stub(0, 1);
    return muon_set_world(nullptr, &c, &f.out.group_id);
  }).verify = ReleasedOnce();
  add("set_world_null_group_id", E, IA, {"muon_set_world", "group_id is NULL"}, [](Fixture& f) {
    muon_comm_t c = f.Stub(0, 1);
    return muon_set_world(f.opt, &c, nullptr);
  }).verify = ReleasedOnce();
  auto comm_with = [](bool world, std::function<void(muon_comm_t&)> edit) -> Call {
    return [world, edit](Fixture& f) {
      muon_comm_t c = f.Stub(0, 1);
      edit(c);
      return world ? muon_set_world(f.opt, &c, &f.out.group_id)
                   : muon_add_group(f.opt, &c, &f.out.group_id);
    };
  };
  for (bool world : {true, false}) {
    const std::string fn = world ? "set_world" : "add_group";
    const Setup s = world ? E : W1;
    const std::string who = world ? "world" : "group 1";
    add(fn + "_struct_size_zero", s, IA,
        {who + "->struct_size is 0", "smallest", "72 (0.2, sizeof(muon_comm_t)"},
        comm_with(world, [](muon_comm_t& c) { c.struct_size = 0; }))
        .verify = NotReleased();
    add(fn + "_struct_size_too_small", s, IA, {who + "->struct_size is 16"},
        comm_with(world, [](muon_comm_t& c) { c.struct_size = 16; }))
        .verify = NotReleased();
    add(fn + "_without_all_gather", s, IA, {who, "the all_gather callback is NULL"},
        comm_with(world, [](muon_comm_t& c) { c.all_gather = nullptr; }))
        .verify = ReleasedOnce();
    add(fn + "_without_all_to_all_v", s, IA, {who, "the all_to_all_v callback is NULL"},
        comm_with(world, [](muon_comm_t& c) { c.all_to_all_v = nullptr; }))
        .verify = ReleasedOnce();
    add(fn + "_without_reduce_scatter", s, IA, {who, "the reduce_scatter callback is NULL"},
        comm_with(world, [](muon_comm_t& c) { c.reduce_scatter = nullptr; }))
        .verify = ReleasedOnce();
    add(fn + "_rank_negative", s, IA, {who, "rank -1 and size 1"},
        comm_with(world, [](muon_comm_t& c) { c.rank = -1; }))
        .verify = ReleasedOnce();
    add(fn + "_rank_not_below_size", s, IA, {who, "rank 1 and size 1"},
        comm_with(world, [](muon_comm_t& c) { c.rank = 1; }))
        .verify = ReleasedOnce();
    add(fn + "_size_zero", s, IA, {who, "rank 0 and size 0"},
        comm_with(world, [](muon_comm_t& c) { c.size = 0; }))
        .verify = ReleasedOnce();
  }
  add("set_world_twice", W1, FP, {"muon_set_world", "world: it is already set"},
      comm_with(true, [](muon_comm_t&) {}))
      .verify = ReleasedOnce();
  add("set_world_after_params", P, FP, {"muon_set_world", "world: set it before registering"},
      comm_with(true, [](muon_comm_t&) {}))
      .verify = ReleasedOnce();
  add("add_group_null_comm", W1, IA, {"muon_add_group", "comm is NULL"},
      [](Fixture& f) { return muon_add_group(f.opt, nullptr, &f.out.group_id); });
  add("add_group_null_opt", W1, IA, {"muon_add_group", "opt is NULL"}, [](Fixture& f) {
    muon_comm_t c = f.Stub(0, 1);
    return muon_add_group(nullptr, &c, &f.out.group_id);
  }).verify = ReleasedOnce();
  add("add_group_null_group_id", W1, IA, {"muon_add_group", "group_id is NULL"}, [](Fixture& f) {
    muon_comm_t c = f.Stub(0, 1);
    return muon_add_group(f.opt, &c, nullptr);
  }).verify = ReleasedOnce();
  add("add_group_without_world", E, FP, {"muon_add_group", "group", "muon_set_world"},
      comm_with(false, [](muon_comm_t&) {}))
      .verify = ReleasedOnce();
  add("add_group_after_params", W1, FP, {"muon_add_group", "group", "before registering"},
      comm_with(false, [](muon_comm_t&) {}))
      .prepare = [](Fixture& f) {
    DLTensor p = f.Mat(f.B(), {4, 4}), g = f.Mat(f.GB(), {4, 4});
    muon_param_options_t o = f.Named("w");
    int64_t id = -1;
    f.Expect(muon_register_param(f.opt, &p, &g, &o, &id), "register w");
  };
  t.back().verify = ReleasedOnce();
  add("add_group_larger_than_world", W1, IA, {"group 1: has 2 ranks, more than the world's 1"},
      [](Fixture& f) {
        muon_comm_t c = f.Stub(1, 2);
        return muon_add_group(f.opt, &c, &f.out.group_id);
      })
      .verify = ReleasedOnce();

  // ---- in-process worlds and their tables ----
  add("inprocess_world_null_out", E, IA, {"muon_inprocess_world_create", "out is NULL"},
      [](Fixture&) { return muon_inprocess_world_create(2, nullptr); });
  add("inprocess_world_size_zero", E, IA, {"world size 0 is outside [1, 65536]"},
      [](Fixture& f) { return muon_inprocess_world_create(0, &f.out.world); });
  add("inprocess_world_size_negative", E, IA, {"world size -3"},
      [](Fixture& f) { return muon_inprocess_world_create(-3, &f.out.world); });
  add("inprocess_world_size_too_large", E, IA, {"world size 65537"},
      [](Fixture& f) { return muon_inprocess_world_create(65537, &f.out.world); });
  auto comm_call = [](std::vector<int32_t> ranks, int32_t num_ranks, int32_t rank) -> Call {
    return [ranks, num_ranks, rank](Fixture& f) {
      return muon_inprocess_comm(f.spare_world, ranks.empty() ? nullptr : ranks.data(), num_ranks,
                                 rank, &f.out.comm);
    };
  };
  const Prepare world_of_2 = [](Fixture& f) { f.SpareWorld(2); };
  const Verify world_still_works = [](Fixture& f) {
    std::vector<std::string> p;
    muon_comm_t t;
    if (muon_inprocess_comm(f.spare_world, nullptr, 0, 1, &t) != MUON_OK) {
      p.push_back(std::string("the world then refuses a valid table: ") +
                  muon_last_error_message());
    } else {
      t.release(t.ctx);
    }
    return p;
  };
  add("inprocess_comm_null_world", E, IA, {"muon_inprocess_comm", "world is NULL"},
      [](Fixture& f) { return muon_inprocess_comm(nullptr, nullptr, 0, 0, &f.out.comm); });
  add("inprocess_comm_null_out", E, IA, {"muon_inprocess_comm", "out is NULL"}, [](Fixture& f) {
    return muon_inprocess_comm(f.spare_world, nullptr, 0, 0, nullptr);
  }).prepare = world_of_2;
  struct CommCase {
    const char* name;
    std::vector<int32_t> ranks;
    int32_t num_ranks, rank;
    std::vector<std::string> words;
  };
  for (const CommCase& c : std::vector<CommCase>{
           {"rank_outside_world", {}, 0, 2, {"rank 2 is not in the rank list [0, 1]"}},
           {"rank_negative", {}, 0, -1, {"rank -1 is not in the rank list"}},
           {"num_ranks_zero", {0}, 0, 0, {"num_ranks is 0"}},
           {"num_ranks_above_world", {0, 1, 1}, 3, 0, {"num_ranks is 3", "the world's size"}},
           {"rank_list_outside_world", {0, 5}, 2, 0, {"ranks[1] = 5 is not a rank of the world"}},
           {"rank_list_duplicate", {0, 0}, 2, 0, {"world rank 0 appears twice"}},
           {"rank_not_in_list", {1}, 1, 0, {"rank 0 is not in the rank list [1]"}},
       }) {
    std::vector<std::string> words = c.words;
    words.insert(words.begin(), "muon_inprocess_comm");
    Case& added = add(std::string("inprocess_comm_") + c.name, E, IA, words,
                      comm_call(c.ranks, c.num_ranks, c.rank));
    added.prepare = world_of_2;
    added.verify = world_still_works;
  }
  add("comm_from_nccl_null_comm", E, IA, {"muon_comm_from_nccl", "nccl_comm is NULL"},
      [](Fixture& f) { return muon_comm_from_nccl(nullptr, &f.out.comm); });
  add("comm_from_nccl_null_out", E, IA, {"muon_comm_from_nccl", "out is NULL"},
      [](Fixture&) { return muon_comm_from_nccl(reinterpret_cast<void*>(0x1000), nullptr); });
  add("comm_from_nccl_without_nccl", E, MUON_UNAVAILABLE,
      {"muon_comm_from_nccl", "no NCCL is loaded"},
      [](Fixture& f) { return muon_comm_from_nccl(reinterpret_cast<void*>(0x1000), &f.out.comm); });
  // The in-process table's own callbacks, called by the host (world of one).
  add("inprocess_reduce_scatter_dtype_unknown", E, IA,
      {"reduce_scatter", "dtype 99 is unknown", "MUON_DTYPE_FLOAT32"},
      [](Fixture& f) { return f.table.reduce_scatter(f.table.ctx, f.A(), f.B(), 4, 99, nullptr); })
      .prepare = InProcessTable;
  add("inprocess_reduce_scatter_dtype_negative", E, IA, {"reduce_scatter", "dtype -1 is unknown"},
      [](Fixture& f) { return f.table.reduce_scatter(f.table.ctx, f.A(), f.B(), 4, -1, nullptr); })
      .prepare = InProcessTable;
  add("inprocess_all_gather_null_recv", E, IA, {"all_gather", "NULL recv buffer"}, [](Fixture& f) {
    return f.table.all_gather(f.table.ctx, f.A(), nullptr, 16, nullptr);
  }).prepare = InProcessTable;
  add("inprocess_broadcast_root_outside", E, IA, {"broadcast root 1 is outside the group of 1"},
      [](Fixture& f) { return f.table.broadcast(f.table.ctx, f.B(), 16, 1, nullptr); })
      .prepare = InProcessTable;
  add("inprocess_all_to_all_v_null_counts", E, IA, {"all_to_all_v", "NULL send_bytes array"},
      [](Fixture& f) {
        size_t offsets[1] = {0}, bytes[1] = {16};
        return f.table.all_to_all_v(f.table.ctx, f.A(), nullptr, offsets, f.B(), bytes, offsets,
                                    nullptr);
      })
      .prepare = InProcessTable;
  add("inprocess_all_gather_null_ctx", E, IA, {"all_gather", "ctx is NULL"}, [](Fixture& f) {
    return f.table.all_gather(nullptr, f.A(), f.B(), 16, nullptr);
  }).prepare = InProcessTable;
  add("inprocess_barrier_stream_without_gpu", E, MUON_UNIMPLEMENTED,
      {"non-NULL stream", "host memory only"},
      [](Fixture& f) { return f.table.barrier(f.table.ctx, reinterpret_cast<void*>(0x1)); })
      .prepare = InProcessTable;
  return t;
}

const std::vector<Case>& AllCases() {
  static const std::vector<Case>* cases = new std::vector<Case>(Cases());
  return *cases;
}

// ---------------------------------------------------------------------------
std::vector<std::string> RunCase(const Case& c) {
  std::vector<std::string> problems;
  Fixture f(c.setup);
  if (c.prepare) c.prepare(f);
  if (!f.setup_errors.empty()) return f.setup_errors;
  const Snapshot before = Take(f);
  const muon_status_t st = c.call(f);
  const std::string msg = muon_last_error_message();
  if (st != c.expected) {
    problems.push_back(std::string("returned ") + muon_status_string(st) + ", expected " +
                       muon_status_string(c.expected) + " (message: \"" + msg + "\")");
  }
  for (const std::string& w : c.words) {
    if (msg.find(w) == std::string::npos) {
      problems.push_back("the message \"" + msg + "\" does not say \"" + w + "\"");
    }
  }
  for (std::string& d : Compare(before, Take(f))) problems.push_back(std::move(d));
  if (c.verify) {
    for (std::string& p : c.verify(f)) problems.push_back(std::move(p));
  }
  for (std::string& p : FollowUp(f)) problems.push_back(std::move(p));
  return problems;
}

class Misuse : public ::testing::TestWithParam<size_t> {};

TEST_P(Misuse, ClearErrorAndNothingChanged) {
  const Case& c = AllCases()[GetParam()];
  SCOPED_TRACE(c.name + " (" + SetupName(c.setup) + ")");
  const std::vector<std::string> problems = RunCase(c);
  if (c.known_failure != nullptr) {
    if (problems.empty()) {
      ADD_FAILURE() << c.name << " is listed as an expected failure (" << c.known_failure
                    << ") but passes now: remove the mark";
    } else {
      std::printf("expected failure: %s: %s (%s)\n", c.name.c_str(), c.known_failure,
                  problems.front().c_str());
    }
    return;
  }
  for (const std::string& p : problems) ADD_FAILURE() << p;
}

INSTANTIATE_TEST_SUITE_P(Cases, Misuse, ::testing::Range<size_t>(0, AllCases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return AllCases()[info.param].name;
                         });

TEST(MisuseTable, NamesAreUniqueAndEveryCaseNamesSomething) {
  std::map<std::string, int> seen;
  for (const Case& c : AllCases()) {
    EXPECT_EQ(++seen[c.name], 1) << c.name;
    EXPECT_FALSE(c.words.empty()) << c.name;
    EXPECT_NE(c.expected, MUON_OK) << c.name;
  }
  EXPECT_GE(AllCases().size(), 120u);
}

// Arguments the header documents as accepted (no status to return).
TEST(MisuseTable, DocumentedNoOps) {
  muon_destroy(nullptr);
  muon_inprocess_world_destroy(nullptr);
  muon_inprocess_world_abort(nullptr);
  muon_get_version(nullptr, nullptr, nullptr);
  muon_set_callback_error(nullptr);
  EXPECT_STREQ(muon_status_string(static_cast<muon_status_t>(999)), "UNRECOGNIZED_STATUS");
  EXPECT_STREQ(muon_status_string(static_cast<muon_status_t>(-1)), "UNRECOGNIZED_STATUS");
  muon_options_t o;
  ASSERT_EQ(muon_options_init(&o, sizeof o), MUON_OK);
  EXPECT_STREQ(muon_last_error_message(), "");  // a call that succeeds clears it
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  std::map<std::string, int> by_outcome;
  std::vector<std::string> order;
  int known = 0;
  for (const Case& c : AllCases()) {
    const std::string s = muon_status_string(c.expected);
    if (by_outcome[s]++ == 0) order.push_back(s);
    if (c.known_failure != nullptr) ++known;
  }
  std::string line = "misuse cases: " + std::to_string(AllCases().size()) + ", by outcome:";
  for (size_t i = 0; i < order.size(); ++i) {
    line += (i ? ", " : " ") + order[i] + " " + std::to_string(by_outcome[order[i]]);
  }
  line += "; expected failures: " + std::to_string(known);
  std::printf("%s\n", line.c_str());
  return rc;
}
