/*
 * The public header from a pure C99 program (built with -std=c99 -pedantic
 * -Wall -Wextra -Werror): the header must compile as C, its struct layout is
 * frozen here, and the library behaves as the header says through it.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libmuon/muon.h"

/* ------------------------------------------------------------------------ */
/* Frozen layout. C99 has no static_assert: an array of negative size is a   */
/* compile error. These numbers are the ABI; changing one breaks every       */
/* program built against an earlier header.                                  */
/* ------------------------------------------------------------------------ */

#define MUON_TEST_STATIC_ASSERT(cond, name) typedef char muon_layout_check_##name[(cond) ? 1 : -1]

#if defined(__x86_64__) || defined(_M_X64)
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, struct_size) == 0, opt_struct_size);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, lr) == 8, opt_lr);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, weight_decay) == 16, opt_weight_decay);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, momentum) == 24, opt_momentum);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, nesterov) == 32, opt_nesterov);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, ns_steps) == 36, opt_ns_steps);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, ns_a) == 40, opt_ns_a);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, ns_b) == 48, opt_ns_b);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, ns_c) == 56, opt_ns_c);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, eps) == 64, opt_eps);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, ns_coefficients) == 72, opt_ns_coefficients);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, ns_table_rows) == 76, opt_ns_table_rows);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, ns_table) == 80, opt_ns_table);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, adjust_lr) == 88, opt_adjust_lr);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, ns_dtype) == 92, opt_ns_dtype);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, momentum_fp32) == 96, opt_momentum_fp32);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, reserved0) == 100, opt_reserved0);
/* 0.2: grown at the end. */
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, assignment) == 104, opt_assignment);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, prefetch_count) == 108, opt_prefetch_count);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, async_parallelism) == 112, opt_async_parallelism);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, reserved1) == 116, opt_reserved1);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, round_bytes) == 120, opt_round_bytes);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, assign_fn) == 128, opt_assign_fn);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, assign_state) == 136, opt_assign_state);
/* 0.4: grown at the end. */
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, skip_nonfinite) == 144, opt_skip_nonfinite);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, allocate) == 152, opt_allocate);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, release) == 160, opt_release);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, allocator_ctx) == 168, opt_allocator_ctx);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, update_in_grad) == 176, opt_update_in_grad);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, update_scale) == 184, opt_update_scale);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, cautious_wd) == 192, opt_cautious_wd);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, reserved2) == 196, opt_reserved2);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, normuon) == 200, opt_normuon);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, reserved3) == 204, opt_reserved3);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, normuon_beta2) == 208, opt_normuon_beta2);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, normuon_eps) == 216, opt_normuon_eps);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, ns_algorithm) == 224, opt_ns_algorithm);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, skip_nonfinite_updates) == 228, opt_skip_updates);
MUON_TEST_STATIC_ASSERT(offsetof(muon_options_t, ns_gram_restarts) == 232, opt_gram_restarts);
MUON_TEST_STATIC_ASSERT(sizeof(muon_options_t) == 240, opt_sizeof);
MUON_TEST_STATIC_ASSERT(offsetof(muon_qk_clip_layer_t, num_heads) == 24, qk_num_heads);
MUON_TEST_STATIC_ASSERT(offsetof(muon_qk_clip_layer_t, q_first_row) == 32, qk_q_first_row);
MUON_TEST_STATIC_ASSERT(offsetof(muon_qk_clip_layer_t, k_head_rows) == 80, qk_k_head_rows);
MUON_TEST_STATIC_ASSERT(offsetof(muon_qk_clip_layer_t, alpha) == 88, qk_alpha);
MUON_TEST_STATIC_ASSERT(sizeof(muon_qk_clip_layer_t) == 96, qk_sizeof);

MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, struct_size) == 0, popt_struct_size);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, name) == 8, popt_name);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, matrix_view) == 16, popt_matrix_view);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, reserved0) == 20, popt_reserved0);
/* 0.2: grown at the end. */
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, global_ndim) == 24, popt_global_ndim);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, num_placements) == 28, popt_num_placements);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, global_shape) == 32, popt_global_shape);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, placements) == 40, popt_placements);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, replicated_mode) == 48, popt_replicated_mode);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, reserved1) == 52, popt_reserved1);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, lr_scale) == 56, popt_lr_scale);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, weight_decay_scale) == 64, popt_wd_scale);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, split_dim) == 72, popt_split_dim);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, num_split_sizes) == 76, popt_num_split);
MUON_TEST_STATIC_ASSERT(offsetof(muon_param_options_t, split_sizes) == 80, popt_split_sizes);
MUON_TEST_STATIC_ASSERT(sizeof(muon_param_options_t) == 88, popt_sizeof);

