// The C <-> core conversions (convert.h, codes.h), checked value by value
// against the constants of muon.h.
#include "capi/convert.h"

#include <cstring>
#include <string>
#include <vector>

#include "muon/comm/codes.h"
#include "gtest/gtest.h"
#include "muon/comm/callback_error.h"

namespace muon {
namespace capi {
namespace {

bool Has(const absl::Status& s, const std::string& part) {
  return std::string(s.message()).find(part) != std::string::npos;
}

TEST(Codes, EveryStatusOfTheHeaderKeepsItsNumber) {
  const muon_status_t all[] = {MUON_OK,           MUON_CANCELLED,          MUON_UNKNOWN,
                               MUON_INVALID_ARGUMENT, MUON_NOT_FOUND,      MUON_ALREADY_EXISTS,
                               MUON_RESOURCE_EXHAUSTED, MUON_FAILED_PRECONDITION,
                               MUON_OUT_OF_RANGE, MUON_UNIMPLEMENTED,      MUON_INTERNAL,
                               MUON_UNAVAILABLE};
  for (muon_status_t c : all) {
    EXPECT_EQ(static_cast<int>(FromCStatus(c)), static_cast<int>(c)) << CStatusName(c);
    EXPECT_EQ(ToCStatus(FromCStatus(c)), c) << CStatusName(c);
  }
}

TEST(Codes, CodesTheHeaderLacks) {
  // absl codes with no MUON_* constant are reported as UNKNOWN ...
  for (absl::StatusCode k : {absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kAborted,
                             absl::StatusCode::kPermissionDenied, absl::StatusCode::kDataLoss,
                             absl::StatusCode::kUnauthenticated}) {
    EXPECT_EQ(ToCStatus(k), MUON_UNKNOWN) << absl::StatusCodeToString(k);
  }
  // ... while a host callback returning one of absl's numbers keeps it, and
  // anything else is unknown.
  EXPECT_EQ(FromCStatus(static_cast<muon_status_t>(4)), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(FromCStatus(static_cast<muon_status_t>(16)), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(FromCStatus(static_cast<muon_status_t>(17)), absl::StatusCode::kUnknown);
  EXPECT_EQ(FromCStatus(static_cast<muon_status_t>(-1)), absl::StatusCode::kUnknown);
  // Any int32 is a value of the enum (its range markers), read as UNKNOWN.
  EXPECT_EQ(FromCStatus(MUON_STATUS_RANGE_MAX_), absl::StatusCode::kUnknown);
  EXPECT_EQ(FromCStatus(MUON_STATUS_RANGE_MIN_), absl::StatusCode::kUnknown);
  EXPECT_EQ(FromCStatus(static_cast<muon_status_t>(999)), absl::StatusCode::kUnknown);
  EXPECT_TRUE(StatusFromC(MUON_OK, "ignored").ok());
  const absl::Status s = StatusFromC(MUON_UNAVAILABLE, "peer gone");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "peer gone");
}

TEST(Codes, ReduceScatterDtypes) {
  EXPECT_EQ(ToCDType(DType::kF32), MUON_DTYPE_FLOAT32);
  EXPECT_EQ(ToCDType(DType::kBF16), MUON_DTYPE_BFLOAT16);
  EXPECT_EQ(ToCDType(DType::kF16), MUON_DTYPE_FLOAT16);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    DType back = DType::kF32;
    ASSERT_TRUE(FromCDType(ToCDType(t), &back));
    EXPECT_EQ(back, t);
  }
  DType t = DType::kBF16;
  EXPECT_FALSE(FromCDType(3, &t));
  EXPECT_FALSE(FromCDType(-1, &t));
  EXPECT_EQ(t, DType::kBF16);  // untouched
}

// The bytes of two C option structs (both built from DefaultOptions, so
// padding is zero in both) are the same.
bool SameBytes(const muon_options_t& a, const muon_options_t& b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

TEST(Options, CDefaultsAreTheCoreDefaults) {
  muon_options_t c;
  DefaultOptions(&c);
  EXPECT_EQ(c.struct_size, sizeof c);
  absl::StatusOr<Options> o = OptionsFromC(c);
  ASSERT_TRUE(o.ok()) << o.status();
  muon_options_t back;
  back.struct_size = sizeof back;
  OptionsToC(Options(), &back);
  back.ns_table_rows = 0;  // the core's one fixed row, which FIXED leaves unset
  EXPECT_TRUE(SameBytes(back, c));
  // The header's documented defaults.
  EXPECT_EQ(c.lr, 1e-3);
  EXPECT_EQ(c.weight_decay, 0.1);
  EXPECT_EQ(c.momentum, 0.95);
  EXPECT_EQ(c.nesterov, 1);
  EXPECT_EQ(c.ns_steps, 5);
  EXPECT_EQ(c.ns_coefficients, MUON_NS_COEFFICIENTS_FIXED);
  EXPECT_EQ(c.ns_a, 3.4445);
  EXPECT_EQ(c.eps, 1e-7);
  EXPECT_EQ(c.ns_dtype, MUON_NS_DTYPE_BF16);
  EXPECT_EQ(c.adjust_lr, MUON_ADJUST_LR_ORIGINAL);
  EXPECT_EQ(c.assignment, MUON_ASSIGNMENT_BALANCED);
  EXPECT_EQ(c.prefetch_count, 1);
  EXPECT_EQ(c.async_parallelism, 1);
  EXPECT_EQ(c.round_bytes, size_t{256} << 20);
}

TEST(Options, EveryFieldRoundTrips) {
  muon_options_t c;
  DefaultOptions(&c);
  c.lr = 0.02;
  c.weight_decay = 0.01;
  c.momentum = 0.9;
  c.nesterov = 0;
  c.ns_steps = 7;
  c.ns_a = 2;
  c.ns_b = -1.5;
  c.ns_c = 0.5;
  c.eps = 1e-6;
  c.adjust_lr = MUON_ADJUST_LR_MATCH_RMS_ADAMW;
  c.ns_dtype = MUON_NS_DTYPE_FP32;
  c.momentum_fp32 = 1;
  c.assignment = MUON_ASSIGNMENT_ROUND_ROBIN;
  c.prefetch_count = 3;
  c.async_parallelism = 0;
  c.round_bytes = 4096;
  absl::StatusOr<Options> o = OptionsFromC(c);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->ns.coefficients, (std::vector<NsCoefficients>{{2, -1.5, 0.5}}));
  EXPECT_EQ(o->adjust_lr, AdjustLr::kMatchRmsAdamW);
  EXPECT_EQ(o->ns.dtype, NsDtype::kFP32);
  EXPECT_EQ(o->dist.assignment, Assignment::kRoundRobin);
  muon_options_t back;
  back.struct_size = sizeof back;
  OptionsToC(*o, &back);
  c.ns_table_rows = 1;  // what the copy handed out says of a FIXED row
  EXPECT_TRUE(SameBytes(back, c)) << "every field comes back as it went in";
}

TEST(Options, TablesAndPresets) {
  muon_options_t c;
  DefaultOptions(&c);
  const double table[] = {1, 2, 3, 4, 5, 6};
  c.ns_coefficients = MUON_NS_COEFFICIENTS_TABLE;
  c.ns_table = table;
  c.ns_table_rows = 2;
  absl::StatusOr<Options> o = OptionsFromC(c);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->ns.coefficients, (std::vector<NsCoefficients>{{1, 2, 3}, {4, 5, 6}}));
  muon_options_t back;
  back.struct_size = sizeof back;
  OptionsToC(*o, &back);
  EXPECT_EQ(back.ns_coefficients, MUON_NS_COEFFICIENTS_TABLE);
  EXPECT_EQ(back.ns_table_rows, 2);

