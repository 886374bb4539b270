#include "muon/engine/checkpoint.h"

#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

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
  WriteStateBlob(params, 42, Momenta(params), blob.data());

  Cursor c(blob);
  EXPECT_EQ(c.Text(8), "MUONSTAT");
  EXPECT_EQ(c.Next<uint32_t>(), 1u);  // format
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
    EXPECT_EQ(c.Next<uint16_t>(), 0u);
    ASSERT_EQ(c.Next<uint32_t>(), w.shape.size());
    for (int64_t d : w.shape) EXPECT_EQ(c.Next<int64_t>(), d);
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
  WriteStateBlob(params, 7, Momenta(params), blob.data());
  auto parsed = ParseStateBlob(params, blob.data(), blob.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->step_count, 7);
  ASSERT_EQ(parsed->momentum.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const unsigned char* m = parsed->momentum[k];
    ASSERT_GE(m, blob.data());
    ASSERT_LE(m + params[k].momentum.size(), blob.data() + blob.size());
    EXPECT_EQ(0, std::memcmp(m, params[k].momentum.data(), params[k].momentum.size()));
  }
}

TEST(StateBlob, NoParameters) {
  const std::vector<Param> none;
  EXPECT_EQ(StateBlobSize(none), 32u);
  std::vector<unsigned char> blob(StateBlobSize(none));
  WriteStateBlob(none, 3, {}, blob.data());
  auto parsed = ParseStateBlob(none, blob.data(), blob.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->step_count, 3);
  EXPECT_TRUE(parsed->momentum.empty());
}

TEST(StateBlob, EveryHeaderFieldIsValidated) {
  Storage a({3, 5}), b({2, 4, 3});
  const std::vector<Param> params = TwoParams(&a, &b);
  std::vector<unsigned char> good(StateBlobSize(params));
  WriteStateBlob(params, 5, Momenta(params), good.data());
  struct Case {
    size_t at;          // byte offset of the field
    int64_t value;      // written over it (little-endian, `width` bytes)
    size_t width;
    const char* words;  // what the message must say
  };
  const size_t first_param = 32 + 4 + 1;  // header, name length, "w"
  const Case cases[] = {
      {12, 1, 4, "header word 'reserved' is 1"},
      {16, -1, 8, "step count -1 is negative"},
      {16, INT64_MIN, 8, "is negative"},
      // Found by fuzz/state_blob_fuzzer: the next muon_step overflowed the count.
      {16, INT64_MAX, 8, "step count 9223372036854775807 is out of range"},
      {first_param + 2, 7, 2, "param 'w': padding word is 7"},
  };
  for (const Case& c : cases) {
    std::vector<unsigned char> blob = good;
    std::memcpy(blob.data() + c.at, &c.value, c.width);
    auto parsed = ParseStateBlob(params, blob.data(), blob.size());
    ASSERT_FALSE(parsed.ok()) << c.words;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.words), std::string::npos) << parsed.status();
  }
}

TEST(StateBlob, ParseRefusesABlobOfOtherParams) {
  Storage a({3, 5}), b({2, 4, 3});
  const std::vector<Param> params = TwoParams(&a, &b);
  std::vector<unsigned char> blob(StateBlobSize(params));
  WriteStateBlob(params, 1, Momenta(params), blob.data());

  // Same names, first shape transposed.
  Storage a2({5, 3}), b2({2, 4, 3});
  const std::vector<Param> other = TwoParams(&a2, &b2);
  auto parsed = ParseStateBlob(other, blob.data(), blob.size());
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("param 'w'"), std::string::npos) << parsed.status();
  EXPECT_NE(parsed.status().message().find("[3, 5]"), std::string::npos) << parsed.status();
}

}  // namespace
}  // namespace muon
