#include "models/dflash_draft.h"

#include <algorithm>
#include <cmath>

#include "models/forward_common.h"

namespace moeserve::models {
namespace {

using backend::Device;
using backend::DeviceMemory;
using backend::Ops;

// Context rows go through extend() in chunks of this many rows at most.
constexpr int64_t kExtendChunk = 256;

struct DraftBuffers {
  Device* device = nullptr;
  std::unique_ptr<Ops> ops;
  int64_t capacity = 0;  // rows
  DeviceMemory x, xn, q, k, v, attn, o, ff_gate, ff_up, features, final_rows, logits;
};
using DraftWorkspace = DeviceWorkspace<DraftBuffers>;

Status ensure_buffers(DraftBuffers& b, const DflashHParams& hp, int64_t rows) {
  if (b.capacity >= rows) return Status::ok();
  const size_t t = size_t(rows), f = sizeof(float);
  auto alloc = [&](DeviceMemory& m, int64_t width, const char* what) -> Status {
    m.reset();
    MOESERVE_ASSIGN_OR_RETURN(m, b.device->allocate(t * size_t(width) * f, what));
    return Status::ok();
  };
  const int64_t H = hp.n_embd;
  MOESERVE_RETURN_IF_ERROR(alloc(b.x, H, "draft workspace (hidden rows)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.xn, H, "draft workspace (normed rows)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.q, std::max(hp.q_dim(), hp.kv_dim()), "draft workspace (q)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.attn, hp.q_dim(), "draft workspace (attention)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.k, hp.kv_dim(), "draft workspace (k)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.v, hp.kv_dim(), "draft workspace (v)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.o, H, "draft workspace (output rows)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.ff_gate, hp.n_ff, "draft workspace (ffn gate)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.ff_up, hp.n_ff, "draft workspace (ffn up)"));
  MOESERVE_RETURN_IF_ERROR(alloc(b.features, hp.feature_width(), "draft workspace (features)"));
  b.capacity = rows;
  b.ops->buffers_moved();
  return Status::ok();
}

Status check_against_target(const DflashHParams& hp, const ModelInfo& t, const TokenIo& io) {
  auto mismatch = [&](const std::string& what) {
    return make_error(
        StatusCode::kInvalidArgument,
        "the DFlash draft does not fit the target model ({}, {} layers): {}; use the draft trained for "
        "this target",
        t.arch, t.n_layer, what);
  };
  if (io.embedding == nullptr || io.output == nullptr || io.device == nullptr)
    return mismatch("the target does not expose its embedding and output head");
  if (hp.n_embd != t.n_embd) {
    return mismatch(fmt::format("the draft's hidden size is {}, the target's {} (features would not match)",
                                hp.n_embd, t.n_embd));
  }
  if (hp.target_layers.back() >= t.n_layer) {
    return mismatch(fmt::format("it reads target layer {}, the target has {} layers", hp.target_layers.back(),
                                t.n_layer));
  }
  if (hp.target_layer_count > 0 && hp.target_layer_count != t.n_layer) {
    return mismatch(fmt::format("it was trained on a target of {} layers, this one has {}",
                                hp.target_layer_count, t.n_layer));
  }
  if (hp.target_vocab > 0 && hp.target_vocab != t.n_vocab) {
    return mismatch(fmt::format("its vocabulary has {} tokens, the target's {}", hp.target_vocab, t.n_vocab));
  }
  if (hp.mask_token_id >= t.n_vocab) {
    return mismatch(fmt::format("its mask token {} is outside the target's vocabulary of {}",
                                hp.mask_token_id, t.n_vocab));
  }
  if (!io.device->supports_attention_head_dim(hp.head_dim)) {
    return make_error(StatusCode::kUnsupported, "the DFlash draft's attention heads of {} do not run on {}",
                      hp.head_dim, io.device->name());
  }
  return Status::ok();
}

}  // namespace

class DflashDraft::Forward {
 public:
  Forward(const DflashDraft& m, DraftBuffers& d, ForwardProfile* profile)
      : m_(m), hp_(m.hp_), w_(m.w_), d_(d), ops_(*d.ops), profile_(profile) {}