  c.ns_coefficients = MUON_NS_COEFFICIENTS_POLAR_EXPRESS;
  o = OptionsFromC(c);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->ns.coefficients, PolarExpressCoefficients());

  c.ns_coefficients = MUON_NS_COEFFICIENTS_TABLE;
  c.ns_table = nullptr;
  EXPECT_TRUE(Has(OptionsFromC(c).status(), "options->ns_table (ns_coefficients = TABLE) is NULL"));
  c.ns_table = table;
  c.ns_table_rows = 0;
  EXPECT_TRUE(Has(OptionsFromC(c).status(), "options->ns_table_rows is 0"));
  c.ns_coefficients = 9;
  EXPECT_TRUE(Has(OptionsFromC(c).status(), "options->ns_coefficients: unknown value 9"));
}

TEST(Options, ErrorsNameTheField) {
  muon_options_t c;
  DefaultOptions(&c);
  c.ns_dtype = 5;
  EXPECT_TRUE(Has(OptionsFromC(c).status(), "options->ns_dtype: unknown value 5"));
  DefaultOptions(&c);
  c.adjust_lr = -1;
  EXPECT_TRUE(Has(OptionsFromC(c).status(), "options->adjust_lr: unknown value -1"));
  DefaultOptions(&c);
  c.reserved1 = 1;
  EXPECT_TRUE(Has(OptionsFromC(c).status(), "options->reserved1 is 1; it must be 0"));
  DefaultOptions(&c);
  c.reserved0 = 2;
  EXPECT_TRUE(Has(OptionsFromC(c).status(), "options->reserved0 is 2; it must be 0"));
  DefaultOptions(&c);
  c.lr = -1;
  const absl::Status s = OptionsFromC(c).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s, "options->lr: ")) << s;
  DefaultOptions(&c);
  c.assignment = MUON_ASSIGNMENT_CUSTOM;  // without assign_fn
  EXPECT_TRUE(Has(OptionsFromC(c).status(), "options->assign_fn")) << OptionsFromC(c).status();
  DefaultOptions(&c);
  c.struct_size = kOptionsV1Size - 1;
  EXPECT_TRUE(Has(OptionsFromC(c).status(), "options->struct_size is"));
}