MUON_TEST_STATIC_ASSERT(offsetof(muon_placement_t, kind) == 0, pl_kind);
MUON_TEST_STATIC_ASSERT(offsetof(muon_placement_t, group) == 4, pl_group);
MUON_TEST_STATIC_ASSERT(offsetof(muon_placement_t, dim) == 8, pl_dim);
MUON_TEST_STATIC_ASSERT(offsetof(muon_placement_t, split) == 12, pl_split);
MUON_TEST_STATIC_ASSERT(offsetof(muon_placement_t, sizes) == 16, pl_sizes);
MUON_TEST_STATIC_ASSERT(offsetof(muon_placement_t, start) == 24, pl_start);
MUON_TEST_STATIC_ASSERT(offsetof(muon_placement_t, length) == 32, pl_length);
MUON_TEST_STATIC_ASSERT(sizeof(muon_placement_t) == 40, pl_sizeof);

MUON_TEST_STATIC_ASSERT(offsetof(muon_matrix_info_t, param_name) == 0, mi_param_name);
MUON_TEST_STATIC_ASSERT(offsetof(muon_matrix_info_t, index) == 8, mi_index);
MUON_TEST_STATIC_ASSERT(offsetof(muon_matrix_info_t, rows) == 16, mi_rows);
MUON_TEST_STATIC_ASSERT(offsetof(muon_matrix_info_t, cols) == 24, mi_cols);
MUON_TEST_STATIC_ASSERT(offsetof(muon_matrix_info_t, ns_flops) == 32, mi_ns_flops);
MUON_TEST_STATIC_ASSERT(offsetof(muon_matrix_info_t, holders) == 40, mi_holders);
MUON_TEST_STATIC_ASSERT(offsetof(muon_matrix_info_t, num_holders) == 48, mi_num_holders);
MUON_TEST_STATIC_ASSERT(offsetof(muon_matrix_info_t, reserved0) == 52, mi_reserved0);
MUON_TEST_STATIC_ASSERT(sizeof(muon_matrix_info_t) == 56, mi_sizeof);

MUON_TEST_STATIC_ASSERT(offsetof(muon_comm_t, struct_size) == 0, comm_struct_size);
MUON_TEST_STATIC_ASSERT(offsetof(muon_comm_t, ctx) == 8, comm_ctx);
MUON_TEST_STATIC_ASSERT(offsetof(muon_comm_t, rank) == 16, comm_rank);
MUON_TEST_STATIC_ASSERT(offsetof(muon_comm_t, size) == 20, comm_size);
MUON_TEST_STATIC_ASSERT(offsetof(muon_comm_t, all_gather) == 24, comm_all_gather);
MUON_TEST_STATIC_ASSERT(offsetof(muon_comm_t, all_to_all_v) == 32, comm_all_to_all_v);
MUON_TEST_STATIC_ASSERT(offsetof(muon_comm_t, broadcast) == 40, comm_broadcast);
MUON_TEST_STATIC_ASSERT(offsetof(muon_comm_t, reduce_scatter) == 48, comm_reduce_scatter);
MUON_TEST_STATIC_ASSERT(offsetof(muon_comm_t, barrier) == 56, comm_barrier);
MUON_TEST_STATIC_ASSERT(offsetof(muon_comm_t, release) == 64, comm_release);
MUON_TEST_STATIC_ASSERT(sizeof(muon_comm_t) == 72, comm_sizeof);

MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, struct_size) == 0, st_struct_size);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, steps) == 8, st_steps);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, bytes_sent) == 16, st_bytes_sent);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, bytes_received) == 24, st_bytes_received);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, collectives) == 32, st_collectives);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, rounds) == 40, st_rounds);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, matrices_orthogonalized) == 48, st_orthogonalized);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, ns_flops) == 56, st_ns_flops);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, matrices_total) == 64, st_matrices_total);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, matrices_owned) == 72, st_matrices_owned);
/* 0.4: grown at the end. */
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, nonfinite_grads) == 80, st_nonfinite_grads);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, steps_skipped) == 88, st_steps_skipped);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, memory_bytes) == 96, st_memory_bytes);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, momentum_bytes) == 104, st_momentum_bytes);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, param_elements) == 112, st_param_elements);
MUON_TEST_STATIC_ASSERT(offsetof(muon_stats_t, bytes_per_param) == 120, st_bytes_per_param);
MUON_TEST_STATIC_ASSERT(sizeof(muon_stats_t) == 128, st_sizeof);

