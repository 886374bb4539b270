// Loads the built libmuon.so with dlopen, the way a framework plugin would:
// this program is not linked against the library. Every function the public
// header declares is resolved by name, and an optimizer runs through the
// resolved pointers.
//
// Usage: dlopen_test <path to libmuon.so> <path to include/libmuon/muon.h>
#include <dlfcn.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "libmuon/muon.h"

namespace {

// Every function of include/libmuon/muon.h. The header scan below fails the test when
// the header declares one that is missing here.
#define MUON_ALL_FUNCTIONS(X)    \
  X(muon_status_string)          \
  X(muon_last_error_message)     \
  X(muon_get_version)            \
  X(muon_options_init)           \
  X(muon_sizeof_options)         \
  X(muon_sizeof_param_options)   \
  X(muon_sizeof_comm)            \
  X(muon_sizeof_stats)           \
  X(muon_sizeof_custom_layout)   \
  X(muon_sizeof_gathered)        \
  X(muon_sizeof_matrix_info)     \
  X(muon_sizeof_placement)       \
  X(muon_create)                 \
  X(muon_destroy)                \
  X(muon_get_options)            \
  X(muon_set_lr)                 \
  X(muon_set_weight_decay)       \
  X(muon_set_momentum)           \
  X(muon_push_hyperparameters)   \
  X(muon_param_options_init)     \
  X(muon_register_param)         \
  X(muon_register_param_custom)  \
  X(muon_rebind_param)           \
  X(muon_num_params)             \
  X(muon_step)                   \
  X(muon_step_count)             \
  X(muon_orthogonalize)          \
  X(muon_set_callback_error)     \
  X(muon_set_world)              \
  X(muon_add_group)              \
  X(muon_stats_init)             \
  X(muon_get_stats)              \
  X(muon_inprocess_world_create) \
  X(muon_inprocess_world_destroy) \
  X(muon_inprocess_world_abort) \
  X(muon_inprocess_comm)         \
  X(muon_comm_from_nccl)         \
  X(muon_get_state_dtype)        \
  X(muon_get_state)              \
  X(muon_set_state)              \
  X(muon_get_moments)            \
  X(muon_qk_clip_layer_init)     \
  X(muon_sizeof_qk_clip_layer)   \
  X(muon_register_qk_clip)       \
  X(muon_qk_clip)                \
  X(muon_qk_clip_on_stream)      \
  X(muon_set_moments)            \
  X(muon_get_owned_moments)      \
  X(muon_set_owned_moments)      \
  X(muon_save_state)             \
  X(muon_load_state)             \
  X(muon_load_states)

// Typed pointers: decltype of the header's declarations checks that the
// signatures we call are the header's (nothing is linked).
struct Api {
#define MUON_FIELD(name) decltype(&::name) name = nullptr;
  MUON_ALL_FUNCTIONS(MUON_FIELD)
#undef MUON_FIELD
};

std::atomic<int> g_failures{0};  // CHECK runs on the rank threads too

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)

// Names of the functions the header declares (lines starting with MUON_API),
// its sections included (each `#include "libmuon/muon_<name>.h"` line is
// read from the header's own folder, in place).
std::vector<std::string> HeaderFunctions(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    ++g_failures;
    return {};
  }
  const std::string folder = path.substr(0, path.find_last_of('/') + 1);
  std::vector<std::string> names;
  std::string line;
  const std::string section = "#include \"libmuon/muon_";
  while (std::getline(in, line)) {
    if (line.rfind(section, 0) == 0) {
      const std::string file =
          "muon_" + line.substr(section.size(), line.rfind('"') - section.size());
      for (std::string& name : HeaderFunctions(folder + file)) names.push_back(std::move(name));
      continue;
    }
    if (line.rfind("MUON_API ", 0) != 0) continue;
    const size_t paren = line.find('(');
    if (paren == std::string::npos) continue;
    size_t start = paren;
    while (start > 0 &&
           (std::isalnum(static_cast<unsigned char>(line[start - 1])) || line[start - 1] == '_')) {
      --start;
    }
    names.push_back(line.substr(start, paren - start));
  }
  return names;
}