TEST(Options, AnOlderCallersStructTakesTheDefaultsPastItsEnd) {
  muon_options_t c;
  DefaultOptions(&c);
  c.lr = 0.5;
  c.prefetch_count = 9;   // beyond the first version: must not be read
  c.async_parallelism = 0;
  c.struct_size = kOptionsV1Size;
  absl::StatusOr<Options> o = OptionsFromC(c);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->lr, 0.5);
  EXPECT_EQ(o->dist.prefetch_count, Options().dist.prefetch_count);
  EXPECT_TRUE(o->dist.async_parallelism);
  // And OptionsToC writes no byte past an older caller's struct.
  std::vector<unsigned char> buf(sizeof(muon_options_t) + 16, 0xee);
  muon_options_t* out = reinterpret_cast<muon_options_t*>(buf.data());
  out->struct_size = kOptionsV1Size;
  OptionsToC(*o, out);
  EXPECT_EQ(out->struct_size, kOptionsV1Size);
  EXPECT_EQ(out->lr, 0.5);
  for (size_t i = kOptionsV1Size; i < buf.size(); ++i) EXPECT_EQ(buf[i], 0xee) << i;
}

TEST(ParamOptions, NullIsTheDefaults) {
  auto no_groups = [](int g) -> absl::StatusOr<int> {
    return absl::InvalidArgumentError(absl::StrCat("group ", g, " is not known"));
  };
  absl::StatusOr<ParamRegistration> r = ParamOptionsFromC(nullptr, no_groups);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->name, "");
  EXPECT_EQ(r->view, MUON_MATRIX_VIEW_2D);
  EXPECT_FALSE(r->has_layout);
  EXPECT_FALSE(r->dist.zero2);
}

