// Model shapes for the benchmarks: a small JSON reader and the loader of
// bench/models/*.json (the 2-D weights, with their counts and roles), shared
// by assignment_bench and setup_bench.
#ifndef BENCH_MODEL_FILE_H_
#define BENCH_MODEL_FILE_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace bench {

// ---------------------------------------------------------------------------
// A small JSON reader (objects, arrays, strings, numbers, literals): enough
// for the model files.

struct Json {
  enum Type { kNull, kBool, kNumber, kString, kArray, kObject } type = kNull;
  double number = 0;
  std::string str;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;

  const Json* Get(const std::string& key) const {
    for (const auto& f : fields) {
      if (f.first == key) return &f.second;
    }
    return nullptr;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}

  bool Parse(Json* out) {
    if (!Value(out)) return false;
    Skip();
    return i_ == s_.size();
  }

 private:
  void Skip() {
    while (i_ < s_.size() &&
           (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) {
      ++i_;
    }
  }
  bool Eat(char c) {
    Skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\') {
        if (++i_ >= s_.size()) return false;
        const char e = s_[i_];
        out->push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e);  // \uXXXX is not needed here
      } else {
        out->push_back(s_[i_]);
      }
      ++i_;
    }
    return i_++ < s_.size();
  }
  bool Value(Json* v) {
    Skip();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      v->type = Json::kObject;
      ++i_;
      if (Eat('}')) return true;
      do {
        std::pair<std::string, Json> f;
        if (!String(&f.first) || !Eat(':') || !Value(&f.second)) return false;
        v->fields.push_back(std::move(f));
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      v->type = Json::kArray;
      ++i_;
      if (Eat(']')) return true;
      do {
        v->items.emplace_back();
        if (!Value(&v->items.back())) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') {
      v->type = Json::kString;
      return String(&v->str);
    }
    for (const char* lit : {"true", "false", "null"}) {
      if (s_.compare(i_, std::strlen(lit), lit) == 0) {
        i_ += std::strlen(lit);
        v->type = lit[0] == 'n' ? Json::kNull : Json::kBool;
        v->number = lit[0] == 't';
        return true;
      }
    }
    char* end = nullptr;
    v->type = Json::kNumber;
    v->number = std::strtod(s_.c_str() + i_, &end);
    if (end == s_.c_str() + i_) return false;
    i_ = end - s_.c_str();
    return true;
  }

  const std::string& s_;
  size_t i_ = 0;
};

// ---------------------------------------------------------------------------
// Models.

// How tensor parallelism splits a matrix (Megatron).
enum class TpKind {
  kColumn,     // Shard(dim 0): QKV, MLP up/gate, expert w1/w3
  kRow,        // Shard(dim 1): attention out, MLP down, expert w2
  kReplicate,  // the same copy on every TP rank: the MoE router
};

struct Matrix {
  std::string name;
  int64_t rows = 0, cols = 0;
  TpKind tp = TpKind::kColumn;
  int layer = -1;   // the transformer layer, or -1 for a whole-model matrix
  int expert = -1;  // a routed expert's index within its layer, or -1
};

struct Model {
  std::string name;
  int layers = 0;
  std::vector<Matrix> matrices;  // in registration order
};

inline TpKind TpKindOf(const std::string& name) {
  auto ends_with = [&](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  if (ends_with("c_proj") || ends_with("o_proj") || ends_with("down_proj") || ends_with(".w2")) {
    return TpKind::kRow;
  }
  if (ends_with("router")) return TpKind::kReplicate;
  return TpKind::kColumn;
}

// Reads a model file. A param whose count is 1 is one whole-model matrix; a
// count that is a multiple of the layers is spread evenly over every layer
// (more than one per layer: "layers.<l>.<prefix>.<e>.<last>"). A model whose
// first D layers are dense (DeepSeek-V3: 3 of 61) lists the dense-only
// matrices with count D, the smallest count in (1, layers); then a count that
// is a multiple of layers - D is spread over the sparse layers [D, layers).
inline bool LoadModel(const std::string& path, Model* model, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot open " + path;
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  Json root;
  if (!JsonParser(text).Parse(&root) || root.type != Json::kObject) {
    *error = path + ": not valid JSON";
    return false;
  }
  const Json* name = root.Get("name");
  const Json* layers = root.Get("layers");
  const Json* params = root.Get("params");
  if (!name || !layers || !params || params->type != Json::kArray) {
    *error = path + ": expected name, layers and params";
    return false;
  }
  model->name = name->str;
  const int num_layers = static_cast<int>(layers->number);
  model->layers = num_layers;
  int dense = 0;  // D above, or 0
  for (const Json& p : params->items) {
    const Json* count = p.Get("count");
    const int64_t n = count ? static_cast<int64_t>(count->number) : 0;
    if (n > 1 && n < num_layers && (dense == 0 || n < dense)) dense = static_cast<int>(n);
  }
  // Per layer, in the file's order; whole-model matrices keep their name.
  std::vector<std::vector<Matrix>> per_layer(num_layers);
  for (const Json& p : params->items) {
    const Json* pname = p.Get("name");
    const Json* shape = p.Get("shape");
    const Json* count = p.Get("count");
    const Json* role = p.Get("role");
    if (!pname || !shape || !count || !role || shape->type != Json::kArray) {
      *error = path + ": a param lacks name, shape, count or role";
      return false;
    }
    if (role->str != "matrix" && role->str != "expert") continue;  // AdamW's
    if (shape->items.size() != 2) {
      *error = path + ": " + pname->str + " is not 2-D";
      return false;
    }
    Matrix m;
    m.rows = static_cast<int64_t>(shape->items[0].number);
    m.cols = static_cast<int64_t>(shape->items[1].number);
    m.tp = TpKindOf(pname->str);
    const int64_t n = static_cast<int64_t>(count->number);
    int first = 0, last = num_layers;  // the layers it spreads over
    if (n == 1) {
      m.name = pname->str;
      model->matrices.push_back(m);
      continue;
    }
    if (num_layers > 0 && n % num_layers == 0) {
    } else if (dense > 0 && n == dense) {
      last = dense;
    } else if (dense > 0 && n % (num_layers - dense) == 0) {
      first = dense;
    } else {
      *error = path + ": " + pname->str +
               ": count is neither 1 nor a multiple of the layers (or of the dense or sparse ones)";
      return false;
    }
    const int64_t per = n / (last - first);
    const size_t dot = pname->str.rfind('.');
    for (int l = first; l < last; ++l) {
      for (int64_t e = 0; e < per; ++e) {
        m.name = "layers." + std::to_string(l) + "." +
                 (per == 1 ? pname->str
                           : pname->str.substr(0, dot) + "." + std::to_string(e) +
                                 pname->str.substr(dot));
        m.layer = l;
        m.expert = role->str == "expert" ? static_cast<int>(e) : -1;
        per_layer[l].push_back(m);
      }
    }
  }
  for (auto& layer : per_layer) {
    for (Matrix& m : layer) model->matrices.push_back(std::move(m));
  }
  return true;
}

}  // namespace bench

#endif  // BENCH_MODEL_FILE_H_
