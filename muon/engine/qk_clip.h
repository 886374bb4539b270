// MuonClip's QK-Clip (Kimi K2): after a step, the host hands over each
// attention layer's per-head max logits S_h, and the query and key weights
// of every head whose logits passed the threshold tau shrink so that its
// logits scale by gamma_h = tau / S_h:
//   MHA:  W_q[h] *= gamma_h^alpha,  W_k[h] *= gamma_h^(1 - alpha)
//   GQA:  key head g is shared by its query heads: W_k[g] *= gamma_g^(1 -
//         alpha) with gamma_g the smallest gamma of its group, and W_q[h] *=
//         gamma_h / gamma_g^(1 - alpha), so that each head's logits scale by
//         exactly its own gamma_h
//   MLA:  a query head's last `rotary` rows (its rotary part, whose key part
//         all heads share and nothing scales) *= gamma_h
// A head whose S_h is <= tau, <= 0 or not finite keeps its weights. Each
// rank scales the elements of its own pieces (rows of the parameters'
// global matrices), so the result does not depend on the layout.
#ifndef MUON_ENGINE_QK_CLIP_H_
#define MUON_ENGINE_QK_CLIP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "muon/engine/param.h"
#include "muon/math/backend.h"

namespace muon {

// Where one layer's heads lie: rows of the global matrix of a parameter.
struct QkHeads {
  int param = -1;          // the parameter's id
  int64_t first_row = 0;   // head 0's first row
  int64_t stride = 0;      // rows from one head's first row to the next's
  int64_t rows = 0;        // rows of a head the clip scales (<= stride)
  int64_t rotary = 0;      // of those, the last ones: the rotary part (queries only)
};

struct QkClipLayer {
  QkHeads q, k;
  int num_heads = 0;       // query heads (one max logit each)
  int num_kv_heads = 0;    // key heads; num_heads is a multiple of it
  double alpha = 0.5;
};

// Checks `layer` against its parameters (q and k: the registered ones its
// ids name); errors name the field and the parameter.
absl::Status CheckQkClipLayer(const QkClipLayer& layer, const Param& q, const Param& k);

// The factors of every head: q_nope[h] and q_rope[h] for query head h (its
// rows, its rotary rows), k[g] for key head g; *clipped counts the heads
// whose logits passed tau.
struct QkFactors {
  std::vector<float> q_nope, q_rope, k;
  int clipped = 0;
};
QkFactors QkClipFactors(const QkClipLayer& layer, const float* max_logits, double tau);

// Scales this rank's piece of `p` (the backend's memory: device memory on a
// GPU, stream-ordered there): every element of a head's rows by its factor
// (nope: `per_head`; the rotary rows: `rotary`) in fp32, rounded to the
// parameter's dtype; one ScaleRounded call per run of elements that share
// a factor other than 1.
absl::Status ScaleHeads(MathBackend& math, const Param& p, const QkHeads& heads,
                        const std::vector<float>& per_head, const std::vector<float>& rotary);

}  // namespace muon

#endif  // MUON_ENGINE_QK_CLIP_H_