TEST(ParamOptions, PlacementsAndSizes) {
  muon_param_options_t po;
  DefaultParamOptions(&po);
  po.name = "w";
  po.matrix_view = MUON_MATRIX_VIEW_FLATTEN_TRAILING;
  const int64_t shape[] = {8, 6};
  const int64_t sizes[] = {5, 3};
  muon_placement_t pl[3];
  std::memset(pl, 0, sizeof pl);
  pl[0].kind = MUON_PLACEMENT_REPLICATE;
  pl[0].group = 2;
  pl[1].kind = MUON_PLACEMENT_SHARD;
  pl[1].group = 1;
  pl[1].dim = 0;
  pl[1].split = MUON_SPLIT_SIZES;
  pl[1].sizes = sizes;
  pl[2].kind = MUON_PLACEMENT_FLAT_RANGE;
  pl[2].group = 0;
  pl[2].start = 4;
  pl[2].length = 7;
  po.global_ndim = 2;
  po.global_shape = shape;
  po.num_placements = 3;
  po.placements = pl;
  auto two = [](int) -> absl::StatusOr<int> { return 2; };
  absl::StatusOr<ParamRegistration> r = ParamOptionsFromC(&po, two);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->name, "w");
  EXPECT_EQ(r->view, MUON_MATRIX_VIEW_FLATTEN_TRAILING);
  EXPECT_TRUE(r->has_layout);
  EXPECT_EQ(r->dist.global_shape, (std::vector<int64_t>{8, 6}));
  ASSERT_EQ(r->dist.placements.size(), 3u);
  EXPECT_EQ(r->dist.placements[0].kind, PlacementKind::kReplicate);
  EXPECT_EQ(r->dist.placements[0].group, 2);
  EXPECT_EQ(r->dist.placements[1].kind, PlacementKind::kShard);
  EXPECT_EQ(r->dist.placements[1].split, ShardSplit::kSizes);
  EXPECT_EQ(r->dist.placements[1].sizes, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(r->dist.placements[2].kind, PlacementKind::kFlatRange);
  EXPECT_EQ(r->dist.placements[2].start, 4);
  EXPECT_EQ(r->dist.placements[2].length, 7);

  pl[1].sizes = nullptr;
  EXPECT_TRUE(Has(ParamOptionsFromC(&po, two).status(),
                  "param 'w': placement 1 uses SPLIT_SIZES but sizes is NULL"));
  pl[1].sizes = sizes;
  auto unknown = [](int g) -> absl::StatusOr<int> {
    return absl::InvalidArgumentError(absl::StrCat("group ", g, " is not known"));
  };
  EXPECT_TRUE(Has(ParamOptionsFromC(&po, unknown).status(),
                  "param 'w': placement 1: group 1 is not known"));
  pl[2].kind = 7;
  EXPECT_TRUE(Has(ParamOptionsFromC(&po, two).status(), "placement 2 has unknown kind 7"));
  pl[2].kind = MUON_PLACEMENT_SHARD;
  pl[2].split = 4;
  EXPECT_TRUE(Has(ParamOptionsFromC(&po, two).status(), "placement 2 has unknown split 4"));
}

TEST(ParamOptions, Errors) {
  auto two = [](int) -> absl::StatusOr<int> { return 2; };
  muon_param_options_t po;
  DefaultParamOptions(&po);
  po.name = "w";
  po.reserved0 = 1;
  EXPECT_TRUE(Has(ParamOptionsFromC(&po, two).status(), "options->reserved0 must be 0"));
  DefaultParamOptions(&po);
  po.name = "w";
  po.replicated_mode = MUON_REPLICATED_ZERO2;
  EXPECT_TRUE(Has(ParamOptionsFromC(&po, two).status(),
                  "param 'w': MUON_REPLICATED_ZERO2 needs global_shape"));
  po.replicated_mode = 5;
  EXPECT_TRUE(Has(ParamOptionsFromC(&po, two).status(), "options->replicated_mode: unknown value 5"));
  DefaultParamOptions(&po);
  po.name = "w";
  po.num_placements = 1;  // but no global shape
  EXPECT_TRUE(Has(ParamOptionsFromC(&po, two).status(),
                  "options->global_ndim (0) and global_shape must describe"));
  DefaultParamOptions(&po);
  po.struct_size = kParamOptionsV1Size - 1;
  EXPECT_TRUE(Has(ParamOptionsFromC(&po, two).status(), "options->struct_size is"));
}

