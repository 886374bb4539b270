// The optimizer's own memory per parameter element for Llama-3 8B's matrices,
// measured on the CPU device through the C API (muon_get_stats after the
// first step, which allocates everything the steps use): the first `layers`
// decoder layers' seven matrices, float32 and bfloat16 parameters, with the
// per-parameter update buffers and with update_in_grad. Newton-Schulz runs
// `ns_steps` iterations, 0 by default: its own workspace is reserved all the
// same and the figures are memory, not time; with iterations the native bf16
// products' working memory (the AMX kernel's packed operands, oneDNN's
// scratchpad), reserved before the first product, is counted too.
//
//   bazel run -c opt //bench:memory_bench [-- max_layers [ns_steps]]   (2, 0)
#include <dlpack/dlpack.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "libmuon/muon.h"

namespace {

struct Shape {
  const char* name;
  int64_t rows, cols;
};
// One Llama-3 8B decoder layer (shared/models/llama3-8b.json).
const Shape kLayer[] = {
    {"attn.q_proj", 4096, 4096},    {"attn.k_proj", 1024, 4096},  {"attn.v_proj", 1024, 4096},
    {"attn.o_proj", 4096, 4096},    {"mlp.gate_proj", 14336, 4096}, {"mlp.up_proj", 14336, 4096},
    {"mlp.down_proj", 4096, 14336},
};

struct Tensor {
  std::vector<int64_t> shape;
  void* data = nullptr;
  DLTensor dl{};
  Tensor(int64_t rows, int64_t cols, DLDataType type) : shape{rows, cols} {
    data = std::calloc(static_cast<size_t>(rows * cols), type.bits / 8);
    dl.data = data;
    dl.device = {kDLCPU, 0};
    dl.ndim = 2;
    dl.dtype = type;
    dl.shape = shape.data();
  }
  ~Tensor() { std::free(data); }
};

bool Check(muon_status_t s, const char* what) {
  if (s == MUON_OK) return true;
  std::fprintf(stderr, "%s: %s\n", what, muon_last_error_message());
  return false;
}

// Registers `layers` layers, steps once, prints one row; false on failure.
bool Measure(int layers, DLDataType type, int update_in_grad, int ns_steps) {
  muon_options_t o;
  muon_options_init(&o, sizeof o);
  o.ns_steps = ns_steps;
  o.update_in_grad = update_in_grad;
  muon_optimizer_t* opt = nullptr;
  if (!Check(muon_create(&o, &opt), "muon_create")) return false;
  std::vector<std::unique_ptr<Tensor>> tensors;
  bool ok = true;
  for (int l = 0; l < layers && ok; ++l) {
    for (const Shape& s : kLayer) {
      tensors.push_back(std::make_unique<Tensor>(s.rows, s.cols, type));
      Tensor& value = *tensors.back();
      tensors.push_back(std::make_unique<Tensor>(s.rows, s.cols, type));
      Tensor& grad = *tensors.back();
      const std::string name = "layers." + std::to_string(l) + "." + s.name;
      muon_param_options_t po;
      muon_param_options_init(&po, sizeof po);
      po.name = name.c_str();
      int64_t id = -1;
      ok = Check(muon_register_param(opt, &value.dl, &grad.dl, &po, &id), "muon_register_param");
      if (!ok) break;
    }
  }
  if (ok) ok = Check(muon_step(opt, nullptr), "muon_step");
  if (ok) {
    muon_stats_t st;
    muon_stats_init(&st, sizeof st);
    ok = Check(muon_get_stats(opt, &st), "muon_get_stats");
    const double n = static_cast<double>(st.param_elements);
    // An update buffer has the Newton-Schulz dtype (bf16 with the defaults).
    const double update_bytes = o.ns_dtype == MUON_NS_DTYPE_BF16 ? 2.0 : 4.0;
    const double update = update_in_grad ? 0.0 : update_bytes * n;
    const double working = static_cast<double>(st.memory_bytes - st.momentum_bytes) - update;
    std::printf("| %d | %s | %s | %.1f | %.2f | %.2f | %.2f | %.3f | %.1f | %.2f |\n", layers,
                type.code == kDLBfloat ? "bf16" : "fp32", update_in_grad ? "in grad" : "buffer",
                n / 1e6, static_cast<double>(st.memory_bytes) / (1 << 30),
                static_cast<double>(st.momentum_bytes) / n, update / n, working / n,
                working / (1 << 20), st.bytes_per_param);
  }
  muon_destroy(opt);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const int max_layers = argc > 1 ? std::atoi(argv[1]) : 2;
  const int ns_steps = argc > 2 ? std::atoi(argv[2]) : 0;
  std::printf("Llama-3 8B decoder matrices on the CPU device, one process, default options "
              "(round_bytes 256 MiB), Newton-Schulz %d iterations\n\n", ns_steps);
  std::printf("| layers | params | update | matrix elements (M) | optimizer memory (GiB) | "
              "momentum B/elem | update buffer B/elem | working set B/elem | working set "
              "(MiB) | bytes per param |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (int layers = 1; layers <= max_layers; layers *= 2) {
    for (DLDataType type : {DLDataType{kDLFloat, 32, 1}, DLDataType{kDLBfloat, 16, 1}}) {
      for (int in_grad : {0, 1}) {
        if (!Measure(layers, type, in_grad, ns_steps)) return 1;
      }
    }
  }
  return 0;
}
