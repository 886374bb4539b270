// The optimizer's entry points of the update variants: QK-Clip
// (muon_register_qk_clip, muon_qk_clip; the clip itself is
// muon/engine/qk_clip.cc).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "muon/common/status.h"
#include "muon/engine/optimizer.h"

namespace muon {
namespace {

// A zero head_rows: the rows after first_row split evenly over the heads.
absl::Status Resolve(QkHeads* h, int heads, const Param& p, const char* which) {
  if (h->rows == 0 && heads > 0) {
    const int64_t left = p.rows - h->first_row;
    if (left <= 0 || left % heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "qk_clip ", which, " (param '", p.name, "'): its ", p.rows, " rows after row ",
          h->first_row, " do not split into ", heads, " heads; give ",
          which[0] == 'q' ? "q" : "k", "_head_rows"));
    }
    h->rows = left / heads;
  }
  if (h->stride == 0) h->stride = h->rows;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> Optimizer::RegisterQkClip(QkClipLayer layer) {
  MUON_ASSIGN_OR_RETURN(const Param* q, registry_.Get(layer.q.param));
  MUON_ASSIGN_OR_RETURN(const Param* k, registry_.Get(layer.k.param));
  if (layer.num_kv_heads == 0) layer.num_kv_heads = layer.num_heads;
  MUON_RETURN_IF_ERROR(Resolve(&layer.q, layer.num_heads, *q, "queries"));
  MUON_RETURN_IF_ERROR(Resolve(&layer.k, layer.num_kv_heads, *k, "keys"));
  MUON_RETURN_IF_ERROR(CheckQkClipLayer(layer, *q, *k));
  qk_layers_.push_back(layer);
  return static_cast<int64_t>(qk_layers_.size()) - 1;
}

absl::Status Optimizer::QkClip(int64_t layer_id, const float* max_logits, int num_heads,
                               double tau, void* stream, bool stream_given, int32_t* clipped) {
  if (layer_id < 0 || layer_id >= static_cast<int64_t>(qk_layers_.size())) {
    return absl::NotFoundError(absl::StrCat("layer_id ", layer_id, " is not a registered "
                                            "QK-Clip layer (", qk_layers_.size(), " are)"));
  }
  const QkClipLayer& layer = qk_layers_[static_cast<size_t>(layer_id)];
  if (num_heads != layer.num_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_logits: ", num_heads, " given; QK-Clip layer ", layer_id, " has ",
        layer.num_heads, " query heads (one max logit each)"));
  }
  if (!(tau > 0) || !std::isfinite(tau)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tau: ", tau, " is invalid; it must be a finite number > 0"));
  }
  Device& device = *registry_.device();
  if (!device.is_host() && !stream_given) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the layer's parameters are on ", device.name(), ": call muon_qk_clip_on_stream with "
        "the stream the next forward pass runs on (the scaling is enqueued there)"));
  }
  const QkFactors f = QkClipFactors(layer, max_logits, tau);
  if (clipped != nullptr) *clipped = f.clipped;
  if (f.clipped == 0) return absl::OkStatus();
  const CurrentDevice current(device);
  MUON_RETURN_IF_ERROR(current.status());
  MUON_RETURN_IF_ERROR(device.SetStream(stream));
  std::vector<Param>& params = registry_.params();
  MUON_RETURN_IF_ERROR(ScaleHeads(device.math(), params[static_cast<size_t>(layer.q.param)],
                                  layer.q, f.q_nope, f.q_rope));
  return ScaleHeads(device.math(), params[static_cast<size_t>(layer.k.param)], layer.k, f.k, f.k);
}

}  // namespace muon