  // One batch over the context's cache: n rows at positions ctx.length...
  Status begin(DflashContext& ctx, std::span<const int32_t> tokens, std::span<const int64_t> logit_rows,
               BatchRows& rows, float* logits = nullptr, int32_t* greedy = nullptr) {
    batch_.logits = logits;
    batch_.greedy = greedy;
    slice_ = {0, int64_t(tokens.size()), ctx.length_, KvView{ctx.views_, ctx.capacity_}, {}};
    batch_.tokens = tokens;
    batch_.sequences = {&slice_, 1};
    batch_.logit_rows = logit_rows;
    rope_ = {.n_rot = hp_.head_dim, .freq_base = hp_.rope_freq_base};
    MOESERVE_RETURN_IF_ERROR(check_batch(batch_, {hp_.n_layer, m_.n_vocab_, 0}, rows));
    return ops_.begin_batch(batch_layout(batch_, rows, {&rope_, 1}, profile_ != nullptr));
  }

  // Context rows: features (already in d.features) -> fc -> hidden_norm ->
  // each layer's K/V into the cache.
  Status context_rows(int64_t T) {
    ScopedTimer timer(profile_, &ForwardProfile::other, ops_);  // context rows
    float *xn = d_.xn.as<float>(), *k = d_.k.as<float>(), *v = d_.v.as<float>(), *q = d_.q.as<float>();
    const backend::MatmulOp fc[] = {{&w_.fc, d_.features.as<float>(), d_.o.as<float>(), T}};
    MOESERVE_RETURN_IF_ERROR(ops_.matmul(fc));
    MOESERVE_RETURN_IF_ERROR(ops_.rms_norm({.x = d_.o.as<float>(),
                                            .w = w_.hidden_norm.f32(),
                                            .out = xn,
                                            .n_rows = T,
                                            .n_cols = hp_.n_embd,
                                            .eps = hp_.rms_eps,
                                            .rows = {}}));
    for (int il = 0; il < int(hp_.n_layer); ++il) {
      const DflashLayerWeights& l = w_.layers[size_t(il)];
      const backend::MatmulOp kv[] = {{&l.attn_k, xn, k, T}, {&l.attn_v, xn, v, T}};
      MOESERVE_RETURN_IF_ERROR(ops_.matmul(kv));
      // The op norms and rotates q too: a copy of k stands in (not used).
      MOESERVE_RETURN_IF_ERROR(ops_.copy(q, k, size_t(T * hp_.kv_dim()) * sizeof(float)));
      MOESERVE_RETURN_IF_ERROR(ops_.qk_norm_rope_store({.q = q,
                                                        .k = k,
                                                        .v = v,
                                                        .q_norm = &l.attn_k_norm,
                                                        .k_norm = &l.attn_k_norm,
                                                        .n_head = hp_.n_head_kv,
                                                        .n_head_kv = hp_.n_head_kv,
                                                        .head_dim = hp_.head_dim,
                                                        .eps = hp_.rms_eps,
                                                        .layer = il,
                                                        .rope = 0}));
    }
    return ops_.finish();
  }

  // The block through every layer, then the output head (the logits and
  // arg-maxes begin() was given).
  Status block_rows(int64_t T) {
    float* x = d_.x.as<float>();
    {
      ScopedTimer timer(profile_, &ForwardProfile::embed, ops_);
      MOESERVE_RETURN_IF_ERROR(ops_.embed(*m_.target_.embedding, x));
    }
    for (int il = 0; il < int(hp_.n_layer); ++il) MOESERVE_RETURN_IF_ERROR(layer(il, T));
    ScopedTimer timer(profile_, &ForwardProfile::lm_head, ops_);
    return output_head({.device = d_.device,
                        .ops = &ops_,
                        .x = x,
                        .final_rows = &d_.final_rows,
                        .logits = &d_.logits,
                        .norm = &w_.output_norm,
                        .output = m_.target_.output,
                        .n_embd = hp_.n_embd,
                        .n_vocab = m_.n_vocab_,
                        .eps = hp_.rms_eps},
                       batch_);
  }