MUON_TEST_STATIC_ASSERT(offsetof(muon_gathered_t, data) == 0, ga_data);
MUON_TEST_STATIC_ASSERT(offsetof(muon_gathered_t, rows) == 8, ga_rows);
MUON_TEST_STATIC_ASSERT(offsetof(muon_gathered_t, cols) == 16, ga_cols);
MUON_TEST_STATIC_ASSERT(sizeof(muon_gathered_t) == 24, ga_sizeof);

MUON_TEST_STATIC_ASSERT(offsetof(muon_custom_layout_t, struct_size) == 0, cl_struct_size);
MUON_TEST_STATIC_ASSERT(offsetof(muon_custom_layout_t, state) == 8, cl_state);
MUON_TEST_STATIC_ASSERT(offsetof(muon_custom_layout_t, global_rows) == 16, cl_global_rows);
MUON_TEST_STATIC_ASSERT(offsetof(muon_custom_layout_t, global_cols) == 24, cl_global_cols);
MUON_TEST_STATIC_ASSERT(offsetof(muon_custom_layout_t, assign_fn) == 32, cl_assign_fn);
MUON_TEST_STATIC_ASSERT(offsetof(muon_custom_layout_t, gather_fn) == 40, cl_gather_fn);
MUON_TEST_STATIC_ASSERT(offsetof(muon_custom_layout_t, redistribute_fn) == 48, cl_redistribute_fn);
MUON_TEST_STATIC_ASSERT(sizeof(muon_custom_layout_t) == 56, cl_sizeof);
#endif

/* Enum values are ABI too. */
MUON_TEST_STATIC_ASSERT(MUON_OK == 0 && MUON_INVALID_ARGUMENT == 3 && MUON_NOT_FOUND == 5 &&
                            MUON_ALREADY_EXISTS == 6 && MUON_RESOURCE_EXHAUSTED == 8 &&
                            MUON_FAILED_PRECONDITION == 9 && MUON_OUT_OF_RANGE == 11 &&
                            MUON_INTERNAL == 13,
                        status_codes);
MUON_TEST_STATIC_ASSERT(MUON_ADJUST_LR_ORIGINAL == 0 && MUON_ADJUST_LR_MATCH_RMS_ADAMW == 1 &&
                            MUON_ADJUST_LR_NONE == 2,
                        adjust_lr_values);
MUON_TEST_STATIC_ASSERT(MUON_NS_DTYPE_BF16 == 0 && MUON_NS_DTYPE_FP32 == 1, ns_dtype_values);
MUON_TEST_STATIC_ASSERT(MUON_MATRIX_VIEW_2D == 0 && MUON_MATRIX_VIEW_FLATTEN_TRAILING == 1 &&
                            MUON_MATRIX_VIEW_BATCHED_LEADING == 2,
                        matrix_view_values);
MUON_TEST_STATIC_ASSERT(MUON_UNIMPLEMENTED == 12 && MUON_UNAVAILABLE == 14, status_codes_0_2);
MUON_TEST_STATIC_ASSERT(MUON_ADJUST_LR_SPECTRAL_UNCLAMPED == 3, adjust_lr_values_0_3);
MUON_TEST_STATIC_ASSERT(MUON_ASSIGNMENT_BALANCED == 0 && MUON_ASSIGNMENT_ROUND_ROBIN == 1 &&
                            MUON_ASSIGNMENT_CUSTOM == 2,
                        assignment_values);
MUON_TEST_STATIC_ASSERT(MUON_PLACEMENT_SHARD == 0 && MUON_PLACEMENT_FLAT_RANGE == 1 &&
                            MUON_PLACEMENT_REPLICATE == 2,
                        placement_kind_values);
MUON_TEST_STATIC_ASSERT(MUON_REPLICATED_HOST_AVERAGED == 0 && MUON_REPLICATED_ZERO2 == 1,
                        replicated_mode_values);
