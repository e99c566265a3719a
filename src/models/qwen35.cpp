#include "models/qwen35.h"

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

// One device's share of a workspace: its op queue and activation buffers.
struct DeviceBuffers {
  Device* device = nullptr;
  std::unique_ptr<Ops> ops;
  int64_t capacity = 0;  // rows
  DeviceMemory x, xn, o;
  DeviceMemory qg, q, gate, k, v, attn;  // gated attention
  DeviceMemory qkv, z, beta, alpha;      // DeltaNet
  DeviceMemory router, ff_gate, ff_up, shared_scale;
  DeviceMemory final_rows, logits;
};

using Qwen35Workspace = DeviceWorkspace<DeviceBuffers>;

// FFN width the buffers hold: the dense FFN or the shared expert.
int64_t ffn_width(const Qwen35HParams& hp) { return hp.moe ? hp.n_ff_shexp : hp.n_ff; }

int64_t floats_per_row(const Qwen35HParams& hp) {
  return 3 * hp.n_embd + 5 * hp.q_dim() + 2 * hp.kv_dim() + hp.conv_dim() + hp.v_dim() + 2 * hp.n_v_heads +
         hp.n_expert + 2 * ffn_width(hp) + 1;
}

Status ensure_buffers(DeviceBuffers& b, const Qwen35HParams& hp, int64_t rows) {
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
  MOESERVE_RETURN_IF_ERROR(alloc(b.qg, 2 * hp.q_dim(), "workspace (q and gate)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.q, hp.q_dim(), "workspace (q)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.gate, hp.q_dim(), "workspace (attention gate)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.attn, hp.q_dim(), "workspace (attention)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.k, hp.kv_dim(), "workspace (k)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.v, hp.kv_dim(), "workspace (v)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.qkv, hp.conv_dim(), "workspace (DeltaNet qkv)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.z, hp.v_dim(), "workspace (DeltaNet z)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.beta, hp.n_v_heads, "workspace (DeltaNet beta)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.alpha, hp.n_v_heads, "workspace (DeltaNet alpha)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.router, hp.n_expert, "workspace (router)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.ff_gate, ffn_width(hp), "workspace (ffn gate)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.ff_up, ffn_width(hp), "workspace (ffn up)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.shared_scale, hp.moe ? 1 : 0, "workspace (shared expert gate)"));
  b.capacity = rows;
  b.ops->buffers_moved();
  return Status::ok();
}

ModelInfo make_info(const Qwen35HParams& hp, const Qwen35Weights& w) {
  ModelInfo i;
  i.arch = hp.arch_name;
  i.n_layer = hp.n_layer;
  i.n_vocab = hp.n_vocab;
  i.n_embd = hp.n_embd;
  i.n_ctx_train = hp.n_ctx_train;
  i.kv_dim = hp.kv_dim();
  i.n_expert = hp.moe ? hp.n_expert : 0;
  i.n_expert_used = hp.moe ? hp.n_expert_used : 0;
  i.n_params = w.n_params;
  i.n_bytes = w.n_bytes;
  i.active_bytes_per_token = w.active_bytes_per_token;
  i.workspace_floats_per_row = floats_per_row(hp);
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const bool recurrent = hp.recurrent[size_t(l)];
    i.layer_caches.push_back({.kv = !recurrent, .state_floats = recurrent ? hp.state_floats() : 0});
  }
  return i;
}

}  // namespace

class Qwen35Model::Forward : ForwardState<Qwen35HParams, Qwen35Weights, Qwen35Workspace> {
 public:
  Forward(const Qwen35Model& m, Qwen35Workspace& ws, ForwardProfile* profile)
      : ForwardState(m.hp_, m.w_, m.placement_, ws, profile) {}

  Status run(const ForwardBatch& b);

 private:
  Status input_norm(DeviceBuffers& d, int il, int64_t T);
  Status attention_block(DeviceBuffers& d, int il, int64_t T);
  Status delta_net_block(DeviceBuffers& d, int il, int64_t T);
  // x += o, then xn = the FFN's input norm of x.
  Status add_mixer_output(DeviceBuffers& d, int il, int64_t T);
  Status moe_block(DeviceBuffers& d, int il, int64_t T);
  Status shared_expert(DeviceBuffers& d, int il, int64_t T);
};

Status Qwen35Model::Forward::run(const ForwardBatch& b) {
  const backend::RopeSpec rope{.n_rot = hp_.n_rot, .freq_base = hp_.rope_freq_base};
  const WalkSpec s = begin_walk(b, {&rope, 1}, hp_.moe ? hp_.n_expert : 0);
  return walk_layers(
      b, ws_, s, [&](DeviceBuffers& d, int64_t rows) { return ensure_buffers(d, hp_, rows); },
      [&](DeviceBuffers& d, int il, int64_t T, bool) -> Status {
        MOESERVE_RETURN_IF_ERROR(hp_.recurrent[size_t(il)] ? delta_net_block(d, il, T)
                                                           : attention_block(d, il, T));
        return hp_.moe ? moe_block(d, il, T) : dense_ffn_block(d, il, T);
      });
}