 private:
  Status layer(int il, int64_t T) {
    const DflashLayerWeights& l = w_.layers[size_t(il)];
    float *x = d_.x.as<float>(), *xn = d_.xn.as<float>(), *q = d_.q.as<float>(), *k = d_.k.as<float>();
    float *v = d_.v.as<float>(), *attn = d_.attn.as<float>(), *o = d_.o.as<float>();
    const int64_t H = hp_.n_embd;
    {
      ScopedTimer timer(profile_, &ForwardProfile::attn_proj, ops_);
      MOESERVE_RETURN_IF_ERROR(ops_.rms_norm({.x = x,
                                              .w = l.attn_norm.f32(),
                                              .out = xn,
                                              .n_rows = T,
                                              .n_cols = H,
                                              .eps = hp_.rms_eps,
                                              .rows = {}}));
      const backend::MatmulOp qkv[] = {{&l.attn_q, xn, q, T}, {&l.attn_k, xn, k, T}, {&l.attn_v, xn, v, T}};
      MOESERVE_RETURN_IF_ERROR(ops_.matmul(qkv));
      MOESERVE_RETURN_IF_ERROR(ops_.qk_norm_rope_store({.q = q,
                                                        .k = k,
                                                        .v = v,
                                                        .q_norm = &l.attn_q_norm,
                                                        .k_norm = &l.attn_k_norm,
                                                        .n_head = hp_.n_head,
                                                        .n_head_kv = hp_.n_head_kv,
                                                        .head_dim = hp_.head_dim,
                                                        .eps = hp_.rms_eps,
                                                        .layer = il,
                                                        .rope = 0}));
    }
    const bool sliding = hp_.sliding[size_t(il)];
    {
      ScopedTimer timer(profile_, &ForwardProfile::attention, ops_);
      MOESERVE_RETURN_IF_ERROR(ops_.attention({.q = q,
                                               .out = attn,
                                               .n_head = hp_.n_head,
                                               .n_head_kv = hp_.n_head_kv,
                                               .head_dim = hp_.head_dim,
                                               .scale = float(1.0 / std::sqrt(double(hp_.head_dim))),
                                               .layer = il,
                                               .window = sliding ? hp_.sliding_window : 0,
                                               .whole_slice = !hp_.causal[size_t(il)]}));
    }
    ScopedTimer timer(profile_, &ForwardProfile::dense_ffn, ops_);  // the output projection with the FFN
    const backend::MatmulOp out_proj[] = {{&l.attn_output, attn, o, T}};
    MOESERVE_RETURN_IF_ERROR(ops_.matmul(out_proj));
    MOESERVE_RETURN_IF_ERROR(ops_.add_rms_norm({.x = x,
                                                .delta = o,
                                                .w = l.ffn_norm.f32(),
                                                .out = xn,
                                                .n_rows = T,
                                                .n_cols = H,
                                                .eps = hp_.rms_eps}));
    float *g = d_.ff_gate.as<float>(), *u = d_.ff_up.as<float>();
    const backend::MatmulOp gate_up[] = {{&l.ffn_gate, xn, g, T}, {&l.ffn_up, xn, u, T}};
    MOESERVE_RETURN_IF_ERROR(ops_.matmul(gate_up));
    MOESERVE_RETURN_IF_ERROR(ops_.swiglu(g, u, g, T, hp_.n_ff));
    const backend::MatmulOp down[] = {{&l.ffn_down, g, o, T}};
    MOESERVE_RETURN_IF_ERROR(ops_.matmul(down));
    return ops_.add(x, o, T, H);
  }