MUON_TEST_STATIC_ASSERT(MUON_SPLIT_EVEN == 0 && MUON_SPLIT_CHUNK == 1 && MUON_SPLIT_SIZES == 2,
                        split_values);
MUON_TEST_STATIC_ASSERT(MUON_DTYPE_FLOAT32 == 0 && MUON_DTYPE_BFLOAT16 == 1 &&
                            MUON_DTYPE_FLOAT16 == 2,
                        dtype_values);

/* ------------------------------------------------------------------------ */
/* A tiny checker                                                            */
/* ------------------------------------------------------------------------ */

static int g_failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                            \
    }                                                                          \
  } while (0)

/* The call returned `want`; on an error the message is non-empty and holds
 * `needle` (NULL: any text). */
#define CHECK_STATUS(call, want, needle) \
  check_status((call), (want), (needle), #call, __FILE__, __LINE__)

static void check_status(muon_status_t got, muon_status_t want, const char* needle,
                         const char* what, const char* file, int line) {
  const char* msg = muon_last_error_message();
  if (got != want) {
    fprintf(stderr, "%s:%d: %s returned %s (%d), expected %s; message: %s\n", file, line, what,
            muon_status_string(got), (int)got, muon_status_string(want), msg);
    ++g_failures;
    return;
  }
  if (msg == NULL) {
    fprintf(stderr, "%s:%d: %s: muon_last_error_message() is NULL\n", file, line, what);
    ++g_failures;
    return;
  }
  if (want == MUON_OK) {
    if (msg[0] != '\0') {
      fprintf(stderr, "%s:%d: %s succeeded but the message is \"%s\"\n", file, line, what, msg);
      ++g_failures;
    }
    return;
  }
  if (msg[0] == '\0' || (needle != NULL && strstr(msg, needle) == NULL)) {
    fprintf(stderr, "%s:%d: %s: message \"%s\" should mention \"%s\"\n", file, line, what, msg,
            needle ? needle : "(anything)");
    ++g_failures;
  }
}

static DLTensor cpu_tensor(void* data, int32_t ndim, int64_t* shape, uint8_t code, uint8_t bits) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype.code = code;
  t.dtype.bits = bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = NULL;
  t.byte_offset = 0;
  return t;
}

/* Deterministic values in [-1, 1). */
static void fill(float* x, size_t n, uint32_t seed) {
  size_t i;
  uint32_t s = seed * 2654435761u + 1u;
  for (i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)((double)(s >> 8) / 8388608.0 - 1.0);
  }
}

enum { R0 = 8, C0 = 24, R1 = 24, C1 = 8 };

static float w0[R0 * C0], g0[R0 * C0], w1[R1 * C1], g1[R1 * C1];
static float w0_copy[R0 * C0], w1_copy[R1 * C1];
static int64_t shape0[2] = {R0, C0}, shape1[2] = {R1, C1};

static void test_version_and_strings(void) {
  int32_t major = -1, minor = -1, patch = -1;
  muon_get_version(&major, &minor, &patch);
  CHECK(major == MUON_VERSION_MAJOR);
  CHECK(minor == MUON_VERSION_MINOR);
  CHECK(patch == MUON_VERSION_PATCH);
  muon_get_version(NULL, NULL, NULL); /* any argument may be NULL */

  CHECK(strcmp(muon_status_string(MUON_OK), "OK") == 0);
  CHECK(strcmp(muon_status_string(MUON_INVALID_ARGUMENT), "INVALID_ARGUMENT") == 0);
  CHECK(strcmp(muon_status_string(MUON_FAILED_PRECONDITION), "FAILED_PRECONDITION") == 0);
  CHECK(strcmp(muon_status_string(MUON_OUT_OF_RANGE), "OUT_OF_RANGE") == 0);
  CHECK(muon_status_string((muon_status_t)77) != NULL);
  CHECK(muon_last_error_message() != NULL);
}