DLTensor CpuF32(float* data, int64_t* shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <libmuon.so> <muon.h>\n", argv[0]);
    return 2;
  }
  std::string lib = argv[1];
  if (lib.find('/') == std::string::npos) lib = "./" + lib;  // a path, not a search name

  void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "dlopen(%s) failed: %s\n", lib.c_str(), dlerror());
    return 1;
  }

  Api api;
  std::set<std::string> known;
#define MUON_RESOLVE(name)                                               \
  known.insert(#name);                                                   \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(handle, #name)); \
  if (api.name == nullptr) {                                             \
    std::fprintf(stderr, "dlsym(%s) failed: %s\n", #name, dlerror());    \
    ++g_failures;                                                        \
  }
  MUON_ALL_FUNCTIONS(MUON_RESOLVE)
#undef MUON_RESOLVE

  const std::vector<std::string> declared = HeaderFunctions(argv[2]);
  CHECK(declared.size() == known.size());
  for (const std::string& name : declared) {
    if (known.count(name) == 0) {
      std::fprintf(stderr, "muon.h declares %s, which this test does not know\n", name.c_str());
      ++g_failures;
    }
    dlerror();
    if (dlsym(handle, name.c_str()) == nullptr) {
      std::fprintf(stderr, "libmuon.so does not export %s\n", name.c_str());
      ++g_failures;
    }
  }
  // Internal symbols stay hidden.
  CHECK(dlsym(handle, "_ZN4muon9Optimizer4StepEv") == nullptr);
  if (g_failures != 0) {
    std::fprintf(stderr, "dlopen_test: %d failure(s) resolving the API\n", g_failures.load());
    return 1;
  }

  int32_t major = -1, minor = -1, patch = -1;
  api.muon_get_version(&major, &minor, &patch);
  CHECK(major == MUON_VERSION_MAJOR && minor == MUON_VERSION_MINOR && patch == MUON_VERSION_PATCH);
  CHECK(api.muon_sizeof_options() == sizeof(muon_options_t));
  CHECK(api.muon_sizeof_param_options() == sizeof(muon_param_options_t));
  CHECK(std::strcmp(api.muon_status_string(MUON_NOT_FOUND), "NOT_FOUND") == 0);

  muon_options_t opts;
  CHECK(api.muon_options_init(&opts, sizeof opts) == MUON_OK);
  opts.lr = 0.05;
  opts.ns_dtype = MUON_NS_DTYPE_FP32;
  muon_optimizer_t* opt = nullptr;
  CHECK(api.muon_create(&opts, &opt) == MUON_OK);
  if (opt == nullptr) return 1;

  int64_t shape_a[2] = {6, 10}, shape_b[2] = {10, 6}, shape_v[1] = {6};
  std::vector<float> a(60), ga(60), b(60), gb(60), v(6, 1.f), gv(6);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = std::sin(0.3f * i);
    b[i] = std::cos(0.7f * i);
    ga[i] = std::cos(1.3f * i);
    gb[i] = std::sin(0.9f * i + 1);
  }
  const std::vector<float> a0 = a, b0 = b;
  DLTensor ta = CpuF32(a.data(), shape_a), tga = CpuF32(ga.data(), shape_a);
  DLTensor tb = CpuF32(b.data(), shape_b), tgb = CpuF32(gb.data(), shape_b);
  DLTensor tv = CpuF32(v.data(), shape_v), tgv = CpuF32(gv.data(), shape_v);
  tv.ndim = tgv.ndim = 1;

  muon_param_options_t po;
  CHECK(api.muon_param_options_init(&po, sizeof po) == MUON_OK);
  int64_t id = -1;
  po.name = "attn.qkv";
  CHECK(api.muon_register_param(opt, &ta, &tga, &po, &id) == MUON_OK && id == 0);
  po.name = "attn.out";
  CHECK(api.muon_register_param(opt, &tb, &tgb, &po, &id) == MUON_OK && id == 1);
  po.name = "norm.weight";
  CHECK(api.muon_register_param(opt, &tv, &tgv, &po, &id) == MUON_INVALID_ARGUMENT);
  CHECK(std::strstr(api.muon_last_error_message(), "norm.weight") != nullptr);
  CHECK(id == 1);
  size_t count = 0;
  CHECK(api.muon_num_params(opt, &count) == MUON_OK && count == 2);

  CHECK(api.muon_set_lr(opt, 0.04) == MUON_OK);
  CHECK(api.muon_set_weight_decay(opt, 0.0) == MUON_OK);
  CHECK(api.muon_set_momentum(opt, 0.9) == MUON_OK);
  muon_options_t now;
  api.muon_options_init(&now, sizeof now);
  CHECK(api.muon_get_options(opt, &now) == MUON_OK);
  CHECK(now.lr == 0.04 && now.weight_decay == 0.0 && now.momentum == 0.9);
  CHECK(now.ns_dtype == MUON_NS_DTYPE_FP32);

  for (int s = 0; s < 3; ++s) CHECK(api.muon_step(opt, nullptr) == MUON_OK);
  int64_t steps = 0;
  CHECK(api.muon_step_count(opt, &steps) == MUON_OK && steps == 3);
  size_t changed = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(std::isfinite(a[i]) && std::isfinite(b[i]));
    changed += (a[i] != a0[i]) + (b[i] != b0[i]);
  }
  CHECK(changed > a.size());

  // Newton-Schulz alone through the resolved pointer: in place, no NaN.
  std::vector<float> m(a0.begin(), a0.begin() + 12);
  int64_t shape_m[2] = {3, 4};
  DLTensor tm = CpuF32(m.data(), shape_m);
  CHECK(api.muon_orthogonalize(opt, &tm, &tm, MUON_MATRIX_VIEW_2D, nullptr) == MUON_OK);
  CHECK(std::isfinite(m[0]) && m[0] != a0[0]);

  // State through the resolved pointers.
  DLDataType dt{};
  CHECK(api.muon_get_state_dtype(opt, 1, &dt) == MUON_OK && dt.code == kDLFloat && dt.bits == 32);
  std::vector<float> state(60), zeros(60, 0.f);
  DLTensor ts = CpuF32(state.data(), shape_b);
  CHECK(api.muon_get_state(opt, 1, &ts) == MUON_OK);
  CHECK(state != zeros);
  size_t need = 0;
  CHECK(api.muon_save_state(opt, nullptr, 0, &need) == MUON_OK && need > 0);
  std::vector<unsigned char> blob(need);
  CHECK(api.muon_save_state(opt, blob.data(), blob.size(), &need) == MUON_OK);
  DLTensor tz = CpuF32(zeros.data(), shape_b);
  CHECK(api.muon_set_state(opt, 1, &tz) == MUON_OK);
  CHECK(api.muon_get_state(opt, 1, &ts) == MUON_OK && state == zeros);
  CHECK(api.muon_load_state(opt, blob.data(), blob.size()) == MUON_OK);
  CHECK(api.muon_get_state(opt, 1, &ts) == MUON_OK && state != zeros);

  CHECK(api.muon_step(nullptr, nullptr) == MUON_INVALID_ARGUMENT);
  CHECK(std::strlen(api.muon_last_error_message()) > 0);

  api.muon_destroy(opt);
  api.muon_destroy(nullptr);

  // Distributed through the resolved pointers: two in-process ranks hold the
  // row halves of one 8 x 6 matrix; the result equals a single-process run.
  {
    const int64_t rows = 8, cols = 6;
    std::vector<float> full(rows * cols), full_g(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) {
      full[i] = std::sin(0.37f * i);
      full_g[i] = std::cos(0.61f * i);
    }
    const std::vector<float> init = full;
    muon_options_t o;
    api.muon_options_init(&o, sizeof o);
    o.ns_dtype = MUON_NS_DTYPE_FP32;
    muon_optimizer_t* ref = nullptr;
    CHECK(api.muon_create(&o, &ref) == MUON_OK);
    int64_t full_shape[2] = {rows, cols}, rid = -1;
    DLTensor tf = CpuF32(full.data(), full_shape), tfg = CpuF32(full_g.data(), full_shape);
    muon_param_options_t rpo;
    api.muon_param_options_init(&rpo, sizeof rpo);
    rpo.name = "w";
    CHECK(api.muon_register_param(ref, &tf, &tfg, &rpo, &rid) == MUON_OK);
    CHECK(api.muon_step(ref, nullptr) == MUON_OK);
    api.muon_destroy(ref);

    muon_inprocess_world_t* world = nullptr;
    CHECK(api.muon_inprocess_world_create(2, &world) == MUON_OK);
    muon_comm_t tables[2];
    for (int r = 0; r < 2; ++r) {
      CHECK(api.muon_inprocess_comm(world, nullptr, 0, r, &tables[r]) == MUON_OK);
    }
    api.muon_inprocess_world_destroy(world);
    std::vector<std::vector<float>> pieces(2);
    std::vector<muon_stats_t> stats(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        const int64_t half = rows / 2;
        pieces[r].assign(init.begin() + r * half * cols, init.begin() + (r + 1) * half * cols);
        std::vector<float> g(full_g.begin() + r * half * cols,
                             full_g.begin() + (r + 1) * half * cols);
        int64_t shape[2] = {half, cols};
        DLTensor tp = CpuF32(pieces[r].data(), shape), tg = CpuF32(g.data(), shape);
        muon_optimizer_t* d = nullptr;
        if (api.muon_create(&o, &d) != MUON_OK) {
          CHECK(false);
          tables[r].release(tables[r].ctx);
          return;
        }
        int32_t gid = -1;
        muon_placement_t shard{};
        muon_param_options_t po2;
        api.muon_param_options_init(&po2, sizeof po2);
        int64_t pid = -1;
        bool ok = api.muon_set_world(d, &tables[r], &gid) == MUON_OK;
        shard.kind = MUON_PLACEMENT_SHARD;
        shard.group = gid;
        shard.dim = 0;
        shard.split = MUON_SPLIT_EVEN;
        po2.name = "w";
        po2.global_ndim = 2;
        po2.global_shape = full_shape;
        po2.num_placements = 1;
        po2.placements = &shard;
        ok = ok && api.muon_register_param(d, &tp, &tg, &po2, &pid) == MUON_OK;
        ok = ok && api.muon_step(d, nullptr) == MUON_OK;
        ok = ok && api.muon_stats_init(&stats[r], sizeof stats[r]) == MUON_OK;
        ok = ok && api.muon_get_stats(d, &stats[r]) == MUON_OK;
        if (!ok) std::fprintf(stderr, "rank %d: %s\n", r, api.muon_last_error_message());
        CHECK(ok);
        api.muon_destroy(d);  // releases tables[r]
      });
    }
    for (std::thread& t : threads) t.join();
    CHECK(pieces[0].size() + pieces[1].size() == full.size());
    std::vector<float> joined = pieces[0];
    joined.insert(joined.end(), pieces[1].begin(), pieces[1].end());
    CHECK(joined == full);
    CHECK(joined != init);
    CHECK(stats[0].matrices_total == 1 && stats[1].matrices_total == 1);
    CHECK(stats[0].matrices_owned + stats[1].matrices_owned == 1);
  }
  CHECK(dlclose(handle) == 0);

  if (g_failures != 0) {
    std::fprintf(stderr, "dlopen_test: %d check(s) failed\n", g_failures.load());
    return 1;
  }
  std::printf("dlopen_test: %zu functions resolved, optimizer ran\n", declared.size());
  return 0;
}