  const DflashDraft& m_;
  const DflashHParams& hp_;
  const DflashWeights& w_;
  DraftBuffers& d_;
  Ops& ops_;
  ForwardProfile* profile_;
  SequenceSlice slice_;
  ForwardBatch batch_;
  backend::RopeSpec rope_;
};

DflashDraft::DflashDraft(DflashHParams hp, DflashWeights w, const TokenIo& target, int64_t n_vocab,
                         Device* device)
    : hp_(std::move(hp)), w_(std::move(w)), target_(target), n_vocab_(n_vocab) {
  placement_.io = device != nullptr ? device : target.device;
}

Result<WeightView> DflashDraft::host_copy(const WeightView& v, Device* from) {
  if (v.packed && !placement_.io->host_memory()) {
    return make_error(StatusCode::kUnsupported,
                      "the target keeps its {} rows in the CPU kernels' packed layout, which {} does not read: "
                      "put the draft on the target's device (leave out --device-draft)",
                      dtype_name(v.type), placement_.io->name());
  }
  const size_t bytes = size_t(v.n_rows) * v.row_bytes;
  std::vector<uint8_t>& host = io_host_.emplace_back(bytes);
  MOESERVE_RETURN_IF_ERROR(from->copy_to_host(host.data(), v.data, bytes));
  WeightView copy = v;
  copy.data = host.data();
  copy.matrix_stride = bytes;
  return copy;
}

Status DflashDraft::copy_token_io(WeightPlacement& placement) {
  Device* d = placement_.io;
  Device* output_device = target_.output_device != nullptr ? target_.output_device : target_.device;
  if (target_.device != d) {
    MOESERVE_ASSIGN_OR_RETURN(own_embedding_, host_copy(*target_.embedding, target_.device));
    placement.add(d, own_embedding_, backend::WeightUse::kLookup);
    target_.embedding = &own_embedding_;
  }
  if (output_device != d) {
    MOESERVE_ASSIGN_OR_RETURN(own_output_, host_copy(*target_.output, output_device));
    placement.add(d, own_output_, backend::WeightUse::kMatrix);
    target_.output = &own_output_;
  }
  target_.device = target_.output_device = d;
  return Status::ok();
}

Result<std::unique_ptr<DflashDraft>> DflashDraft::create(DflashHParams hp, DflashWeights w,
                                                         const TokenIo& target,
                                                         const ModelInfo& target_info, Device* device) {
  MOESERVE_RETURN_IF_ERROR(check_against_target(hp, target_info, target));
  std::unique_ptr<DflashDraft> m(
      new DflashDraft(std::move(hp), std::move(w), target, target_info.n_vocab, device));
  using backend::WeightUse;
  WeightPlacement placement;
  Device* d = m->placement_.io;
  MOESERVE_RETURN_IF_ERROR(m->copy_token_io(placement));
  for (WeightView* v : {&m->w_.hidden_norm, &m->w_.output_norm}) placement.add(d, *v, WeightUse::kVector);
  placement.add(d, m->w_.fc, WeightUse::kMatrix);
  for (DflashLayerWeights& l : m->w_.layers) {
    for (WeightView* v : {&l.attn_norm, &l.attn_q_norm, &l.attn_k_norm, &l.ffn_norm})
      placement.add(d, *v, WeightUse::kVector);
    for (WeightView* v :
         {&l.attn_q, &l.attn_k, &l.attn_v, &l.attn_output, &l.ffn_gate, &l.ffn_up, &l.ffn_down})
      placement.add(d, *v, WeightUse::kMatrix);
  }
  MOESERVE_RETURN_IF_ERROR(placement.place());
  if (!d->host_memory()) m->io_host_.clear();  // the device holds its own copies now
  return m;
}

Result<std::unique_ptr<Workspace>> DflashDraft::create_workspace() {
  const int64_t rows = std::max(kExtendChunk, hp_.block_size);
  return DraftWorkspace::create(placement_, 0, rows,
                                [&](DraftBuffers& b, int64_t r) { return ensure_buffers(b, hp_, r); });
}

// Room for `rows` rows in every layer's K/V (grown by doubling, the old rows kept).
Status DflashDraft::reserve(DflashContext& ctx, int64_t rows) {
  if (rows <= ctx.capacity_) return Status::ok();
  const int64_t capacity = std::max<int64_t>({rows, 2 * ctx.capacity_, 256});
  Device* d = placement_.io;
  const size_t row_bytes = size_t(hp_.kv_dim()) * sizeof(uint16_t);
  std::vector<DeviceMemory> k(size_t(hp_.n_layer)), v(size_t(hp_.n_layer));
  std::vector<KvLayerView> views(size_t(hp_.n_layer));
  for (size_t l = 0; l < k.size(); ++l) {
    MOESERVE_ASSIGN_OR_RETURN(k[l], d->allocate(size_t(capacity) * row_bytes, "DFlash draft context (K)"));
    MOESERVE_ASSIGN_OR_RETURN(v[l], d->allocate(size_t(capacity) * row_bytes, "DFlash draft context (V)"));
    if (ctx.length_ > 0) {
      MOESERVE_RETURN_IF_ERROR(
          d->copy_within(k[l].data(), ctx.k_[l].data(), size_t(ctx.length_) * row_bytes));
      MOESERVE_RETURN_IF_ERROR(
          d->copy_within(v[l].data(), ctx.v_[l].data(), size_t(ctx.length_) * row_bytes));
    }
    views[l].k = k[l].as<uint16_t>();
    views[l].v = v[l].as<uint16_t>();
  }
  ctx.k_ = std::move(k), ctx.v_ = std::move(v), ctx.views_ = std::move(views);
  ctx.capacity_ = capacity;
  return Status::ok();
}

Status DflashDraft::extend(DflashContext& ctx, std::span<const float> features, int64_t n, Workspace& ws,
                           ForwardProfile* profile) {
  const int64_t width = hp_.feature_width();
  if (n < 0 || int64_t(features.size()) < n * width) {
    return make_error(StatusCode::kInvalidArgument, "DFlash extend: {} rows need {} floats, got {}", n,
                      n * width, features.size());
  }
  MOESERVE_ASSIGN_OR_RETURN(DraftWorkspace * w, DraftWorkspace::of(ws, kDflashArch));
  DraftBuffers& d = w->devices.front();
  std::vector<int32_t> tokens;
  for (int64_t r0 = 0; r0 < n; r0 += kExtendChunk) {
    const int64_t T = std::min(kExtendChunk, n - r0);
    MOESERVE_RETURN_IF_ERROR(reserve(ctx, ctx.length_ + T + hp_.block_size));
    MOESERVE_RETURN_IF_ERROR(ensure_buffers(d, hp_, T));
    MOESERVE_RETURN_IF_ERROR(
        d.ops->upload(d.features.data(), features.data() + r0 * width, size_t(T * width) * sizeof(float)));
    tokens.assign(size_t(T), 0);  // context rows have no token: ids only pass the batch's checks
    Forward f(*this, d, profile);
    MOESERVE_RETURN_IF_ERROR(f.begin(ctx, tokens, {}, w->rows));
    MOESERVE_RETURN_IF_ERROR(f.context_rows(T));
    ctx.length_ += T;
  }
  return Status::ok();
}

Status DflashDraft::propose(DflashContext& ctx, int32_t root, const DraftOutputs& out, Workspace& ws,
                            ForwardProfile* profile) {
  const int64_t B = hp_.block_size, n_out = out.n_out;
  if (n_out < 1 || n_out > B - 1 || root < 0 || root >= n_vocab_ || out.top_k < 0 || out.top_k > 64 ||
      out.top_k > n_vocab_ || (out.top_k > 0 && (out.top_ids == nullptr || out.top_log_probs == nullptr))) {
    return make_error(StatusCode::kInvalidArgument,
                      "DFlash propose: {} rows of a block of {} (root {}, top-k {})", n_out, B, root,
                      out.top_k);
  }
  MOESERVE_ASSIGN_OR_RETURN(DraftWorkspace * w, DraftWorkspace::of(ws, kDflashArch));
  DraftBuffers& d = w->devices.front();
  MOESERVE_RETURN_IF_ERROR(reserve(ctx, ctx.length_ + B));
  MOESERVE_RETURN_IF_ERROR(ensure_buffers(d, hp_, B));
  std::vector<int32_t> tokens(static_cast<size_t>(B), hp_.mask_token_id);
  tokens[0] = root;
  std::vector<int64_t> rows(static_cast<size_t>(n_out));
  for (int64_t i = 0; i < n_out; ++i) rows[size_t(i)] = 1 + i;
  // A forward's logit rows come back somehow: the arg-maxes when nothing else is asked.
  std::vector<int32_t> argmax;
  int32_t* greedy = out.greedy;
  if (greedy == nullptr && out.logits == nullptr) {
    argmax.resize(static_cast<size_t>(n_out));
    greedy = argmax.data();
  }
  Forward f(*this, d, profile);
  MOESERVE_RETURN_IF_ERROR(f.begin(ctx, tokens, rows, w->rows, out.logits, greedy));
  MOESERVE_RETURN_IF_ERROR(f.block_rows(B));
  if (out.top_k == 0) return Status::ok();
  // The logits stayed where the output head wrote them (the workspace's,
  // or the caller's buffer on a host device).
  const float* logits = out.logits != nullptr && d.device->host_memory() ? out.logits : d.logits.as<float>();
  return d.ops->top_k_rows({.x = logits,
                            .n_rows = n_out,
                            .n_cols = n_vocab_,
                            .k = out.top_k,
                            .scale = hp_.output_multiplier,
                            .softcap = hp_.logit_softcap,
                            .host_ids = out.top_ids,
                            .host_log_probs = out.top_log_probs});
}

Result<std::unique_ptr<DflashDraft>> load_dflash_draft(const GgufFile& file, const LanguageModel& target,
                                                       Device* device) {
  MOESERVE_ASSIGN_OR_RETURN(DflashHParams hp, load_dflash_hparams(file));
  MOESERVE_ASSIGN_OR_RETURN(DflashWeights w, load_dflash_weights(file, hp));
  const Placement& p = target.placement();
  if (!p.embeds_here() || !p.head_here(target.info().n_layer)) {
    return make_error(
        StatusCode::kUnsupported,
        "a DFlash draft computes with its target's embedding and output head, and this target "
        "keeps them in another process (a proc: shard of --layer-split): keep the first and the "
        "last layers in this process (e.g. cpu=0:1,proc:cpu=1:47,cpu=47:48) or use --spec ngram");
  }
  return DflashDraft::create(std::move(hp), std::move(w), target.token_io(), target.info(), device);
}

}  // namespace moeserve::models
