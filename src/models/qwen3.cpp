#include "models/qwen3.h"

#include <algorithm>
#include <cmath>

#include "models/forward_state.h"
#include "models/model_loading.h"
#include "models/walk_layers.h"

namespace moeserve::models {
namespace {

using backend::Device;
using backend::DeviceMemory;
using backend::Ops;

// One device's share of a workspace: its op queue and activation buffers.
struct DeviceBuffers {
  Device* device = nullptr;
  std::unique_ptr<Ops> ops;
  int64_t capacity = 0;  // rows
  DeviceMemory x, xn, q, k, v, attn, o, router, ff_gate, ff_up, final_rows, logits;
};

using Qwen3Workspace = DeviceWorkspace<DeviceBuffers>;

// Buffers for `rows` rows (kept when already large enough).
Status ensure_buffers(DeviceBuffers& b, const Qwen3HParams& hp, int64_t rows) {
  if (b.capacity >= rows) return Status::ok();
  const size_t t = size_t(rows), f = sizeof(float);
  auto alloc = [&](DeviceMemory& m, size_t floats, const char* what) -> Status {
    m.reset();
    MOESERVE_ASSIGN_OR_RETURN(m, b.device->allocate(floats * f, what));
    return Status::ok();
  };
  const size_t H = size_t(hp.n_embd);
  MOESERVE_RETURN_IF_ERROR(alloc(b.x, t * H, "workspace (hidden rows)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.xn, t * H, "workspace (normed rows)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.q, t * size_t(hp.q_dim()), "workspace (q)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.attn, t * size_t(hp.q_dim()), "workspace (attention)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.k, t * size_t(hp.kv_dim()), "workspace (k)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.v, t * size_t(hp.kv_dim()), "workspace (v)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.o, t * H, "workspace (output rows)"));
  if (hp.is_moe()) {
    MOESERVE_RETURN_IF_ERROR(alloc(b.router, t * size_t(hp.n_expert), "workspace (router)"));
  } else {
    MOESERVE_RETURN_IF_ERROR(alloc(b.ff_gate, t * size_t(hp.n_ff), "workspace (ffn gate)"));
    MOESERVE_RETURN_IF_ERROR(alloc(b.ff_up, t * size_t(hp.n_ff), "workspace (ffn up)"));
  }
  b.capacity = rows;
  b.ops->buffers_moved();
  return Status::ok();
}

ModelInfo make_info(const Qwen3HParams& hp, const Qwen3Weights& w) {
  ModelInfo i;
  i.arch = hp.arch_name;
  i.n_layer = hp.n_layer;
  i.n_vocab = hp.n_vocab;
  i.n_embd = hp.n_embd;
  i.n_ctx_train = hp.n_ctx_train;
  i.kv_dim = hp.kv_dim();
  i.n_expert = hp.is_moe() ? hp.n_expert : 0;
  i.n_expert_used = hp.is_moe() ? hp.n_expert_used : 0;
  i.n_params = w.n_params;
  i.n_bytes = w.n_bytes;
  i.active_bytes_per_token = w.active_bytes_per_token;
  return i;
}

}  // namespace

// One forward pass: the model's math against the ops of each layer's device.
class Qwen3Model::Forward : ForwardState<Qwen3HParams, Qwen3Weights, Qwen3Workspace> {
 public:
  Forward(const Qwen3Model& m, Qwen3Workspace& ws, ForwardProfile* profile)
      : ForwardState(m.hp_, m.w_, m.placement_, ws, profile) {}

  Status run(const ForwardBatch& b);

 private:
  Status attention_block(DeviceBuffers& d, int il, int64_t T);
  Status moe_block(DeviceBuffers& d, int il, int64_t T);