Status Qwen35Model::Forward::input_norm(DeviceBuffers& d, int il, int64_t T) {
  if (xn_ready_) {
    xn_ready_ = false;
    return Status::ok();
  }
  return d.ops->rms_norm({.x = d.x.as<float>(),
                          .w = w_.layers[size_t(il)].attn_norm.f32(),
                          .out = d.xn.as<float>(),
                          .n_rows = T,
                          .n_cols = hp_.n_embd,
                          .eps = hp_.rms_eps,
                          .rows = {}});
}

Status Qwen35Model::Forward::add_mixer_output(DeviceBuffers& d, int il, int64_t T) {
  return d.ops->add_rms_norm({.x = d.x.as<float>(),
                              .delta = d.o.as<float>(),
                              .w = w_.layers[size_t(il)].post_attention_norm.f32(),
                              .out = d.xn.as<float>(),
                              .n_rows = T,
                              .n_cols = hp_.n_embd,
                              .eps = hp_.rms_eps});
}

// Gated full attention: q_proj gives per head a query and a gate; the
// attention output is scaled by sigmoid(gate) before o_proj.
Status Qwen35Model::Forward::attention_block(DeviceBuffers& d, int il, int64_t T) {
  const Qwen35LayerWeights& l = w_.layers[size_t(il)];
  Ops& ops = *d.ops;
  float *xn = d.xn.as<float>(), *qg = d.qg.as<float>(), *q = d.q.as<float>(), *gate = d.gate.as<float>();
  float *k = d.k.as<float>(), *v = d.v.as<float>(), *attn = d.attn.as<float>();
  {
    ScopedTimer timer(profile_, &ForwardProfile::attn_proj, ops);
    MOESERVE_RETURN_IF_ERROR(input_norm(d, il, T));
    const MatmulOp qkv[] = {{&l.attn_q, xn, qg, T}, {&l.attn_k, xn, k, T}, {&l.attn_v, xn, v, T}};
    MOESERVE_RETURN_IF_ERROR(ops.matmul(qkv));
    MOESERVE_RETURN_IF_ERROR(ops.split_q_gate(qg, q, gate, T, hp_.n_head, hp_.head_dim));
  }
  MOESERVE_RETURN_IF_ERROR(norm_rope_attend(
      ops, profile_, cache_attention(hp_, l, il, hp_.n_head, {.q = q, .k = k, .v = v, .out = attn})));
  ScopedTimer timer(profile_, &ForwardProfile::attn_proj, ops);
  MOESERVE_RETURN_IF_ERROR(ops.mul_sigmoid(attn, gate, T, hp_.q_dim()));
  const MatmulOp out_proj[] = {{&l.attn_output, attn, d.o.as<float>(), T}};
  MOESERVE_RETURN_IF_ERROR(ops.matmul(out_proj));
  return add_mixer_output(d, il, T);
}

// Gated DeltaNet: four input projections, the mixer over each sequence's
// recurrent state, out_proj. (Profiled as "attention".)
Status Qwen35Model::Forward::delta_net_block(DeviceBuffers& d, int il, int64_t T) {
  const Qwen35LayerWeights& l = w_.layers[size_t(il)];
  Ops& ops = *d.ops;
  float *xn = d.xn.as<float>(), *qkv = d.qkv.as<float>(), *z = d.z.as<float>();
  float *beta = d.beta.as<float>(), *alpha = d.alpha.as<float>();
  {
    ScopedTimer timer(profile_, &ForwardProfile::attn_proj, ops);
    MOESERVE_RETURN_IF_ERROR(input_norm(d, il, T));
    const MatmulOp in_proj[] = {{&l.attn_qkv, xn, qkv, T},
                                {&l.attn_gate, xn, z, T},
                                {&l.ssm_beta, xn, beta, T},
                                {&l.ssm_alpha, xn, alpha, T}};
    MOESERVE_RETURN_IF_ERROR(ops.matmul(in_proj));
  }
  {
    ScopedTimer timer(profile_, &ForwardProfile::attention, ops);
    backend::GatedDeltaNetArgs g;
    g.layer = il;
    g.n_k_heads = hp_.n_k_heads;
    g.n_v_heads = hp_.n_v_heads;
    g.head_k_dim = hp_.head_k_dim;
    g.head_v_dim = hp_.head_v_dim;
    g.conv_kernel = hp_.conv_kernel;
    g.qkv = qkv;
    g.b = beta;
    g.a = alpha;
    g.z = z;
    g.out = z;
    g.conv_weight = &l.ssm_conv1d;
    g.a_neg = &l.ssm_a;
    g.dt_bias = &l.ssm_dt;
    g.norm = &l.ssm_norm;
    g.norm_eps = hp_.rms_eps;
    MOESERVE_RETURN_IF_ERROR(ops.gated_delta_net(g));
  }
  ScopedTimer timer(profile_, &ForwardProfile::attn_proj, ops);
  const MatmulOp out_proj[] = {{&l.ssm_out, z, d.o.as<float>(), T}};
  MOESERVE_RETURN_IF_ERROR(ops.matmul(out_proj));
  return add_mixer_output(d, il, T);
}