static void test_struct_sizes_and_init(void) {
  muon_options_t o;
  muon_param_options_t po;
  CHECK(muon_sizeof_options() == sizeof(muon_options_t));
  CHECK(muon_sizeof_param_options() == sizeof(muon_param_options_t));

  memset(&o, 0xab, sizeof o);
  CHECK_STATUS(muon_options_init(&o, sizeof o), MUON_OK, NULL);
  CHECK(o.struct_size == sizeof o);
  CHECK(o.lr == 1e-3);
  CHECK(o.weight_decay == 0.1);
  CHECK(o.momentum == 0.95);
  CHECK(o.nesterov == 1);
  CHECK(o.ns_steps == 5);
  CHECK(o.ns_a == 3.4445 && o.ns_b == -4.7750 && o.ns_c == 2.0315);
  CHECK(o.eps == 1e-7);
  CHECK(o.ns_coefficients == MUON_NS_COEFFICIENTS_FIXED);
  CHECK(o.ns_table == NULL);
  CHECK(o.adjust_lr == MUON_ADJUST_LR_ORIGINAL);
  CHECK(o.ns_dtype == MUON_NS_DTYPE_BF16);
  CHECK(o.momentum_fp32 == 0);
  CHECK(o.reserved0 == 0);
  CHECK(o.update_scale == 1.0 && o.cautious_wd == 0);
  CHECK(o.normuon == 0 && o.reserved3 == 0);
  CHECK(o.normuon_beta2 == 0.95 && o.normuon_eps == 1e-8);
  CHECK(o.ns_algorithm == MUON_NS_STANDARD && o.skip_nonfinite_updates == 0 && o.ns_gram_restarts == 4);

  CHECK_STATUS(muon_options_init(NULL, sizeof o), MUON_INVALID_ARGUMENT, "options");
  CHECK_STATUS(muon_options_init(&o, 8), MUON_INVALID_ARGUMENT, "struct_size");

  memset(&po, 0xab, sizeof po);
  CHECK_STATUS(muon_param_options_init(&po, sizeof po), MUON_OK, NULL);
  CHECK(po.struct_size == sizeof po);
  CHECK(po.name == NULL);
  CHECK(po.matrix_view == MUON_MATRIX_VIEW_2D);
  CHECK(po.reserved0 == 0);
  CHECK(po.lr_scale == 1.0 && po.weight_decay_scale == 1.0);
  CHECK(po.split_dim == 0 && po.num_split_sizes == 0 && po.split_sizes == NULL);
}

static void test_create_errors(void) {
  muon_options_t o;
  muon_optimizer_t* const sentinel = (muon_optimizer_t*)&o;
  muon_optimizer_t* opt = sentinel;
  muon_options_init(&o, sizeof o);

  CHECK_STATUS(muon_create(NULL, &opt), MUON_INVALID_ARGUMENT, "options");
  CHECK_STATUS(muon_create(&o, NULL), MUON_INVALID_ARGUMENT, "out");
  o.lr = -0.5;
  CHECK_STATUS(muon_create(&o, &opt), MUON_INVALID_ARGUMENT, "lr");
  o.lr = 1e-3;
  o.momentum = 1.0;
  CHECK_STATUS(muon_create(&o, &opt), MUON_INVALID_ARGUMENT, "momentum");
  o.momentum = 0.95;
  o.ns_steps = 100;
  CHECK_STATUS(muon_create(&o, &opt), MUON_INVALID_ARGUMENT, "ns_steps");
  o.ns_steps = 5;
  o.adjust_lr = 9;
  CHECK_STATUS(muon_create(&o, &opt), MUON_INVALID_ARGUMENT, "adjust_lr");
  o.adjust_lr = MUON_ADJUST_LR_ORIGINAL;
  o.struct_size = 4;
  CHECK_STATUS(muon_create(&o, &opt), MUON_INVALID_ARGUMENT, "struct_size");
  CHECK(opt == sentinel); /* out-parameter untouched on error */
}

/* Registers w0 ("layer0.w") and w1 ("layer1.w") with their grads. */
static muon_status_t register_both(muon_optimizer_t* opt, float* p0, float* p1) {
  muon_param_options_t po;
  DLTensor tp0 = cpu_tensor(p0, 2, shape0, kDLFloat, 32);
  DLTensor tg0 = cpu_tensor(g0, 2, shape0, kDLFloat, 32);
  DLTensor tp1 = cpu_tensor(p1, 2, shape1, kDLFloat, 32);
  DLTensor tg1 = cpu_tensor(g1, 2, shape1, kDLFloat, 32);
  int64_t id = -1;
  muon_status_t s;
  muon_param_options_init(&po, sizeof po);
  po.name = "layer0.w";
  s = muon_register_param(opt, &tp0, &tg0, &po, &id);
  if (s != MUON_OK) return s;
  CHECK(id == 0);
  po.name = "layer1.w";
  s = muon_register_param(opt, &tp1, &tg1, &po, &id);
  if (s != MUON_OK) return s;
  CHECK(id == 1);
  return MUON_OK;
}