struct CallbackState {
  int assign_calls = 0;
};

int32_t AssignWithDetail(void* state, const char* name, int32_t world) {
  ++static_cast<CallbackState*>(state)->assign_calls;
  if (std::string(name) != "w") return -1;
  SetCallbackError("no owner for you");
  return world;  // out of range: the engine refuses it, with the detail
}

muon_status_t GatherFails(void*, const float*, int64_t, int32_t, muon_gathered_t*, void*) {
  SetCallbackError("link down");
  return MUON_UNAVAILABLE;
}

muon_status_t RedistributeOk(void*, const float*, int64_t, int64_t, int32_t, float* local,
                             int64_t n, void*) {
  for (int64_t i = 0; i < n; ++i) local[i] = 1.5f;
  return MUON_OK;
}

TEST(Custom, CallbacksBecomeCoreFunctionsWithTheirDetail) {
  muon_param_options_t po;
  DefaultParamOptions(&po);
  po.name = "w";
  CallbackState state;
  muon_custom_layout_t layout;
  std::memset(&layout, 0, sizeof layout);
  layout.struct_size = sizeof layout;
  layout.state = &state;
  layout.global_rows = 4;
  layout.global_cols = 3;
  layout.assign_fn = AssignWithDetail;
  layout.gather_fn = GatherFails;
  layout.redistribute_fn = RedistributeOk;
  absl::StatusOr<CustomRegistration> r = CustomFromC(po, layout);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->name, "w");
  EXPECT_EQ(r->rows, 4);
  EXPECT_EQ(r->cols, 3);
  std::string detail;
  EXPECT_EQ(r->path->assign(8, &detail), 8);
  EXPECT_EQ(detail, "no owner for you");
  EXPECT_EQ(state.assign_calls, 1);
  const float* full = nullptr;
  int64_t rows = 0, cols = 0;
  float local[2] = {0, 0};
  const absl::Status g = r->path->gather(local, 2, 0, &full, &rows, &cols, nullptr);
  EXPECT_EQ(g.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(g.message(), "link down");
  EXPECT_TRUE(TakeCallbackError().empty());  // taken by the wrapper
  EXPECT_TRUE(r->path->redistribute(nullptr, 4, 3, 0, local, 2, nullptr).ok());
  EXPECT_EQ(local[1], 1.5f);

  po.num_placements = 1;
  EXPECT_TRUE(Has(CustomFromC(po, layout).status(),
                  "a custom-path parameter takes no global_shape, placements or replicated_mode"));
  po.num_placements = 0;
  layout.struct_size = sizeof layout - 1;
  EXPECT_TRUE(Has(CustomFromC(po, layout).status(), "layout->struct_size is"));
}

TEST(Stats, EveryCounterIsCopied) {
  StepStats s;
  s.steps = 1;
  s.traffic.bytes_sent = 2;
  s.traffic.bytes_received = 3;
  s.traffic.collectives = 4;
  s.rounds = 5;
  s.matrices_orthogonalized = 6;
  s.ns_flops = 7.5;
  s.matrices_total = 8;
  s.matrices_owned = 9;
  muon_stats_t c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  StatsToC(s, &c);
  EXPECT_EQ(c.struct_size, sizeof c);
  EXPECT_EQ(c.steps, 1);
  EXPECT_EQ(c.bytes_sent, 2);
  EXPECT_EQ(c.bytes_received, 3);
  EXPECT_EQ(c.collectives, 4);
  EXPECT_EQ(c.rounds, 5);
  EXPECT_EQ(c.matrices_orthogonalized, 6);
  EXPECT_EQ(c.ns_flops, 7.5);
  EXPECT_EQ(c.matrices_total, 8);
  EXPECT_EQ(c.matrices_owned, 9);
}

}  // namespace
}  // namespace capi
}  // namespace muon
