#include "muon/engine/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"

namespace muon {
namespace {

constexpr char kMagic[8] = {'M', 'U', 'O', 'N', 'S', 'T', 'A', 'T'};
constexpr uint32_t kFormat = 2;         // written; format 1 is still read
constexpr uint32_t kFormatMoments = 3;  // written with NorMuon moments

class Writer {
 public:
  explicit Writer(unsigned char* out) : p_(out) {}
  template <typename T>
  void Put(T v) {
    std::memcpy(p_, &v, sizeof v);
    p_ += sizeof v;
  }
  void Bytes(const void* src, size_t n) {
    if (n) std::memcpy(p_, src, n);
    p_ += n;
  }

 private:
  unsigned char* p_;
};

class Reader {
 public:
  Reader(const unsigned char* data, size_t size) : p_(data), end_(data + size) {}
  template <typename T>
  bool Get(T* v) {
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) return false;
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  const unsigned char* Skip(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) return nullptr;
    const unsigned char* at = p_;
    p_ += n;
    return at;
  }
  bool AtEnd() const { return p_ == end_; }
  size_t Remaining() const { return static_cast<size_t>(end_ - p_); }

 private:
  const unsigned char* p_;
  const unsigned char* end_;
};

absl::Status Truncated(const std::string& where) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": the blob ends too early (truncated)"));
}

}  // namespace

size_t StateBlobSize(const std::vector<Param>& params,
                     const std::vector<SavedMoments>* moments) {
  size_t n = sizeof kMagic + 4 + 4 + 8 + 8;
  if (moments != nullptr) {
    n += 8;
    for (const SavedMoments& m : *moments) n += 4 + m.name.size() + 8 + 8 + 4 * m.values.size();
  }
  for (const Param& p : params) {
    n += 4 + p.name.size() + 4 + 4 + 8 * p.value.shape.size() + 4 + 8 * p.global_shape.size() +
         8 + 16 * SavedRuns(p).size() + 8 + p.momentum.size();
  }
  return n;
}

std::vector<Run> SavedRuns(const Param& p) {
  // The custom path's global layout is the host's: its bytes are local only.
  if (p.custom != nullptr || !p.holds_state || p.momentum.empty()) return {};
  return p.piece.runs;
}

void WriteStateBlob(const std::vector<Param>& params, int64_t step_count,
                    const std::vector<const void*>& momentum,
                    const std::vector<SavedMoments>* moments, unsigned char* out) {
  Writer w(out);
  w.Bytes(kMagic, sizeof kMagic);
  w.Put<uint32_t>(moments != nullptr ? kFormatMoments : kFormat);
  w.Put<uint32_t>(0);
  w.Put<int64_t>(step_count);
  w.Put<uint64_t>(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    w.Put<uint32_t>(static_cast<uint32_t>(p.name.size()));
    w.Bytes(p.name.data(), p.name.size());
    w.Put<uint8_t>(static_cast<uint8_t>(p.state_dtype));
    w.Put<uint8_t>(static_cast<uint8_t>(p.view));
    w.Put<uint8_t>(p.custom != nullptr ? kLocalOnly : kGlobalRuns);
    w.Put<uint8_t>(0);
    w.Put<uint32_t>(static_cast<uint32_t>(p.value.shape.size()));
    for (int64_t d : p.value.shape) w.Put<int64_t>(d);
    w.Put<uint32_t>(static_cast<uint32_t>(p.global_shape.size()));
    for (int64_t d : p.global_shape) w.Put<int64_t>(d);
    const std::vector<Run> runs = SavedRuns(p);
    w.Put<uint64_t>(runs.size());
    for (const Run& r : runs) {
      w.Put<int64_t>(r.offset);
      w.Put<int64_t>(r.length);
    }
    w.Put<uint64_t>(p.momentum.size());
    w.Bytes(momentum[i], p.momentum.size());
  }
  if (moments == nullptr) return;
  w.Put<uint64_t>(moments->size());
  for (const SavedMoments& m : *moments) {
    w.Put<uint32_t>(static_cast<uint32_t>(m.name.size()));
    w.Bytes(m.name.data(), m.name.size());
    w.Put<int64_t>(m.index);
    w.Put<int64_t>(static_cast<int64_t>(m.values.size()));
    w.Bytes(m.values.data(), 4 * m.values.size());
  }
}

namespace {

absl::Status Bad(const std::string& who, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(who, ": ", what));
}

absl::Status GetDims(Reader& r, const std::string& who, const char* which,
                     std::vector<int64_t>* dims, int64_t* numel) {
  uint32_t ndim = 0;
  if (!r.Get(&ndim)) return Truncated(who);
  // A corrupted count must not allocate: the dims have to be in the blob.
  if (ndim > r.Remaining() / sizeof(int64_t)) return Truncated(who);
  dims->resize(ndim);
  *numel = 1;
  for (auto& d : *dims) {
    if (!r.Get(&d)) return Truncated(who);
    if (d < 0) return Bad(who, absl::StrCat(which, " shape has a negative dimension"));
    if (d != 0 && *numel > std::numeric_limits<int64_t>::max() / d) {
      return Bad(who, absl::StrCat(which, " shape ", ShapeString(*dims), " overflows"));
    }
    *numel *= d;
  }
  return absl::OkStatus();
}

