#include "muon/engine/qk_clip.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "muon/common/dtype.h"
#include "muon/common/status.h"

namespace muon {
namespace {

absl::Status CheckHeads(const char* which, const QkHeads& h, int heads, const Param& p,
                        bool rotary_allowed) {
  const std::string who = absl::StrCat("qk_clip ", which, " (param '", p.name, "')");
  if (p.custom != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": a custom-path parameter's layout is the host's; register it with a layout"));
  }
  if (p.batch != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": its matrix view holds ", p.batch, " matrices; an attention projection is one"));
  }
  if (h.first_row < 0 || h.rows <= 0 || h.stride < h.rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": first_row ", h.first_row, ", head_rows ", h.rows, ", head_stride ", h.stride,
        " do not describe heads (first_row >= 0, head_rows >= 1, head_stride >= head_rows)"));
  }
  if (h.rotary < 0 || h.rotary > h.rows || (!rotary_allowed && h.rotary != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": rotary_rows ", h.rotary, " must be in [0, head_rows]",
        rotary_allowed ? "" : " and 0 for keys (a shared rotary key is not scaled)"));
  }
  const int64_t end = h.first_row + (heads - 1) * h.stride + h.rows;
  if (end > p.rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": its ", heads, " heads end at row ", end, "; the matrix has ", p.rows, " rows"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckQkClipLayer(const QkClipLayer& layer, const Param& q, const Param& k) {
  if (layer.num_heads <= 0 || layer.num_kv_heads <= 0 ||
      layer.num_heads % layer.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "qk_clip: num_heads ", layer.num_heads, " and num_kv_heads ", layer.num_kv_heads,
        " must be positive, num_heads a multiple of num_kv_heads"));
  }
  if (!(layer.alpha >= 0 && layer.alpha <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("qk_clip: alpha ", layer.alpha, " must be in [0, 1]"));
  }
  absl::Status st = CheckHeads("queries", layer.q, layer.num_heads, q, true);
  if (st.ok()) st = CheckHeads("keys", layer.k, layer.num_kv_heads, k, false);
  if (!st.ok() || layer.q.param != layer.k.param) return st;
  // One fused parameter: the query and key rows must not meet.
  auto rows_of = [](const QkHeads& h, int heads, int64_t head) {
    return std::make_pair(h.first_row + head * h.stride, h.first_row + head * h.stride + h.rows);
  };
  for (int a = 0; a < layer.num_heads; ++a) {
    for (int b = 0; b < layer.num_kv_heads; ++b) {
      const auto qa = rows_of(layer.q, layer.num_heads, a);
      const auto kb = rows_of(layer.k, layer.num_kv_heads, b);
      if (qa.first < kb.second && kb.first < qa.second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "qk_clip (param '", q.name, "'): query head ", a, "'s rows [", qa.first, ", ",
            qa.second, ") meet key head ", b, "'s [", kb.first, ", ", kb.second, ")"));
      }
    }
  }
  return absl::OkStatus();
}

QkFactors QkClipFactors(const QkClipLayer& layer, const float* max_logits, double tau) {
  const int heads = layer.num_heads, groups = layer.num_kv_heads, per = heads / groups;
  std::vector<double> gamma(static_cast<size_t>(heads), 1.0);
  QkFactors f;
  for (int h = 0; h < heads; ++h) {
    const double s = max_logits[h];
    if (std::isfinite(s) && s > tau) {
      gamma[static_cast<size_t>(h)] = tau / s;
      ++f.clipped;
    }
  }
  f.q_nope.resize(static_cast<size_t>(heads));
  f.q_rope.resize(static_cast<size_t>(heads));
  f.k.resize(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) {
    const double group_gamma = *std::min_element(gamma.begin() + g * per,
                                                 gamma.begin() + (g + 1) * per);
    const double k_factor = std::pow(group_gamma, 1.0 - layer.alpha);
    f.k[static_cast<size_t>(g)] = static_cast<float>(k_factor);
    for (int h = g * per; h < (g + 1) * per; ++h) {
      // MHA (per == 1): gamma^alpha; a group: what its key left of gamma_h.
      const double q = per == 1 ? std::pow(gamma[h], layer.alpha) : gamma[h] / k_factor;
      f.q_nope[static_cast<size_t>(h)] = static_cast<float>(q);
      f.q_rope[static_cast<size_t>(h)] = static_cast<float>(gamma[h]);
    }
  }
  return f;
}

absl::Status ScaleHeads(MathBackend& math, const Param& p, const QkHeads& heads,
                        const std::vector<float>& per_head, const std::vector<float>& rotary) {
  const int64_t cols = p.cols;
  const int64_t count = static_cast<int64_t>(per_head.size());
  const size_t esize = SizeOf(p.value.dtype);
  // Runs of consecutive local elements with one factor other than 1, each
  // scaled in one call (a head's rows inside one run of the piece are one).
  int64_t start = 0, length = 0;
  float factor = 1.0f;
  auto flush = [&]() -> absl::Status {
    if (length == 0) return absl::OkStatus();
    unsigned char* first =
        static_cast<unsigned char*>(p.value.data) + static_cast<size_t>(start) * esize;
    const MatrixBatch run{first, 1, 1, length, p.value.dtype};
    length = 0;
    return math.ScaleRounded(run, factor, NsDtype::kFP32);
  };
  int64_t local = 0;  // position in the local piece
  for (const Run& run : p.piece.runs) {
    for (int64_t i = 0; i < run.length;) {
      const int64_t global = run.offset + i;
      const int64_t row = global / cols;
      const int64_t in_row = std::min(run.length - i, cols - global % cols);  // to the row's end
      const int64_t from_first = row - heads.first_row;
      const int64_t head = from_first >= 0 ? from_first / heads.stride : -1;
      const int64_t at = from_first - head * heads.stride;
      float f = 1.0f;
      if (head >= 0 && head < count && at < heads.rows) {
        f = at >= heads.rows - heads.rotary ? rotary[static_cast<size_t>(head)]
                                            : per_head[static_cast<size_t>(head)];
      }
      if (length > 0 && (f != factor || start + length != local + i)) {
        MUON_RETURN_IF_ERROR(flush());
      }
      if (f != 1.0f) {
        if (length == 0) start = local + i;
        factor = f;
        length += in_row;
      }
      i += in_row;
    }
    local += run.length;
  }
  return flush();
}

}  // namespace muon
