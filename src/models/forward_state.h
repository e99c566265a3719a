// What one forward of an architecture keeps while it walks its layers —
// the model's parts, the workspace, the profile, the batch's routing counts
// and whether xn already holds the next layer's input norm — with the FFN
// blocks every family runs the same way (ffn_blocks.h). Each model's
// Forward derives from it and keeps only its own math.
#pragma once

#include <cstdint>
#include <span>

#include "models/ffn_blocks.h"
#include "models/forward_common.h"

namespace moeserve::models {

// HParams has n_layer, n_embd, n_ff, n_ff_exp, n_expert and rms_eps;
// Weights::layers[i] has attn_norm, ffn_gate/up/down and the expert stacks.
template <typename HParams, typename Weights, typename Workspace>
class ForwardState {
 protected:
  ForwardState(const HParams& hp, const Weights& w, const Placement& placement, Workspace& ws,
               ForwardProfile* profile)
      : hp_(hp), w_(w), placement_(placement), ws_(ws), profile_(profile) {}

  // walk_layers' spec for batch b (whose routing counts the blocks add to):
  // `ropes` as the layout's (they must outlive the forward), n_expert the
  // routed experts' count (0 for a dense model).
  WalkSpec begin_walk(const ForwardBatch& b, std::span<const backend::RopeSpec> ropes, int64_t n_expert) {
    expert_counts_ = b.expert_counts;
    WalkSpec s;
    s.placement = &placement_, s.profile = profile_;
    s.limits = {hp_.n_layer, hp_.n_vocab, n_expert};
    s.ropes = ropes, s.n_embd = hp_.n_embd;
    s.token_embd = &w_.token_embd, s.output_norm = &w_.output_norm, s.output = &w_.output,
    s.eps = hp_.rms_eps;
    return s;
  }
  // The next layer's input norm when that layer runs on the same device:
  // the FFN block then writes its normed rows along with the residual (a
  // GPU fuses the two), and the next layer skips its own norm.
  const WeightView* next_attn_norm(int il) const {
    if (il + 1 >= int(hp_.n_layer) || placement_.layer(il + 1) != placement_.layer(il)) return nullptr;
    return &w_.layers[size_t(il + 1)].attn_norm;
  }
  // Layer il's routing counts in the batch's statistics (null: none asked).
  int64_t* routing_counts(int il) const {
    return expert_counts_.empty() ? nullptr : expert_counts_.data() + int64_t(il) * hp_.n_expert;
  }

  // A dense layer's FFN from the buffers (xn, x, o, ff_gate, ff_up) and
  // the layer's ffn_gate/up/down, timed as dense_ffn: x += SwiGLU of xn,
  // and xn = the next layer's input norm where it runs on this device.
  template <typename Buffers>
  Status dense_ffn_block(Buffers& d, int il, int64_t T) {
    ScopedTimer timer(profile_, &ForwardProfile::dense_ffn, *d.ops);
    const auto& l = w_.layers[size_t(il)];
    float *xn = d.xn.template as<float>(), *o = d.o.template as<float>();
    MOESERVE_RETURN_IF_ERROR(swiglu_ffn(*d.ops, {.gate = &l.ffn_gate,
                                                 .up = &l.ffn_up,
                                                 .down = &l.ffn_down,
                                                 .xn = xn,
                                                 .g = d.ff_gate.template as<float>(),
                                                 .u = d.ff_up.template as<float>(),
                                                 .out = o,
                                                 .rows = T,
                                                 .n_ff = hp_.n_ff}));
    const WeightView* next = next_attn_norm(il);
    if (next != nullptr) xn_ready_ = true;
    return add_residual(*d.ops, {.x = d.x.template as<float>(),
                                 .delta = o,
                                 .next_norm = next,
                                 .xn = xn,
                                 .rows = T,
                                 .n_embd = hp_.n_embd,
                                 .eps = hp_.rms_eps});
  }
  // The routed experts of layer il after its router (x += their sum), with
  // the placement's split of the layer and the next layer's norm fused.
  template <typename Buffers>
  Status routed_experts_block(Buffers& d, int il, int64_t T) {
    const WeightView* next = next_attn_norm(il);
    backend::ExpertFfnArgs e = routed_experts_args(hp_, w_.layers[size_t(il)], il, d.xn.template as<float>(),
                                                   d.x.template as<float>(), T, next);
    e.split = placement_.expert_split(il);
    if (next != nullptr) xn_ready_ = true;
    return d.ops->expert_ffn(e);
  }

  const HParams& hp_;
  const Weights& w_;
  const Placement& placement_;
  Workspace& ws_;
  ForwardProfile* profile_;
  bool xn_ready_ = false;             // xn already holds this layer's input norm
  std::span<int64_t> expert_counts_;  // the batch's routing statistics (empty: none)
};

}  // namespace moeserve::models
