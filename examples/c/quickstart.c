/*
 * libmuon quickstart: train two weight matrices with Muon from plain C.
 *
 * The "model" is two matrices W that should become fixed targets T; the loss
 * is 0.5 * ||W - T||^2, so the gradient is simply W - T. In a real trainer
 * your framework computes the gradients; libmuon only needs to know where
 * the parameters and gradients live.
 *
 * Build and run:  bazel run //examples/c:quickstart
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libmuon/muon.h>

/* Every libmuon call returns a status; on error, print what went wrong. */
#define MUON_CHECK(call)                                                         \
  do {                                                                           \
    muon_status_t status_ = (call);                                              \
    if (status_ != MUON_OK) {                                                    \
      fprintf(stderr, "%s failed: %s: %s\n", #call, muon_status_string(status_), \
              muon_last_error_message());                                        \
      goto fail;                                                                 \
    }                                                                            \
  } while (0)

/* A weight matrix, its gradient and the target it should learn. */
typedef struct {
  const char* name;
  int64_t shape[2]; /* rows, cols */
  float* weight;
  float* grad;
  float* target;
} matrix_t;

static size_t numel(const matrix_t* m) { return (size_t)(m->shape[0] * m->shape[1]); }

/* Describes a float32 CPU buffer as a DLTensor. libmuon keeps the data
 * pointer (not the DLTensor), so the buffer must outlive the optimizer. */
static DLTensor float32_tensor(float* data, int32_t ndim, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = NULL; /* row-major contiguous */
  return t;
}

static int make_matrix(matrix_t* m, const char* name, int64_t rows, int64_t cols, unsigned seed) {
  size_t i;
  m->name = name;
  m->shape[0] = rows;
  m->shape[1] = cols;
  m->weight = calloc(numel(m), sizeof(float)); /* start from zero */
  m->grad = calloc(numel(m), sizeof(float));
  m->target = malloc(numel(m) * sizeof(float));
  if (!m->weight || !m->grad || !m->target) return 0;
  srand(seed);
  for (i = 0; i < numel(m); ++i) m->target[i] = 0.1f * ((float)rand() / (float)RAND_MAX - 0.5f);
  return 1;
}

static void free_matrix(matrix_t* m) {
  free(m->weight);
  free(m->grad);
  free(m->target);
}

/* Writes the gradient of 0.5 * ||W - T||^2 into m->grad; returns the loss. */
static double loss_and_grad(matrix_t* m) {
  double loss = 0.0;
  size_t i;
  for (i = 0; i < numel(m); ++i) {
    m->grad[i] = m->weight[i] - m->target[i];
    loss += 0.5 * (double)m->grad[i] * m->grad[i];
  }
  return loss;
}

static double norm(const matrix_t* m) {
  double s = 0.0;
  size_t i;
  for (i = 0; i < numel(m); ++i) s += (double)m->weight[i] * m->weight[i];
  return sqrt(s);
}

int main(void) {
  enum { kSteps = 10 };
  muon_optimizer_t* opt = NULL;
  muon_options_t options;
  matrix_t layers[2];
  int exit_code = 1;
  int i, step;

  memset(layers, 0, sizeof layers);
  if (!make_matrix(&layers[0], "encoder.weight", 32, 96, 1) || /* wide */
      !make_matrix(&layers[1], "decoder.weight", 96, 32, 2)) { /* tall */
    fprintf(stderr, "out of memory\n");
    goto fail;
  }

  /* 1. Options: start from the defaults, change what you need. */
  MUON_CHECK(muon_options_init(&options, sizeof options));
  options.lr = 0.02;
  options.weight_decay = 0.0;
  MUON_CHECK(muon_create(&options, &opt));

  /* 2. Register every 2-D weight with its gradient buffer. (Biases and norms
   *    are 1-D: train them with AdamW; libmuon refuses them.) */
  for (i = 0; i < 2; ++i) {
    DLTensor weight = float32_tensor(layers[i].weight, 2, layers[i].shape);
    DLTensor grad = float32_tensor(layers[i].grad, 2, layers[i].shape);
    muon_param_options_t param_options;
    int64_t id;
    MUON_CHECK(muon_param_options_init(&param_options, sizeof param_options));
    param_options.name = layers[i].name; /* used in error messages */
    MUON_CHECK(muon_register_param(opt, &weight, &grad, &param_options, &id));
    printf("registered %s [%lld x %lld] as param %lld\n", layers[i].name,
           (long long)layers[i].shape[0], (long long)layers[i].shape[1], (long long)id);
  }

  /* What an error looks like: a 1-D parameter is refused, nothing is
   * registered, and the message names the parameter and the cause. */
  {
    float bias[8] = {0}, bias_grad[8] = {0};
    int64_t bias_shape[1] = {8};
    DLTensor b = float32_tensor(bias, 1, bias_shape);
    DLTensor bg = float32_tensor(bias_grad, 1, bias_shape);
    int64_t id;
    muon_param_options_t param_options;
    muon_status_t status;
    MUON_CHECK(muon_param_options_init(&param_options, sizeof param_options));
    param_options.name = "encoder.bias";
    status = muon_register_param(opt, &b, &bg, &param_options, &id);
    printf("registering a bias: %s (%s)\n", muon_status_string(status), muon_last_error_message());
  }

  /* 3. Train: write the gradients in place, then step. */
  for (step = 1; step <= kSteps; ++step) {
    double loss = 0.0;
    for (i = 0; i < 2; ++i) loss += loss_and_grad(&layers[i]);
    MUON_CHECK(muon_step(opt, NULL));
    printf("step %2d  loss %.6f  |encoder| %.4f  |decoder| %.4f\n", step, loss, norm(&layers[0]),
           norm(&layers[1]));
  }

  exit_code = 0;
  printf("done\n");

fail:
  /* 4. Clean up. */
  muon_destroy(opt); /* accepts NULL */
  free_matrix(&layers[0]);
  free_matrix(&layers[1]);
  return exit_code;
}
