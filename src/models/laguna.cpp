#include "models/laguna.h"

#include <algorithm>
#include <cmath>

#include "models/forward_state.h"
#include "models/model_loading.h"
#include "models/walk_layers.h"

namespace moeserve::models {
namespace {

using backend::Device;
using backend::DeviceMemory;
using backend::MatmulOp;
using backend::Ops;

// One device's share of a workspace: its op queue and activation buffers
// (attention buffers sized by the widest layer).
struct DeviceBuffers {
  Device* device = nullptr;
  std::unique_ptr<Ops> ops;
  int64_t capacity = 0;  // rows
  DeviceMemory x, xn, o, q, k, v, gate, attn;
  DeviceMemory router, ff_gate, ff_up;
  DeviceMemory final_rows, logits;
};

using LagunaWorkspace = DeviceWorkspace<DeviceBuffers>;

int64_t ffn_width(const LagunaHParams& hp) { return std::max(hp.n_ff, hp.n_ff_shexp); }
int64_t gate_width(const LagunaHParams& hp) { return hp.gate_per_element ? hp.max_q_dim() : hp.max_head(); }

int64_t floats_per_row(const LagunaHParams& hp) {
  return 3 * hp.n_embd + 2 * hp.max_q_dim() + 2 * hp.kv_dim() + gate_width(hp) + hp.n_expert +
         2 * ffn_width(hp);
}

Status ensure_buffers(DeviceBuffers& b, const LagunaHParams& hp, int64_t rows) {
  if (b.capacity >= rows) return Status::ok();
  const size_t t = size_t(rows);
  auto alloc = [&](DeviceMemory& m, int64_t width, const char* what) -> Status {
    m.reset();
    if (width == 0) return Status::ok();
    MOESERVE_ASSIGN_OR_RETURN(m, b.device->allocate(t * size_t(width) * sizeof(float), what));
    return Status::ok();
  };
  const int64_t H = hp.n_embd;
  MOESERVE_RETURN_IF_ERROR(alloc(b.x, H, "workspace (hidden rows)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.xn, H, "workspace (normed rows)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.o, H, "workspace (output rows)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.q, hp.max_q_dim(), "workspace (q)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.attn, hp.max_q_dim(), "workspace (attention)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.k, hp.kv_dim(), "workspace (k)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.v, hp.kv_dim(), "workspace (v)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.gate, gate_width(hp), "workspace (attention gate)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.router, hp.n_expert, "workspace (router)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.ff_gate, ffn_width(hp), "workspace (ffn gate)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.ff_up, ffn_width(hp), "workspace (ffn up)"));
  b.capacity = rows;
  b.ops->buffers_moved();
  return Status::ok();
}

ModelInfo make_info(const LagunaHParams& hp, const LagunaWeights& w) {
  ModelInfo i;
  i.arch = hp.arch_name;
  i.n_layer = hp.n_layer;
  i.n_vocab = hp.n_vocab;
  i.n_embd = hp.n_embd;
  i.n_ctx_train = hp.n_ctx_train;
  i.kv_dim = hp.kv_dim();
  i.n_expert = hp.n_expert;
  i.n_expert_used = hp.n_expert_used;
  i.n_params = w.n_params;
  i.n_bytes = w.n_bytes;
  i.active_bytes_per_token = w.active_bytes_per_token;
  i.workspace_floats_per_row = floats_per_row(hp);
  return i;
}

}  // namespace

class LagunaModel::Forward : ForwardState<LagunaHParams, LagunaWeights, LagunaWorkspace> {
 public:
  Forward(const LagunaModel& m, LagunaWorkspace& ws, ForwardProfile* profile)
      : ForwardState(m.hp_, m.w_, m.placement_, ws, profile) {}

  Status run(const ForwardBatch& b);