static int all_finite(const float* x, size_t n) {
  size_t i;
  for (i = 0; i < n; ++i) {
    if (!isfinite(x[i])) return 0;
  }
  return 1;
}

static size_t count_changed(const float* a, const float* b, size_t n) {
  size_t i, c = 0;
  for (i = 0; i < n; ++i) c += a[i] != b[i];
  return c;
}

static void test_train_save_load(void) {
  muon_options_t o;
  muon_optimizer_t* opt = NULL;
  muon_optimizer_t* other = NULL;
  muon_param_options_t po;
  float bias[16], bias_g[16];
  int64_t bias_shape[1] = {16};
  DLTensor tb, tbg;
  int64_t id = -7, steps = -1;
  size_t count = 0, need = 0, written = 0, i;
  unsigned char* blob;
  DLDataType state_dtype;
  float state_a[R0 * C0], state_b[R0 * C0];
  DLTensor sa = cpu_tensor(state_a, 2, shape0, kDLFloat, 32);
  DLTensor sb = cpu_tensor(state_b, 2, shape0, kDLFloat, 32);
  muon_options_t got;
  int step;

  muon_options_init(&o, sizeof o);
  o.lr = 0.02;
  CHECK_STATUS(muon_create(&o, &opt), MUON_OK, NULL);
  if (opt == NULL) return;

  /* Errors name the parameter and the cause. */
  CHECK_STATUS(muon_step(NULL, NULL), MUON_INVALID_ARGUMENT, "opt");
  CHECK_STATUS(muon_step(opt, NULL), MUON_FAILED_PRECONDITION, "no parameters");
  CHECK_STATUS(muon_num_params(NULL, &count), MUON_INVALID_ARGUMENT, "opt");

  fill(bias, 16, 3);
  tb = cpu_tensor(bias, 1, bias_shape, kDLFloat, 32);
  tbg = cpu_tensor(bias_g, 1, bias_shape, kDLFloat, 32);
  muon_param_options_init(&po, sizeof po);
  po.name = "layer0.bias";
  CHECK_STATUS(muon_register_param(opt, &tb, &tbg, &po, &id), MUON_INVALID_ARGUMENT, "layer0.bias");
  CHECK(strstr(muon_last_error_message(), "AdamW") != NULL);
  CHECK(id == -7); /* untouched */
  CHECK_STATUS(muon_register_param(NULL, &tb, &tbg, &po, &id), MUON_INVALID_ARGUMENT, "opt");
  CHECK_STATUS(muon_num_params(opt, &count), MUON_OK, NULL);
  CHECK(count == 0);

  fill(w0, R0 * C0, 1);
  fill(w1, R1 * C1, 2);
  memcpy(w0_copy, w0, sizeof w0);
  memcpy(w1_copy, w1, sizeof w1);
  CHECK_STATUS(register_both(opt, w0, w1), MUON_OK, NULL);
  CHECK_STATUS(muon_num_params(opt, &count), MUON_OK, NULL);
  CHECK(count == 2);

  for (step = 0; step < 3; ++step) {
    fill(g0, R0 * C0, 100 + step);
    fill(g1, R1 * C1, 200 + step);
    CHECK_STATUS(muon_step(opt, NULL), MUON_OK, NULL);
  }
  CHECK_STATUS(muon_step_count(opt, &steps), MUON_OK, NULL);
  CHECK(steps == 3);
  CHECK(all_finite(w0, R0 * C0));
  CHECK(all_finite(w1, R1 * C1));
  CHECK(count_changed(w0, w0_copy, R0 * C0) > R0 * C0 / 2);
  CHECK(count_changed(w1, w1_copy, R1 * C1) > R1 * C1 / 2);

  /* Registration is closed now. */
  po.name = "late.w";
  {
    float late[4], late_g[4];
    int64_t late_shape[2] = {2, 2};
    DLTensor tl = cpu_tensor(late, 2, late_shape, kDLFloat, 32);
    DLTensor tlg = cpu_tensor(late_g, 2, late_shape, kDLFloat, 32);
    memset(late, 0, sizeof late);
    memset(late_g, 0, sizeof late_g);
    CHECK_STATUS(muon_register_param(opt, &tl, &tlg, &po, &id), MUON_FAILED_PRECONDITION, "late.w");
  }

  /* Setters validate and keep the old value on error. */
  CHECK_STATUS(muon_set_lr(opt, -1.0), MUON_INVALID_ARGUMENT, "lr");
  CHECK_STATUS(muon_set_momentum(opt, 1.5), MUON_INVALID_ARGUMENT, "momentum");
  CHECK_STATUS(muon_set_weight_decay(opt, 0.05), MUON_OK, NULL);
  muon_options_init(&got, sizeof got);
  CHECK_STATUS(muon_get_options(opt, &got), MUON_OK, NULL);
  CHECK(got.lr == 0.02);
  CHECK(got.momentum == 0.95);
  CHECK(got.weight_decay == 0.05);

  /* State dtype and tensors. */
  CHECK_STATUS(muon_get_state_dtype(opt, 0, &state_dtype), MUON_OK, NULL);
  CHECK(state_dtype.code == kDLFloat && state_dtype.bits == 32 && state_dtype.lanes == 1);
  CHECK_STATUS(muon_get_state_dtype(opt, 2, &state_dtype), MUON_NOT_FOUND, "2");

  /* Save into a blob, load into a second optimizer, compare. */
  CHECK_STATUS(muon_save_state(opt, NULL, 0, &need), MUON_OK, NULL);
  CHECK(need > (R0 * C0 + R1 * C1) * sizeof(float));
  blob = (unsigned char*)malloc(need + 1);
  CHECK(blob != NULL);
  if (blob == NULL) {
    muon_destroy(opt);
    return;
  }
  CHECK_STATUS(muon_save_state(opt, blob, need - 1, &written), MUON_OUT_OF_RANGE, "capacity");
  CHECK(written == 0);
  CHECK_STATUS(muon_save_state(opt, blob, need + 1, &written), MUON_OK, NULL);
  CHECK(written == need);

  CHECK_STATUS(muon_create(&o, &other), MUON_OK, NULL);
  CHECK_STATUS(register_both(other, w0_copy, w1_copy), MUON_OK, NULL);
  CHECK_STATUS(muon_load_state(other, blob, need - 1), MUON_INVALID_ARGUMENT, "truncated");
  blob[0] ^= 0xff;
  CHECK_STATUS(muon_load_state(other, blob, need), MUON_INVALID_ARGUMENT, "magic");
  blob[0] ^= 0xff;
  CHECK_STATUS(muon_step_count(other, &steps), MUON_OK, NULL);
  CHECK(steps == 0); /* the failed loads changed nothing */
  CHECK_STATUS(muon_load_state(other, blob, need), MUON_OK, NULL);
  CHECK_STATUS(muon_step_count(other, &steps), MUON_OK, NULL);
  CHECK(steps == 3);
  CHECK_STATUS(muon_get_state(opt, 0, &sa), MUON_OK, NULL);
  CHECK_STATUS(muon_get_state(other, 0, &sb), MUON_OK, NULL);
  CHECK(memcmp(state_a, state_b, sizeof state_a) == 0);
  for (i = 0, count = 0; i < R0 * C0; ++i) count += state_a[i] != 0.0f;
  CHECK(count > 0);

  free(blob);
  muon_destroy(other);
  muon_destroy(opt);
  muon_destroy(NULL);
}

