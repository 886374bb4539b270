#include "muon/engine/checkpoint.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace muon {
namespace {

constexpr char kMagic[8] = {'M', 'U', 'O', 'N', 'S', 'T', 'A', 'T'};
constexpr uint32_t kFormat = 1;

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

size_t StateBlobSize(const std::vector<Param>& params) {
  size_t n = sizeof kMagic + 4 + 4 + 8 + 8;
  for (const Param& p : params) {
    n += 4 + p.name.size() + 1 + 1 + 2 + 4 + 8 * p.value.shape.size() + 8 + p.momentum.size();
  }
  return n;
}

void WriteStateBlob(const std::vector<Param>& params, int64_t step_count,
                    const std::vector<const void*>& momentum, unsigned char* out) {
  Writer w(out);
  w.Bytes(kMagic, sizeof kMagic);
  w.Put<uint32_t>(kFormat);
  w.Put<uint32_t>(0);
  w.Put<int64_t>(step_count);
  w.Put<uint64_t>(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    w.Put<uint32_t>(static_cast<uint32_t>(p.name.size()));
    w.Bytes(p.name.data(), p.name.size());
    w.Put<uint8_t>(static_cast<uint8_t>(p.state_dtype));
    w.Put<uint8_t>(static_cast<uint8_t>(p.view));
    w.Put<uint16_t>(0);
    w.Put<uint32_t>(static_cast<uint32_t>(p.value.shape.size()));
    for (int64_t d : p.value.shape) w.Put<int64_t>(d);
    w.Put<uint64_t>(p.momentum.size());
    w.Bytes(momentum[i], p.momentum.size());
  }
}

absl::StatusOr<ParsedState> ParseStateBlob(const std::vector<Param>& params,
                                           const unsigned char* data, size_t size) {
  Reader r(data, size);
  const unsigned char* magic = r.Skip(sizeof kMagic);
  if (magic == nullptr || std::memcmp(magic, kMagic, sizeof kMagic) != 0) {
    return absl::InvalidArgumentError("state blob: not a libmuon state (bad magic bytes)");
  }
  uint32_t format = 0, reserved = 0;
  ParsedState out;
  uint64_t count = 0;
  if (!r.Get(&format) || !r.Get(&reserved) || !r.Get(&out.step_count) || !r.Get(&count)) {
    return Truncated("state blob header");
  }
  if (format != kFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat("state blob: format version ", format, " is not supported (expected ",
                     kFormat, ")"));
  }
  if (reserved != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state blob: header word 'reserved' is ", reserved, " (a libmuon blob writes 0)"));
  }
  if (out.step_count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("state blob: step count ", out.step_count, " is negative"));
  }
  if (out.step_count == std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state blob: step count ", out.step_count, " is out of range (the next step could not "
        "be counted)"));
  }
  if (count != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("state blob: holds ", count,
                                                   " parameters, the optimizer has ",
                                                   params.size()));
  }
  for (const Param& p : params) {
    const std::string who = absl::StrCat("state blob, param '", p.name, "'");
    uint32_t name_len = 0;
    if (!r.Get(&name_len)) return Truncated(who);
    const unsigned char* name = r.Skip(name_len);
    if (name == nullptr) return Truncated(who);
    const std::string saved_name(reinterpret_cast<const char*>(name), name_len);
    if (saved_name != p.name) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": the blob has '", saved_name, "' at this position; register the parameters "
          "in the order they were saved"));
    }
    uint8_t dtype = 0, view = 0;
    uint16_t pad = 0;
    uint32_t ndim = 0;
    if (!r.Get(&dtype) || !r.Get(&view) || !r.Get(&pad) || !r.Get(&ndim)) return Truncated(who);
    if (pad != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": padding word is ", pad, " (a libmuon blob writes 0)"));
    }
    // A corrupted ndim must not allocate: the dims have to be in the blob.
    if (ndim > r.Remaining() / sizeof(int64_t)) return Truncated(who);
    std::vector<int64_t> shape(ndim);
    for (auto& d : shape) {
      if (!r.Get(&d)) return Truncated(who);
    }
    if (shape != p.value.shape || view != static_cast<uint8_t>(p.view)) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": saved shape ", ShapeString(shape), " (view ", view,
                       ") differs from the registered ", ShapeString(p.value.shape), " (view ",
                       static_cast<int>(p.view), ")"));
    }
    if (dtype != static_cast<uint8_t>(p.state_dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": saved momentum dtype ", dtype > 2 ? "unknown" : DTypeName(DType(dtype)),
          " differs from this optimizer's ", DTypeName(p.state_dtype),
          " (check momentum_fp32 and the gradient dtype)"));
    }
    uint64_t nbytes = 0;
    if (!r.Get(&nbytes)) return Truncated(who);
    if (nbytes != p.momentum.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": holds ", nbytes, " momentum bytes, expected ", p.momentum.size()));
    }
    const unsigned char* bytes = r.Skip(nbytes);
    if (bytes == nullptr) return Truncated(who);
    out.momentum.push_back(bytes);
  }
  if (!r.AtEnd()) {
    return absl::InvalidArgumentError("state blob: unexpected bytes after the last parameter");
  }
  return out;
}

}  // namespace muon
