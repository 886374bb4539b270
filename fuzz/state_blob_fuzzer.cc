// Fuzzes muon_load_state and muon_load_states through the C API. Each input
// goes to each entry point on a fresh optimizer with three host parameters of different shapes, dtypes and views
// (float32 2-D, bfloat16 batched, float16 flattened), stepped once so that
// momentum is not zero.
//
// Never crash. A refused blob changes nothing (every momentum buffer, read
// with muon_get_state, and muon_step_count are as before) and the optimizer
// still steps. An accepted blob is the optimizer's state: muon_save_state
// gives back exactly the input (a format-1 blob: the same state in format 2),
// and muon_step then succeeds and counts one more step. A format-2 blob that
// muon_load_state accepts, muon_load_states (the blob as the only one of a
// world of 1) accepts too, giving the same momentum and step count.
//
// An input starting with 'P' is a list of patches to the optimizer's own
// blob (3 bytes each: which field, what edit, a value), so that the header's
// and each parameter's fields meet edge values often; any other input is the
// blob itself.
//
// Seeds: MUON_FUZZ_WRITE_SEEDS=<dir> <binary> -runs=0 writes valid blobs of
// this optimizer (after 0, 1 and 3 steps) into <dir>.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "libmuon/muon.h"
#include "fuzz/fuzz_util.h"

namespace {

bool ValidStatus(muon_status_t st) {
  return std::strcmp(muon_status_string(st), "UNRECOGNIZED_STATUS") != 0;
}

// A host tensor and its storage.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
  DLTensor t{};

  HostTensor(std::vector<int64_t> s, DLDataType dtype) : shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    bytes.assign(static_cast<size_t>(n) * dtype.bits / 8, 0);
    t.data = bytes.data();
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
  }
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
};

constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kBF16{kDLBfloat, 16, 1};
constexpr DLDataType kF16{kDLFloat, 16, 1};

struct ParamSpec {
  const char* name;
  std::vector<int64_t> shape;
  DLDataType dtype;
  int32_t view;
};

const std::vector<ParamSpec>& Specs() {
  static const std::vector<ParamSpec> specs = {
      {"w0", {4, 3}, kF32, MUON_MATRIX_VIEW_2D},
      {"experts", {2, 3, 2}, kBF16, MUON_MATRIX_VIEW_BATCHED_LEADING},
      {"conv", {3, 2, 2}, kF16, MUON_MATRIX_VIEW_FLATTEN_TRAILING},
  };
  return specs;
}

// The optimizer of every input, with its parameters and gradients.
class Fixture {
 public:
  Fixture() {
    muon_options_t o;
    FUZZ_CHECK(muon_options_init(&o, sizeof o) == MUON_OK);
    FUZZ_CHECK(muon_create(&o, &opt_) == MUON_OK);
    for (const ParamSpec& s : Specs()) {
      params_.push_back(new HostTensor(s.shape, s.dtype));
      grads_.push_back(new HostTensor(s.shape, s.dtype));
      muon_param_options_t po;
      FUZZ_CHECK(muon_param_options_init(&po, sizeof po) == MUON_OK);
      po.name = s.name;
      po.matrix_view = s.view;
      int64_t id = -1;
      FUZZ_CHECK(muon_register_param(opt_, &params_.back()->t, &grads_.back()->t, &po, &id) ==
                 MUON_OK);
    }
  }
  ~Fixture() {
    muon_destroy(opt_);
    for (HostTensor* t : params_) delete t;
    for (HostTensor* t : grads_) delete t;
  }

  // Writes gradients (small finite values, varying with `salt`) and steps.
  muon_status_t Step(int salt) {
    for (size_t i = 0; i < grads_.size(); ++i) {
      HostTensor& g = *grads_[i];
      const size_t width = g.t.dtype.bits / 8;
      for (size_t k = 0; k < g.bytes.size() / width; ++k) {
        const unsigned m = static_cast<unsigned>((k * 7 + i * 3 + salt) % 11);
        if (width == 4) {
          const float v = (static_cast<float>(m) - 5) / 8;
          std::memcpy(&g.bytes[k * 4], &v, 4);
        } else {
          // A finite value in fp16 and in bf16 (exponent bits well inside the range).
          const uint16_t h = static_cast<uint16_t>((m & 1 ? 0x8000 : 0) | 0x3800 | (m << 4));
          std::memcpy(&g.bytes[k * 2], &h, 2);
        }
      }
    }
    return muon_step(opt_, nullptr);
  }