/* The communicator entry points from C: an in-process world of one rank
 * (its table outlives the world handle), argument errors, and NCCL, which
 * this process has not loaded. */
static void test_communicators(void) {
  muon_inprocess_world_t* const sentinel = (muon_inprocess_world_t*)&g_failures;
  muon_inprocess_world_t* world = sentinel;
  muon_comm_t c, untouched;
  int32_t list[1] = {0}, two[2] = {0, 0};
  unsigned char send[4] = {1, 2, 3, 4}, recv[4] = {0, 0, 0, 0};
  size_t bytes[1] = {3}, offsets[1] = {1}, zero[1] = {0};
  uint16_t bf16_in[2] = {0x3f80, 0x4000}, bf16_out[2] = {0, 0}; /* 1.0, 2.0 */
  int fake_nccl_comm = 0;

  CHECK_STATUS(muon_inprocess_world_create(0, &world), MUON_INVALID_ARGUMENT, "world size 0");
  CHECK_STATUS(muon_inprocess_world_create(2, NULL), MUON_INVALID_ARGUMENT, "out");
  CHECK(world == sentinel);
  CHECK_STATUS(muon_inprocess_world_create(1, &world), MUON_OK, NULL);
  if (world == sentinel || world == NULL) return;

  memset(&c, 0x5a, sizeof c);
  memcpy(&untouched, &c, sizeof c);
  CHECK_STATUS(muon_inprocess_comm(NULL, NULL, 0, 0, &c), MUON_INVALID_ARGUMENT, "world");
  CHECK_STATUS(muon_inprocess_comm(world, NULL, 0, 0, NULL), MUON_INVALID_ARGUMENT, "out");
  CHECK_STATUS(muon_inprocess_comm(world, list, 0, 0, &c), MUON_INVALID_ARGUMENT, "num_ranks");
  CHECK_STATUS(muon_inprocess_comm(world, two, 2, 0, &c), MUON_INVALID_ARGUMENT, "num_ranks");
  CHECK_STATUS(muon_inprocess_comm(world, NULL, 0, 1, &c), MUON_INVALID_ARGUMENT, "rank 1");
  CHECK(memcmp(&c, &untouched, sizeof c) == 0); /* untouched on error */

  CHECK_STATUS(muon_inprocess_comm(world, list, 1, 0, &c), MUON_OK, NULL);
  muon_inprocess_world_destroy(world); /* the table keeps the world alive */
  muon_inprocess_world_destroy(NULL);
  CHECK(c.struct_size == sizeof(muon_comm_t));
  CHECK(c.rank == 0 && c.size == 1);
  CHECK(c.ctx != NULL && c.release != NULL);

  CHECK(c.all_gather(c.ctx, send, recv, 4, NULL) == MUON_OK);
  CHECK(memcmp(send, recv, 4) == 0);
  memset(recv, 0, sizeof recv);
  CHECK(c.all_to_all_v(c.ctx, send, bytes, zero, recv, bytes, offsets, NULL) == MUON_OK);
  CHECK(recv[0] == 0 && recv[1] == 1 && recv[2] == 2 && recv[3] == 3);
  CHECK(c.broadcast(c.ctx, send, 4, 0, NULL) == MUON_OK);
  CHECK(c.broadcast(c.ctx, send, 4, 1, NULL) == MUON_INVALID_ARGUMENT);
  CHECK(c.reduce_scatter(c.ctx, bf16_in, bf16_out, 2, MUON_DTYPE_BFLOAT16, NULL) == MUON_OK);
  CHECK(bf16_out[0] == 0x3f80 && bf16_out[1] == 0x4000);
  CHECK(c.reduce_scatter(c.ctx, bf16_in, bf16_out, 2, 3, NULL) == MUON_INVALID_ARGUMENT);
  CHECK(c.barrier(c.ctx, NULL) == MUON_OK);
  c.release(c.ctx);

  /* A callback may attach detail; any text, or NULL, is accepted. */
  muon_set_callback_error("detail");
  muon_set_callback_error(NULL);

  /* No NCCL in this process: unavailable, and the message says why. */
  CHECK_STATUS(muon_comm_from_nccl(NULL, &c), MUON_INVALID_ARGUMENT, "nccl_comm");
  CHECK_STATUS(muon_comm_from_nccl(&fake_nccl_comm, NULL), MUON_INVALID_ARGUMENT, "out");
  memcpy(&untouched, &c, sizeof c);
  CHECK_STATUS(muon_comm_from_nccl(&fake_nccl_comm, &c), MUON_UNAVAILABLE, "no NCCL is loaded");
  CHECK(strstr(muon_last_error_message(), "libnccl.so.2") != NULL);
  CHECK(memcmp(&c, &untouched, sizeof c) == 0);
}

int main(void) {
  test_version_and_strings();
  test_struct_sizes_and_init();
  test_create_errors();
  test_train_save_load();
  test_communicators();
  if (g_failures != 0) {
    fprintf(stderr, "c99_test: %d check(s) failed\n", g_failures);
    return 1;
  }
  printf("c99_test: all checks passed\n");
  return 0;
}