// x += sigmoid(xn . w_gate) * down(silu(gate xn) * up xn).
Status Qwen35Model::Forward::shared_expert(DeviceBuffers& d, int il, int64_t T) {
  const Qwen35LayerWeights& l = w_.layers[size_t(il)];
  Ops& ops = *d.ops;
  float *xn = d.xn.as<float>(), *g = d.ff_gate.as<float>(), *u = d.ff_up.as<float>(), *o = d.o.as<float>();
  float* scale = d.shared_scale.as<float>();
  const MatmulOp gate_up[] = {
      {&l.ffn_gate_shexp, xn, g, T}, {&l.ffn_up_shexp, xn, u, T}, {&l.ffn_gate_inp_shexp, xn, scale, T}};
  MOESERVE_RETURN_IF_ERROR(ops.matmul(gate_up));
  MOESERVE_RETURN_IF_ERROR(ops.swiglu(g, u, g, T, hp_.n_ff_shexp));
  const MatmulOp down[] = {{&l.ffn_down_shexp, g, o, T}};
  MOESERVE_RETURN_IF_ERROR(ops.matmul(down));
  return ops.add_sigmoid_scaled(d.x.as<float>(), o, scale, T, hp_.n_embd);
}

Status Qwen35Model::Forward::moe_block(DeviceBuffers& d, int il, int64_t T) {
  MOESERVE_RETURN_IF_ERROR(route_rows(
      *d.ops, profile_, w_.layers[size_t(il)].ffn_gate_inp, d.xn.as<float>(), d.router.as<float>(),
      {.n_tokens = T, .n_expert = hp_.n_expert, .n_used = hp_.n_expert_used, .counts = routing_counts(il)}));
  ScopedTimer timer(profile_, &ForwardProfile::experts, *d.ops);
  // The shared expert first: the routed experts' call adds into x and may
  // end with the next layer's norm of the finished sum.
  if (hp_.n_ff_shexp > 0) MOESERVE_RETURN_IF_ERROR(shared_expert(d, il, T));
  return routed_experts_block(d, il, T);
}

// ---- the model ------------------------------------------------------------

Qwen35Model::Qwen35Model(Qwen35HParams hp, Qwen35Weights w, const Placement& placement)
    : hp_(std::move(hp)), w_(std::move(w)), placement_(placement), info_(make_info(hp_, w_)) {}

Result<std::unique_ptr<Qwen35Model>> Qwen35Model::create(Qwen35HParams hp, Qwen35Weights w,
                                                         const Placement& placement) {
  MOESERVE_RETURN_IF_ERROR(check_placement(placement, hp.n_layer, hp.arch_name));
  MOESERVE_RETURN_IF_ERROR(check_attention_devices(placement, hp.n_layer, hp.head_dim, hp.arch_name,
                                                   [&](int64_t l) { return !hp.recurrent[size_t(l)]; }));
  std::unique_ptr<Qwen35Model> m(new Qwen35Model(std::move(hp), std::move(w), placement));
  MOESERVE_RETURN_IF_ERROR(m->place_weights());
  return m;
}

Status Qwen35Model::place_weights() {
  WeightPlacement placement;
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    Qwen35LayerWeights& l = w_.layers[size_t(il)];
    placement.add_layer(
        placement_.layer(il),
        {&l.attn_norm, &l.post_attention_norm, &l.attn_q_norm, &l.attn_k_norm, &l.ssm_conv1d, &l.ssm_dt,
         &l.ssm_a, &l.ssm_norm},
        {&l.attn_q, &l.attn_k, &l.attn_v, &l.attn_output, &l.attn_qkv, &l.attn_gate, &l.ssm_beta,
         &l.ssm_alpha, &l.ssm_out, &l.ffn_gate, &l.ffn_up, &l.ffn_down, &l.ffn_gate_inp,
         &l.ffn_gate_inp_shexp, &l.ffn_gate_shexp, &l.ffn_up_shexp, &l.ffn_down_shexp},
        {&l.ffn_gate_exps, &l.ffn_up_exps, &l.ffn_down_exps, hp_.n_expert, placement_.expert_split(il)});
  }
  placement.add_io(placement_, hp_.n_layer, w_.token_embd, w_.output_norm, w_.output, w_.tied_output);
  return placement.place();
}

Result<std::unique_ptr<Workspace>> Qwen35Model::create_workspace(int64_t max_tokens) {
  return Qwen35Workspace::create(placement_, hp_.n_layer, max_tokens, [&](DeviceBuffers& b, int64_t rows) {
    return ensure_buffers(b, hp_, rows);
  });
}

Status Qwen35Model::forward(const ForwardBatch& batch, Workspace& ws, ForwardProfile* profile) {
  MOESERVE_ASSIGN_OR_RETURN(Qwen35Workspace * w, Qwen35Workspace::of(ws, hp_.arch_name));
  return Forward(*this, *w, profile).run(batch);
}

Result<std::unique_ptr<LanguageModel>> create_qwen35(const GgufFile& file, const Placement& placement) {
  return load_language_model<Qwen35Model>(file, placement, load_qwen35_hparams, load_qwen35_weights);
}

}  // namespace moeserve::models