  // Every parameter's momentum bytes, through muon_get_state.
  std::vector<std::vector<unsigned char>> Momentum() const {
    std::vector<std::vector<unsigned char>> out;
    for (size_t i = 0; i < params_.size(); ++i) {
      DLDataType dtype;
      FUZZ_CHECK(muon_get_state_dtype(opt_, static_cast<int64_t>(i), &dtype) == MUON_OK);
      HostTensor dst(Specs()[i].shape, dtype);
      FUZZ_CHECK(muon_get_state(opt_, static_cast<int64_t>(i), &dst.t) == MUON_OK);
      out.push_back(dst.bytes);
    }
    return out;
  }

  int64_t StepCount() const {
    int64_t n = -1;
    FUZZ_CHECK(muon_step_count(opt_, &n) == MUON_OK);
    return n;
  }

  std::vector<unsigned char> Save() const {
    size_t size = 0;
    FUZZ_CHECK(muon_save_state(opt_, nullptr, 0, &size) == MUON_OK);
    std::vector<unsigned char> blob(size);
    size_t written = 0;
    FUZZ_CHECK(muon_save_state(opt_, blob.data(), blob.size(), &written) == MUON_OK);
    FUZZ_CHECK(written == size);
    return blob;
  }

  muon_optimizer_t* opt() { return opt_; }

 private:
  muon_optimizer_t* opt_ = nullptr;
  std::vector<HostTensor*> params_, grads_;
};

// The fields of this optimizer's blob (format 2 of checkpoint.h), as (offset, width).
std::vector<std::pair<size_t, size_t>> Fields() {
  std::vector<std::pair<size_t, size_t>> f = {{0, 8}, {8, 4}, {12, 4}, {16, 8}, {24, 8}};
  size_t at = 32;
  for (const ParamSpec& p : Specs()) {
    const size_t name = std::strlen(p.name);
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    f.push_back({at, 4});         // name length
    f.push_back({at + 4, name});  // name
    at += 4 + name;
    f.push_back({at, 1});      // momentum dtype
    f.push_back({at + 1, 1});  // view
    f.push_back({at + 2, 1});  // kind
    f.push_back({at + 3, 1});  // padding
    f.push_back({at + 4, 4});  // ndim
    at += 8;
    for (size_t d = 0; d < p.shape.size(); ++d, at += 8) f.push_back({at, 8});  // local dims
    f.push_back({at, 4});  // global ndim
    at += 4;
    for (size_t d = 0; d < p.shape.size(); ++d, at += 8) f.push_back({at, 8});  // global dims
    f.push_back({at, 8});                                                       // run count
    f.push_back({at + 8, 8});                                                   // run offset
    f.push_back({at + 16, 8});                                                  // run length
    at += 24;
    f.push_back({at, 8});  // byte count
    at += 8;
    f.push_back({at, static_cast<size_t>(n) * p.dtype.bits / 8});  // momentum
    at += static_cast<size_t>(n) * p.dtype.bits / 8;
  }
  return f;
}

// Applies the patches in [p, end) to `blob`: each picks a field, an edit and a value.
void Patch(const uint8_t* p, const uint8_t* end, std::vector<unsigned char>* blob) {
  static const std::vector<std::pair<size_t, size_t>> fields = Fields();
  static const int64_t kEdges[] = {
      0,   1,    2, -1, INT64_MAX, INT64_MIN, INT64_MAX - 1, int64_t{1} << 32, int64_t{1} << 62,
      255, 65535};
  for (; end - p >= 3; p += 3) {
    const auto [offset, width] = fields[p[0] % fields.size()];
    const uint8_t op = p[1] % 6, v = p[2];
    if (offset >= blob->size()) continue;
    const size_t n = std::min(width, blob->size() - offset);
    const int64_t edge = kEdges[v % (sizeof kEdges / sizeof kEdges[0])];
    switch (op) {
      case 0:
      case 1:  // an edge value over the field (little-endian host), sign-extended
        for (size_t i = 0; i < n; ++i) {
          (*blob)[offset + i] =
              i < 8 ? static_cast<unsigned char>(edge >> (8 * i)) : (edge < 0 ? 0xff : 0);
        }
        break;
      case 2: (*blob)[offset + v % n] ^= static_cast<unsigned char>(1u << (v % 8)); break;
      case 3: blob->resize(offset + v % (n + 1)); break;  // truncated inside the field
      case 4: blob->insert(blob->begin() + offset, v); break;
      default: blob->push_back(v); break;  // trailing bytes
    }
  }
}

void WriteSeeds(const char* dir) {
  int written = 0;
  for (int steps : {0, 1, 3}) {
    Fixture f;
    for (int s = 0; s < steps; ++s) FUZZ_CHECK(f.Step(s) == MUON_OK);
    const std::vector<unsigned char> blob = f.Save();
    const std::string path = std::string(dir) + "/blob_after_" + std::to_string(steps) + "_steps";
    FILE* out = std::fopen(path.c_str(), "wb");
    FUZZ_CHECK(out != nullptr);
    FUZZ_CHECK(std::fwrite(blob.data(), 1, blob.size(), out) == blob.size());
    std::fclose(out);
    ++written;
  }
  std::fprintf(stderr, "wrote %d seeds to %s\n", written, dir);
}