// Format 3's section: every matrix's NorMuon moments.
absl::Status ParseMoments(Reader& r, const std::string& blob, std::vector<SavedMoments>* out) {
  uint64_t count = 0;
  if (!r.Get(&count)) return Truncated(absl::StrCat(blob, ", NorMuon moments"));
  // A corrupted count must not allocate: an entry takes at least 20 bytes.
  out->reserve(static_cast<size_t>(std::min<uint64_t>(count, r.Remaining() / 20)));
  std::set<std::pair<std::string, int64_t>> seen;
  for (uint64_t k = 0; k < count; ++k) {
    SavedMoments& m = out->emplace_back();
    std::string who = absl::StrCat(blob, ", NorMuon moments entry ", k);
    uint32_t name_len = 0;
    int64_t rows = 0;
    if (!r.Get(&name_len)) return Truncated(who);
    const unsigned char* name = r.Skip(name_len);
    if (name == nullptr || !r.Get(&m.index) || !r.Get(&rows)) return Truncated(who);
    m.name.assign(reinterpret_cast<const char*>(name), name_len);
    who = absl::StrCat(blob, ", param '", m.name, "' matrix ", m.index, " (NorMuon moments)");
    if (m.index < 0) return Bad(who, "the matrix index is negative");
    if (rows < 0) return Bad(who, absl::StrCat("the row count ", rows, " is negative"));
    if (static_cast<uint64_t>(rows) > r.Remaining() / 4) return Truncated(who);
    if (!seen.insert({m.name, m.index}).second) return Bad(who, "is listed twice");
    m.values.resize(static_cast<size_t>(rows));
    const unsigned char* bytes = r.Skip(4 * static_cast<size_t>(rows));
    if (rows > 0) std::memcpy(m.values.data(), bytes, 4 * static_cast<size_t>(rows));
    for (float v : m.values) {
      if (!(v >= 0) || !std::isfinite(v)) {
        return Bad(who, absl::StrCat("holds the moment ", v,
                                     " (second moments are finite and >= 0)"));
      }
    }
  }
  return absl::OkStatus();
}

// The header after the magic bytes: format, reserved word, step count, and
// the number of parameter entries (*count).
absl::Status ParseHeader(Reader& r, const std::string& blob, SavedState* out, uint64_t* count) {
  uint32_t reserved = 0;
  if (!r.Get(&out->format) || !r.Get(&reserved) || !r.Get(&out->step_count) || !r.Get(count)) {
    return Truncated(absl::StrCat(blob, " header"));
  }
  if (out->format < 1 || out->format > kFormatMoments) {
    return Bad(blob, absl::StrCat("format version ", out->format,
                                  " is not supported (1, 2 and 3 are)"));
  }
  if (reserved != 0) {
    return Bad(blob, absl::StrCat("header word 'reserved' is ", reserved,
                                  " (a libmuon blob writes 0)"));
  }
  if (out->step_count < 0) {
    return Bad(blob, absl::StrCat("step count ", out->step_count, " is negative"));
  }
  if (out->step_count > kMaxSavedStepCount) {
    return Bad(blob, absl::StrCat("step count ", out->step_count,
                                  " is out of range (the next step could not be counted)"));
  }
  return absl::OkStatus();
}

// An entry's kind and padding (format 2 on; format 1 has padding only and
// no global coordinates).
absl::Status ParseKind(Reader& r, const std::string& who, uint32_t format, SavedParam* sp) {
  if (format >= 2) {
    uint8_t pad8 = 0;
    if (!r.Get(&sp->kind) || !r.Get(&pad8)) return Truncated(who);
    if (sp->kind != kGlobalRuns && sp->kind != kLocalOnly) {
      return Bad(who, absl::StrCat("unknown entry kind ", static_cast<int>(sp->kind)));
    }
    if (pad8 != 0) {
      return Bad(who, absl::StrCat("padding word is ", static_cast<int>(pad8),
                                   " (a libmuon blob writes 0)"));
    }
    return absl::OkStatus();
  }
  uint16_t pad = 0;
  if (!r.Get(&pad)) return Truncated(who);
  if (pad != 0) {
    return Bad(who, absl::StrCat("padding word is ", pad, " (a libmuon blob writes 0)"));
  }
  sp->kind = kLocalOnly;  // format 1 carries no global coordinates
  return absl::OkStatus();
}