 private:
  Status attention_block(DeviceBuffers& d, int il, int64_t T);
  Status moe_block(DeviceBuffers& d, int il, int64_t T);
  Status shared_expert(DeviceBuffers& d, int il, int64_t T);
};

Status LagunaModel::Forward::run(const ForwardBatch& b) {
  const backend::RopeSpec ropes[] = {hp_.rope_full, hp_.rope_swa};  // LagunaHParams::rope_index
  const WalkSpec s = begin_walk(b, ropes, hp_.n_expert);
  return walk_layers(
      b, ws_, s, [&](DeviceBuffers& d, int64_t rows) { return ensure_buffers(d, hp_, rows); },
      [&](DeviceBuffers& d, int il, int64_t T, bool moved) -> Status {
        if (moved) xn_ready_ = false;
        MOESERVE_RETURN_IF_ERROR(attention_block(d, il, T));
        return hp_.moe_layer(il) ? moe_block(d, il, T) : dense_ffn_block(d, il, T);
      });
}

// Attention with the layer's head count, RoPE and window; the output is
// scaled by softplus(g_proj(xn)) per head (or per element) before o_proj;
// then x += o and xn = the FFN's input norm of x.
Status LagunaModel::Forward::attention_block(DeviceBuffers& d, int il, int64_t T) {
  const LagunaLayerWeights& l = w_.layers[size_t(il)];
  Ops& ops = *d.ops;
  const int64_t n_head = hp_.n_head[size_t(il)];
  float *xn = d.xn.as<float>(), *q = d.q.as<float>(), *gate = d.gate.as<float>();
  float *k = d.k.as<float>(), *v = d.v.as<float>(), *attn = d.attn.as<float>();
  {
    ScopedTimer timer(profile_, &ForwardProfile::attn_proj, ops);
    if (!xn_ready_) {
      MOESERVE_RETURN_IF_ERROR(ops.rms_norm({.x = d.x.as<float>(),
                                             .w = l.attn_norm.f32(),
                                             .out = xn,
                                             .n_rows = T,
                                             .n_cols = hp_.n_embd,
                                             .eps = hp_.rms_eps,
                                             .rows = {}}));
    }
    xn_ready_ = false;
    const MatmulOp proj[] = {
        {&l.attn_q, xn, q, T}, {&l.attn_k, xn, k, T}, {&l.attn_v, xn, v, T}, {&l.attn_gate, xn, gate, T}};
    MOESERVE_RETURN_IF_ERROR(ops.matmul(proj));
  }
  CacheAttentionArgs heads = cache_attention(hp_, l, il, n_head, {.q = q, .k = k, .v = v, .out = attn});
  heads.rope = hp_.rope_index(il);
  heads.window = hp_.sliding[size_t(il)] ? hp_.window : 0;
  MOESERVE_RETURN_IF_ERROR(norm_rope_attend(ops, profile_, heads));
  ScopedTimer timer(profile_, &ForwardProfile::attn_proj, ops);
  if (hp_.gate_per_element) {
    MOESERVE_RETURN_IF_ERROR(ops.mul_softplus(attn, gate, T, n_head * hp_.head_dim, 1));
  } else {
    MOESERVE_RETURN_IF_ERROR(ops.mul_softplus(attn, gate, T, n_head, hp_.head_dim));
  }
  const MatmulOp out_proj[] = {{&l.attn_output, attn, d.o.as<float>(), T}};
  MOESERVE_RETURN_IF_ERROR(ops.matmul(out_proj));
  return ops.add_rms_norm({.x = d.x.as<float>(),
                           .delta = d.o.as<float>(),
                           .w = l.ffn_norm.f32(),
                           .out = xn,
                           .n_rows = T,
                           .n_cols = hp_.n_embd,
                           .eps = hp_.rms_eps});
}

// x += down(silu(gate xn) * up xn): always on, no gate of its own.
Status LagunaModel::Forward::shared_expert(DeviceBuffers& d, int il, int64_t T) {
  const LagunaLayerWeights& l = w_.layers[size_t(il)];
  MOESERVE_RETURN_IF_ERROR(swiglu_ffn(*d.ops, {.gate = &l.ffn_gate_shexp,
                                               .up = &l.ffn_up_shexp,
                                               .down = &l.ffn_down_shexp,
                                               .xn = d.xn.as<float>(),
                                               .g = d.ff_gate.as<float>(),
                                               .u = d.ff_up.as<float>(),
                                               .out = d.o.as<float>(),
                                               .rows = T,
                                               .n_ff = hp_.n_ff_shexp}));
  return d.ops->add(d.x.as<float>(), d.o.as<float>(), T, hp_.n_embd);
}

Status LagunaModel::Forward::moe_block(DeviceBuffers& d, int il, int64_t T) {
  const LagunaLayerWeights& l = w_.layers[size_t(il)];
  backend::RouteOpArgs r;
  r.n_tokens = T, r.n_expert = hp_.n_expert, r.n_used = hp_.n_expert_used;
  r.counts = routing_counts(il);
  r.gating = hp_.sigmoid_gating ? backend::RouterGating::kSigmoid : backend::RouterGating::kSoftmax;
  r.selection_bias = l.ffn_exp_probs_b.present() ? l.ffn_exp_probs_b.f32() : nullptr;
  r.normalize = hp_.normalize_weights;
  r.weight_scale = hp_.expert_weights_scale;
  MOESERVE_RETURN_IF_ERROR(
      route_rows(*d.ops, profile_, l.ffn_gate_inp, d.xn.as<float>(), d.router.as<float>(), r));
  ScopedTimer timer(profile_, &ForwardProfile::experts, *d.ops);
  // The shared expert first: the routed experts' call adds into x and may
  // end with the next layer's norm of the finished sum.
  if (hp_.n_ff_shexp > 0) MOESERVE_RETURN_IF_ERROR(shared_expert(d, il, T));
  return routed_experts_block(d, il, T);
}

// ---- the model ------------------------------------------------------------

LagunaModel::LagunaModel(LagunaHParams hp, LagunaWeights w, const Placement& placement)
    : hp_(std::move(hp)), w_(std::move(w)), placement_(placement), info_(make_info(hp_, w_)) {}

Result<std::unique_ptr<LagunaModel>> LagunaModel::create(LagunaHParams hp, LagunaWeights w,
                                                         const Placement& placement) {
  MOESERVE_RETURN_IF_ERROR(check_placement(placement, hp.n_layer, hp.arch_name));
  MOESERVE_RETURN_IF_ERROR(check_attention_devices(placement, hp.n_layer, hp.head_dim, hp.arch_name,
                                                   [](int64_t) { return true; }));
  std::unique_ptr<LagunaModel> m(new LagunaModel(std::move(hp), std::move(w), placement));
  MOESERVE_RETURN_IF_ERROR(m->place_weights());
  return m;
}

Status LagunaModel::place_weights() {
  WeightPlacement placement;
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    LagunaLayerWeights& l = w_.layers[size_t(il)];
    placement.add_layer(
        placement_.layer(il), {&l.attn_norm, &l.ffn_norm, &l.attn_q_norm, &l.attn_k_norm, &l.ffn_exp_probs_b},
        {&l.attn_q, &l.attn_k, &l.attn_v, &l.attn_output, &l.attn_gate, &l.ffn_gate, &l.ffn_up, &l.ffn_down,
         &l.ffn_gate_inp, &l.ffn_gate_shexp, &l.ffn_up_shexp, &l.ffn_down_shexp},
        {&l.ffn_gate_exps, &l.ffn_up_exps, &l.ffn_down_exps, hp_.n_expert, placement_.expert_split(il)});
  }
  placement.add_io(placement_, hp_.n_layer, w_.token_embd, w_.output_norm, w_.output, w_.tied_output);
  return placement.place();
}

Result<std::unique_ptr<Workspace>> LagunaModel::create_workspace(int64_t max_tokens) {
  return LagunaWorkspace::create(placement_, hp_.n_layer, max_tokens, [&](DeviceBuffers& b, int64_t rows) {
    return ensure_buffers(b, hp_, rows);
  });
}

Status LagunaModel::forward(const ForwardBatch& batch, Workspace& ws, ForwardProfile* profile) {
  MOESERVE_ASSIGN_OR_RETURN(LagunaWorkspace * w, LagunaWorkspace::of(ws, hp_.arch_name));
  return Forward(*this, *w, profile).run(batch);
}

Result<std::unique_ptr<LanguageModel>> create_laguna(const GgufFile& file, const Placement& placement) {
  return load_language_model<LagunaModel>(file, placement, load_laguna_hparams, load_laguna_weights);
}

}  // namespace moeserve::models