  backend::RopeSpec rope_;  // the layout's one RoPE (lives through the forward)
};

Status Qwen3Model::Forward::run(const ForwardBatch& b) {
  rope_ = {.n_rot = hp_.n_rot, .freq_base = hp_.rope_freq_base};
  const WalkSpec s = begin_walk(b, {&rope_, 1}, hp_.n_expert);
  return walk_layers(
      b, ws_, s, [&](DeviceBuffers& d, int64_t rows) { return ensure_buffers(d, hp_, rows); },
      [&](DeviceBuffers& d, int il, int64_t T, bool) -> Status {
        MOESERVE_RETURN_IF_ERROR(attention_block(d, il, T));
        return hp_.is_moe() ? moe_block(d, il, T) : dense_ffn_block(d, il, T);
      });
}

Status Qwen3Model::Forward::attention_block(DeviceBuffers& d, int il, int64_t T) {
  const Qwen3LayerWeights& l = w_.layers[size_t(il)];
  Ops& ops = *d.ops;
  const int64_t H = hp_.n_embd;
  float *x = d.x.as<float>(), *xn = d.xn.as<float>(), *q = d.q.as<float>(), *k = d.k.as<float>();
  float *v = d.v.as<float>(), *attn = d.attn.as<float>(), *o = d.o.as<float>();
  {
    ScopedTimer timer(profile_, &ForwardProfile::attn_proj, ops);
    if (!xn_ready_) {
      MOESERVE_RETURN_IF_ERROR(ops.rms_norm({.x = x,
                                             .w = l.attn_norm.f32(),
                                             .out = xn,
                                             .n_rows = T,
                                             .n_cols = H,
                                             .eps = hp_.rms_eps,
                                             .rows = {}}));
    }
    xn_ready_ = false;
    const backend::MatmulOp qkv[] = {{&l.attn_q, xn, q, T}, {&l.attn_k, xn, k, T}, {&l.attn_v, xn, v, T}};
    MOESERVE_RETURN_IF_ERROR(ops.matmul(qkv));
  }
  MOESERVE_RETURN_IF_ERROR(norm_rope_attend(
      ops, profile_, cache_attention(hp_, l, il, hp_.n_head, {.q = q, .k = k, .v = v, .out = attn})));
  ScopedTimer timer(profile_, &ForwardProfile::attn_proj, ops);
  const backend::MatmulOp out_proj[] = {{&l.attn_output, attn, o, T}};
  MOESERVE_RETURN_IF_ERROR(ops.matmul(out_proj));
  return ops.add_rms_norm(
      {.x = x, .delta = o, .w = l.ffn_norm.f32(), .out = xn, .n_rows = T, .n_cols = H, .eps = hp_.rms_eps});
}

Status Qwen3Model::Forward::moe_block(DeviceBuffers& d, int il, int64_t T) {
  MOESERVE_RETURN_IF_ERROR(route_rows(
      *d.ops, profile_, w_.layers[size_t(il)].ffn_gate_inp, d.xn.as<float>(), d.router.as<float>(),
      {.n_tokens = T, .n_expert = hp_.n_expert, .n_used = hp_.n_expert_used, .counts = routing_counts(il)}));
  ScopedTimer timer(profile_, &ForwardProfile::experts, *d.ops);
  return routed_experts_block(d, il, T);
}

// ---- the model ------------------------------------------------------------

Qwen3Model::Qwen3Model(Qwen3HParams hp, Qwen3Weights w, const Placement& placement)
    : hp_(std::move(hp)), w_(std::move(w)), placement_(placement), info_(make_info(hp_, w_)) {}

Result<std::unique_ptr<Qwen3Model>> Qwen3Model::create(Qwen3HParams hp, Qwen3Weights w,
                                                       const Placement& placement) {
  MOESERVE_RETURN_IF_ERROR(check_placement(placement, hp.n_layer, hp.arch_name));
  MOESERVE_RETURN_IF_ERROR(check_attention_devices(placement, hp.n_layer, hp.head_dim, hp.arch_name,
                                                   [](int64_t) { return true; }));
  std::unique_ptr<Qwen3Model> m(new Qwen3Model(std::move(hp), std::move(w), placement));
  MOESERVE_RETURN_IF_ERROR(m->place_weights());
  return m;
}

// Each device gets the weights of what it computes, in one call (one
// progress bar, one pass).
Status Qwen3Model::place_weights() {
  WeightPlacement placement;
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    Qwen3LayerWeights& l = w_.layers[size_t(il)];
    placement.add_layer(
        placement_.layer(il), {&l.attn_norm, &l.attn_q_norm, &l.attn_k_norm, &l.ffn_norm},
        {&l.attn_q, &l.attn_k, &l.attn_v, &l.attn_output, &l.ffn_gate, &l.ffn_up, &l.ffn_down,
         &l.ffn_gate_inp},
        {&l.ffn_gate_exps, &l.ffn_up_exps, &l.ffn_down_exps, hp_.n_expert, placement_.expert_split(il)});
  }
  placement.add_io(placement_, hp_.n_layer, w_.token_embd, w_.output_norm, w_.output, w_.tied_output);
  return placement.place();
}

Result<std::unique_ptr<Workspace>> Qwen3Model::create_workspace(int64_t max_tokens) {
  return Qwen3Workspace::create(placement_, hp_.n_layer, max_tokens,
                                [&](DeviceBuffers& b, int64_t rows) { return ensure_buffers(b, hp_, rows); });
}

Status Qwen3Model::forward(const ForwardBatch& batch, Workspace& ws, ForwardProfile* profile) {
  MOESERVE_ASSIGN_OR_RETURN(Qwen3Workspace * w, Qwen3Workspace::of(ws, hp_.arch_name));
  return Forward(*this, *w, profile).run(batch);
}

Result<std::unique_ptr<LanguageModel>> create_qwen3(const GgufFile& file, const Placement& placement) {
  return load_language_model<Qwen3Model>(file, placement, load_qwen3_hparams, load_qwen3_weights);
}

}  // namespace moeserve::models