// Loads `blob` through one entry point: muon_load_state, or muon_load_states
// with the blob as the only one of a world of 1.
muon_status_t Load(Fixture& f, const std::vector<unsigned char>& blob, bool several) {
  if (!several) return muon_load_state(f.opt(), blob.data(), blob.size());
  const void* buffers[1] = {blob.data()};
  const size_t sizes[1] = {blob.size()};
  return muon_load_states(f.opt(), buffers, sizes, 1);
}

// A refused load changed nothing; an accepted one is stepped from.
void CheckOutcome(Fixture& f, muon_status_t st, const std::vector<std::vector<unsigned char>>& before,
                  int64_t steps_before) {
  FUZZ_CHECK(ValidStatus(st));
  if (st != MUON_OK) {
    FUZZ_CHECK(std::strlen(muon_last_error_message()) > 0);
    FUZZ_CHECK(f.Momentum() == before);
    FUZZ_CHECK(f.StepCount() == steps_before);
    FUZZ_CHECK(f.Step(2) == MUON_OK);
    FUZZ_CHECK(f.StepCount() == steps_before + 1);
    return;
  }
  FUZZ_CHECK(std::strlen(muon_last_error_message()) == 0);
  const int64_t loaded = f.StepCount();
  FUZZ_CHECK(loaded >= 0);
  const muon_status_t stepped = f.Step(2);
  if (loaded == std::numeric_limits<int64_t>::max() - 1) {
    // The largest count a blob holds: the next step is refused, changing
    // nothing (its state could not be saved again).
    FUZZ_CHECK(stepped == MUON_OUT_OF_RANGE);
    FUZZ_CHECK(f.StepCount() == loaded);
    return;
  }
  if (stepped != MUON_OK) std::fprintf(stderr, "step: %s\n", muon_last_error_message());
  FUZZ_CHECK(stepped == MUON_OK);
  FUZZ_CHECK(f.StepCount() == loaded + 1);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("MUON_FUZZ_WRITE_SEEDS")) WriteSeeds(dir);
  return 0;
}

// Every input goes to both entry points, each on its own fixture.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture one, many;
  FUZZ_CHECK(one.Step(1) == MUON_OK);
  FUZZ_CHECK(many.Step(1) == MUON_OK);
  const std::vector<std::vector<unsigned char>> before = one.Momentum();
  FUZZ_CHECK(many.Momentum() == before);
  const int64_t steps_before = one.StepCount();

  std::vector<unsigned char> blob(data, data + size);
  if (size > 0 && data[0] == 'P') {
    blob = one.Save();
    Patch(data + 1, data + size, &blob);
  }
  const muon_status_t st = Load(one, blob, false);
  std::vector<std::vector<unsigned char>> loaded_one;
  int64_t count_one = -1;
  if (st == MUON_OK) {
    loaded_one = one.Momentum();
    count_one = one.StepCount();
    uint32_t format = 0;
    std::memcpy(&format, blob.data() + 8, sizeof format);
    if (format == 2) {
      // The loaded state is the blob, byte for byte.
      const std::vector<unsigned char> saved = one.Save();
      if (saved != blob) {
        size_t at = 0;
        while (at < saved.size() && at < blob.size() && saved[at] == blob[at]) ++at;
        std::fprintf(stderr, "saved %zu bytes, loaded %zu; first difference at byte %zu\n",
                     saved.size(), blob.size(), at);
      }
      FUZZ_CHECK(saved == blob);
    } else {
      // A format-1 blob comes back as format 2 holding the same state.
      Fixture again;
      FUZZ_CHECK(Load(again, one.Save(), false) == MUON_OK);
      FUZZ_CHECK(again.Momentum() == loaded_one && again.StepCount() == count_one);
    }
  }
  CheckOutcome(one, st, before, steps_before);

  const muon_status_t st_many = Load(many, blob, true);
  if (st == MUON_OK && blob.size() > 12 && blob[8] == 2) {
    // What this rank's own entry point accepts, resume-anywhere accepts the same way.
    if (st_many != MUON_OK) std::fprintf(stderr, "load_states: %s\n", muon_last_error_message());
    FUZZ_CHECK(st_many == MUON_OK);
    FUZZ_CHECK(many.Momentum() == loaded_one && many.StepCount() == count_one);
  }
  CheckOutcome(many, st_many, before, steps_before);
  return 0;
}