// An entry's global runs (format 2 on), into sp->runs; *held: their
// elements.
absl::Status ParseRuns(Reader& r, const std::string& who, int64_t global_numel, SavedParam* sp,
                       int64_t* held) {
  uint64_t runs = 0;
  if (!r.Get(&runs)) return Truncated(who);
  if (runs > r.Remaining() / 16) return Truncated(who);
  sp->runs.resize(static_cast<size_t>(runs));
  // The runs are checked together, not one by one: the writer lists a
  // piece's runs in increasing global order (the order every placement
  // gives, layout.h), so each must start at or after the end of the one
  // before. Overlapping runs would give one element two sets of bytes
  // (and let a restore pick either); ordered, disjoint runs inside the
  // tensor also bound their sum by `global_numel`, so it cannot overflow.
  int64_t end = 0;
  *held = 0;
  for (size_t i = 0; i < sp->runs.size(); ++i) {
    Run& run = sp->runs[i];
    if (!r.Get(&run.offset) || !r.Get(&run.length)) return Truncated(who);
    if (run.offset < 0 || run.length < 0 || run.offset > global_numel ||
        run.length > global_numel - run.offset) {
      return Bad(who, absl::StrCat("run [", run.offset, ", +", run.length,
                                   ") is outside its ", global_numel, " global elements"));
    }
    if (run.offset < end) {
      return Bad(who, absl::StrCat(
          "run ", i, " [", run.offset, ", +", run.length, ") starts before the end ", end,
          " of run ", i - 1, " (runs are in increasing global order, without overlap)"));
    }
    end = run.offset + run.length;  // <= global_numel, checked above
    *held += run.length;            // <= end: the runs before lie below run.offset
  }
  if (sp->kind == kLocalOnly && !sp->runs.empty()) {
    return Bad(who, "a local-only entry (custom path) lists global runs");
  }
  return absl::OkStatus();
}

// Parameter entry `k` of a blob of `format`, into *sp; its momentum bytes
// stay in the blob (sp->bytes).
absl::Status ParseParam(Reader& r, const std::string& blob, uint32_t format, uint64_t k,
                        SavedParam* sp) {
  std::string who = absl::StrCat(blob, ", parameter ", k);
  uint32_t name_len = 0;
  if (!r.Get(&name_len)) return Truncated(who);
  const unsigned char* name = r.Skip(name_len);
  if (name == nullptr) return Truncated(who);
  sp->name.assign(reinterpret_cast<const char*>(name), name_len);
  who = absl::StrCat(blob, ", param '", sp->name, "'");
  uint8_t dtype = 0;
  if (!r.Get(&dtype) || !r.Get(&sp->view)) return Truncated(who);
  MUON_RETURN_IF_ERROR(ParseKind(r, who, format, sp));
  if (dtype > 2) return Bad(who, absl::StrCat("unknown momentum dtype ", static_cast<int>(dtype)));
  sp->state_dtype = static_cast<DType>(dtype);
  int64_t local_numel = 0, global_numel = 0;
  MUON_RETURN_IF_ERROR(GetDims(r, who, "local", &sp->local_shape, &local_numel));
  if (format >= 2) {
    MUON_RETURN_IF_ERROR(GetDims(r, who, "global", &sp->global_shape, &global_numel));
    int64_t held = 0;
    MUON_RETURN_IF_ERROR(ParseRuns(r, who, global_numel, sp, &held));
    sp->held = sp->kind == kGlobalRuns ? held : local_numel;
  } else {
    sp->global_shape = sp->local_shape;
    sp->held = local_numel;
  }
  if (!r.Get(&sp->nbytes)) return Truncated(who);
  // Compared by division: held * element size can pass 2^64 for a made-up
  // shape, and a wrapped product would match a few bytes for many elements.
  const uint64_t elem = SizeOf(sp->state_dtype);
  if (sp->nbytes != 0 &&
      (sp->nbytes % elem != 0 || sp->nbytes / elem != static_cast<uint64_t>(sp->held))) {
    return Bad(who, absl::StrCat("holds ", sp->nbytes, " momentum bytes for ", sp->held,
                                 " elements of ", DTypeName(sp->state_dtype)));
  }
  if (sp->nbytes == 0) sp->held = 0;  // no state here (a ZeRO-2 param another rank owned)
  sp->bytes = r.Skip(static_cast<size_t>(sp->nbytes));
  if (sp->bytes == nullptr) return Truncated(who);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SavedState> ParseStateBlob(const unsigned char* data, size_t size,
                                          const std::string& blob) {
  Reader r(data, size);
  const unsigned char* magic = r.Skip(sizeof kMagic);
  if (magic == nullptr || std::memcmp(magic, kMagic, sizeof kMagic) != 0) {
    return Bad(blob, "not a libmuon state (bad magic bytes)");
  }
  SavedState out;
  uint64_t count = 0;
  MUON_RETURN_IF_ERROR(ParseHeader(r, blob, &out, &count));
  // A corrupted count must not allocate: an entry takes at least 20 bytes.
  out.params.reserve(static_cast<size_t>(std::min<uint64_t>(count, r.Remaining() / 20)));
  for (uint64_t k = 0; k < count; ++k) {
    MUON_RETURN_IF_ERROR(ParseParam(r, blob, out.format, k, &out.params.emplace_back()));
  }
  if (out.format == kFormatMoments) MUON_RETURN_IF_ERROR(ParseMoments(r, blob, &out.moments));
  if (!r.AtEnd()) {
    return Bad(blob, out.format == kFormatMoments
                         ? "unexpected bytes after the last NorMuon moments"
                         : "unexpected bytes after the last parameter");
  }
  return out;
}

}  // namespace muon
