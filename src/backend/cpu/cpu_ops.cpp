// The CPU device's ops: the kernel table and the thread pool, called exactly
// as the forward pass called them before it was written against Ops (same
// kernels, same order, same threading of independent rows), so results are
// bit-identical to it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_device.h"
#include "backend/expert_split.h"
#include "kernels/cpu/gated_delta_net.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope_table.h"

namespace moeserve::backend {
namespace {

// fn(t) for t in [0, n), spread over the pool when there is more than one item.
template <typename F>
void for_each_index(ThreadPool* pool, int64_t n, F&& fn) {
  if (pool != nullptr && pool->size() > 1 && n > 1) {
    pool->parallel_for(n, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) fn(i);
    });
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

cpu::MatmulArgs mm_args(const MatmulOp& op, ThreadPool* pool) {
  cpu::MatmulArgs a;
  a.w = op.w->data;
  a.w_type = op.w->type;
  a.n_rows = op.w->n_rows;
  a.n_cols = op.w->n_cols;
  a.w_row_stride = op.w->row_bytes;
  a.w_packed = op.w->packed;
  a.x = op.x;
  a.n_tokens = op.n_tokens;
  a.y = op.y;
  a.pool = pool;
  return a;
}

class CpuOps final : public Ops {
 public:
  CpuOps(ThreadPool* pool, ExpertBackend* experts, ActivationObserver* observer)
      : pool_(pool), k_(cpu::cpu_kernels()), experts_(experts), observer_(observer) {
    if (experts_ == nullptr) {
      default_experts_ = std::make_unique<CpuExpertBackend>(pool_);
      default_experts_->set_observer(observer_);
      experts_ = default_experts_.get();
    }
  }

  Status begin_batch(const BatchLayout& layout) override {
    layout_ = layout;
    build_tree_paths();
    // The rotations depend only on the positions: one table per RoPE, once per forward.
    const int64_t T = int64_t(layout.tokens.size());
    ropes_.assign(layout.ropes.begin(), layout.ropes.end());
    cos_sin_.resize(ropes_.size());
    for (size_t r = 0; r < ropes_.size(); ++r) {
      const RopeSpec& spec = ropes_[r];
      if (spec.n_rot <= 0) continue;
      inv_freq_.resize(size_t(spec.n_rot / 2));
      for (int64_t i = 0; i < spec.n_rot / 2; ++i) inv_freq_[size_t(i)] = spec.inv_freq(i);
      cos_sin_[r].resize(size_t(T * spec.n_rot));
      for (int64_t t = 0; t < T; ++t) {
        cpu::rope_cos_sin(layout.row_pos[size_t(t)], spec.n_rot, inv_freq_.data(), spec.attn_factor,
                          cos_sin_[r].data() + t * spec.n_rot);
      }
    }
    return Status::ok();
  }

  Status embed(const WeightView& e, float* out) override {
    const auto tokens = layout_.tokens;
    for_each_index(pool_, int64_t(tokens.size()), [&](int64_t t) {
      k_.dequantize_row[dtype_slot(e.type)](e.data + size_t(tokens[size_t(t)]) * e.row_bytes,
                                            out + t * e.n_cols, e.n_cols);
    });
    return Status::ok();
  }

  Status rms_norm(const RmsNormArgs& a) override {
    const int64_t n = a.n_cols;
    if (!a.rows.empty()) {
      for (int64_t r = 0; r < a.n_rows; ++r)
        k_.rms_norm(a.x + a.rows[size_t(r)] * n, a.w, a.out + r * n, n, a.eps);
      return Status::ok();
    }
    for_each_index(pool_, a.n_rows,
                   [&](int64_t t) { k_.rms_norm(a.x + t * n, a.w, a.out + t * n, n, a.eps); });
    return Status::ok();
  }

  Status add_rms_norm(const AddRmsNormArgs& a) override {
    const int64_t n = a.n_cols;
    for_each_index(pool_, a.n_rows, [&](int64_t t) {
      if (a.delta != nullptr) k_.axpy(1.0f, a.delta + t * n, a.x + t * n, n);
      k_.rms_norm(a.x + t * n, a.w, a.out + t * n, n, a.eps);
    });
    return Status::ok();
  }

  Status matmul(std::span<const MatmulOp> group) override {
    if (observer_ != nullptr) {
      for (const MatmulOp& op : group) observer_->observe(*op.w, 0, op.x, op.n_tokens);
    }
    if (group.size() == 1) return cpu::matmul(mm_args(group[0], pool_));
    group_args_.clear();
    for (const MatmulOp& op : group) group_args_.push_back(mm_args(op, pool_));
    return cpu::matmul_group(group_args_);
  }

  Status qk_norm_rope_store(const QkNormRopeArgs& a) override;
  Status attention(const AttentionOpArgs& a) override;

  Status swiglu(const float* gate, const float* up, float* out, int64_t n_rows, int64_t n) override {
    for_each_index(pool_, n_rows, [&](int64_t t) { k_.swiglu(gate + t * n, up + t * n, out + t * n, n); });
    return Status::ok();
  }

  Status add(float* y, const float* x, int64_t n_rows, int64_t n) override {
    for_each_index(pool_, n_rows, [&](int64_t t) { k_.axpy(1.0f, x + t * n, y + t * n, n); });
    return Status::ok();
  }

  Status route(const RouteOpArgs& a) override;
  Status expert_ffn(const ExpertFfnArgs& a) override;
  Status split_q_gate(const float* qg, float* q, float* gate, int64_t n_rows, int64_t n_head,
                      int64_t head_dim) override;
  Status mul_sigmoid(float* x, const float* gate, int64_t n_rows, int64_t n_cols) override;
  Status mul_softplus(float* x, const float* gate, int64_t n_rows, int64_t n_gates, int64_t group) override;
  Status add_sigmoid_scaled(float* y, const float* x, const float* s, int64_t n_rows,
                            int64_t n_cols) override;
  Status gated_delta_net(const GatedDeltaNetArgs& a) override;

  Status download(void* host, const void* src, size_t bytes) override {
    if (bytes > 0 && host != src)
      std::copy_n(static_cast<const uint8_t*>(src), bytes, static_cast<uint8_t*>(host));
    return Status::ok();
  }
  Status upload(void* dst, const void* host, size_t bytes) override { return download(dst, host, bytes); }
  Status copy(void* dst, const void* src, size_t bytes) override { return download(dst, src, bytes); }
  Status finish() override { return Status::ok(); }
  Status top_k_rows(const TopKOpArgs& a) override;
  Status argmax_rows(const float* x, int64_t n_rows, int64_t n_cols, int32_t* host_ids) override {
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* row = x + r * n_cols;
      int32_t best = 0;
      k_.top_k(row, n_cols, 1, &best);  // ranks NaN below -inf, ties to the lower index
      host_ids[r] = row[best] > -INFINITY ? best : 0;
    }
    return Status::ok();
  }

 private:
  void group_by_expert(const ExpertFfnArgs& a);

  ThreadPool* pool_;
  const cpu::CpuKernels& k_;
  ExpertBackend* experts_;
  ActivationObserver* observer_;
  std::unique_ptr<CpuExpertBackend> default_experts_;
  BatchLayout layout_;
  std::vector<RopeSpec> ropes_;
  std::vector<std::vector<float>> cos_sin_;  // per RoPE: [T][n_rot]
  std::vector<double> inv_freq_;
  std::vector<float> route_scratch_;  // [T][E] biased scores
  std::vector<cpu::MatmulArgs> group_args_;
  // MoE: selections of the last route() and the grouped rows.
  int64_t n_used_ = 0, n_expert_ = 0;
  std::vector<int32_t> sel_;           // [T][k] expert ids
  std::vector<float> sel_w_;           // [T][k] weights
  std::vector<int32_t> order_;         // (token*k + slot) sorted by expert
  std::vector<int32_t> position_;      // inverse of order: pair -> its index in order
  std::vector<int32_t> expert_count_;  // counting sort: [n_expert + 1] offsets
  std::vector<float> gathered_, expert_out_;
  std::vector<ExpertJob> jobs_, host_jobs_;
  // Attention work items: a block of one sequence's query rows.
  struct QueryBlock {
    int32_t slice;
    int64_t row0, n;
  };
  std::vector<QueryBlock> query_blocks_;
  // Draft trees: each tree row's ancestors (root first, itself last) as
  // rows of its slice, concatenated; tree_path_at_[row] is where its own
  // path starts (-1: not a tree row). Built by begin_batch.
  std::vector<int32_t> tree_paths_, tree_path_at_;
  void build_tree_paths();
  Status gated_delta_net_tree(const GatedDeltaNetArgs& a, const SequenceSlice& seq,
                              const cpu::GdnMixerArgs& base);
};

void CpuOps::build_tree_paths() {
  tree_paths_.clear();
  tree_path_at_.clear();
  if (layout_.row_parent.empty()) return;
  const int64_t T = int64_t(layout_.tokens.size());
  tree_path_at_.assign(size_t(T), -1);
  std::vector<int32_t> path;
  for (int64_t t = 0; t < T; ++t) {
    const SequenceSlice& q = layout_.slices[size_t(layout_.row_slice[size_t(t)])];
    if (q.tree_parents.empty()) continue;
    path.clear();
    for (int64_t r = t; r >= 0; r = layout_.row_parent[size_t(r)]) {
      path.push_back(int32_t(r - q.row0));
      if (r == q.row0) break;
    }
    tree_path_at_[size_t(t)] = int32_t(tree_paths_.size());
    tree_paths_.insert(tree_paths_.end(), path.rbegin(), path.rend());
  }
}

Status CpuOps::qk_norm_rope_store(const QkNormRopeArgs& a) {
  if (a.rope < 0 || (a.rope > 0 && size_t(a.rope) >= ropes_.size())) {
    return make_error(StatusCode::kInvalidArgument, "qk_norm_rope_store: RoPE {} of {}", a.rope,
                      ropes_.size());
  }
  const int64_t n_rot = ropes_.empty() ? 0 : ropes_[size_t(a.rope)].n_rot;
  if (n_rot > a.head_dim || n_rot % 2 != 0) {
    return make_error(StatusCode::kInvalidArgument, "qk_norm_rope_store: n_rot {} for heads of {}", n_rot,
                      a.head_dim);
  }
  const int64_t T = int64_t(layout_.tokens.size()), hd = a.head_dim;
  const float* table = n_rot > 0 ? cos_sin_[size_t(a.rope)].data() : nullptr;
  const int64_t qd = a.n_head * hd, kvd = a.n_head_kv * hd;
  for_each_index(pool_, T, [&](int64_t t) {
    const backend::KvView& kv = layout_.slices[size_t(layout_.row_slice[size_t(t)])].kv;
    const KvLayerView& cache = kv.layers[size_t(a.layer)];
    // A draft tree's row is stored by row, rotated by depth; a paged cache's
    // row is in one of its blocks.
    const int64_t slot = kv.cache_row(layout_.row_slot[size_t(t)]);
    const float* cs = table + t * n_rot;
    for (int64_t h = 0; h < a.n_head; ++h) {
      float* qh = a.q + t * qd + h * hd;
      if (a.q_norm != nullptr) k_.rms_norm(qh, a.q_norm->f32(), qh, hd, a.eps);
      if (n_rot > 0) k_.rope_neox(qh, n_rot, cs);
    }
    for (int64_t h = 0; h < a.n_head_kv; ++h) {
      float* kh = a.k + t * kvd + h * hd;
      if (a.k_norm != nullptr) k_.rms_norm(kh, a.k_norm->f32(), kh, hd, a.eps);
      if (n_rot > 0) k_.rope_neox(kh, n_rot, cs);
    }
    k_.quantize_row[dtype_slot(DType::F16)](a.k + t * kvd, cache.k + slot * kvd, kvd);
    k_.quantize_row[dtype_slot(DType::F16)](a.v + t * kvd, cache.v + slot * kvd, kvd);
  });
  return Status::ok();
}

static float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

Status CpuOps::split_q_gate(const float* qg, float* q, float* gate, int64_t n_rows, int64_t n_head,
                            int64_t head_dim) {
  const size_t bytes = size_t(head_dim) * sizeof(float);
  for_each_index(pool_, n_rows, [&](int64_t t) {
    for (int64_t h = 0; h < n_head; ++h) {
      const float* src = qg + (t * n_head + h) * 2 * head_dim;
      std::memcpy(q + (t * n_head + h) * head_dim, src, bytes);
      std::memcpy(gate + (t * n_head + h) * head_dim, src + head_dim, bytes);
    }
  });
  return Status::ok();
}

Status CpuOps::mul_sigmoid(float* x, const float* gate, int64_t n_rows, int64_t n_cols) {
  for_each_index(pool_, n_rows, [&](int64_t t) {
    for (int64_t c = t * n_cols; c < (t + 1) * n_cols; ++c) x[c] *= sigmoid(gate[c]);
  });
  return Status::ok();
}

Status CpuOps::mul_softplus(float* x, const float* gate, int64_t n_rows, int64_t n_gates, int64_t group) {
  for_each_index(pool_, n_rows, [&](int64_t t) {
    for (int64_t g = 0; g < n_gates; ++g) {
      const float v = gate[t * n_gates + g];
      const float s = v > 20.0f ? v : std::log1p(std::exp(v));  // torch's softplus threshold
      float* row = x + (t * n_gates + g) * group;
      for (int64_t i = 0; i < group; ++i) row[i] *= s;
    }
  });
  return Status::ok();
}

Status CpuOps::add_sigmoid_scaled(float* y, const float* x, const float* s, int64_t n_rows, int64_t n_cols) {
  for (int64_t t = 0; t < n_rows; ++t) k_.axpy(sigmoid(s[t]), x + t * n_cols, y + t * n_cols, n_cols);
  return Status::ok();
}

// One mixer call per sequence: the recurrence runs along each sequence's
// own tokens from its own state (split over V heads inside the kernels).
Status CpuOps::gated_delta_net(const GatedDeltaNetArgs& a) {
  const int64_t conv_dim = a.conv_dim(), n_v = a.n_v_heads, vd = n_v * a.head_v_dim;
  for (const SequenceSlice& seq : layout_.slices) {
    float* state = seq.kv.layers[size_t(a.layer)].state;
    if (state == nullptr) {
      return make_error(StatusCode::kInternal, "gated_delta_net: layer {} has no recurrent state", a.layer);
    }
    const int64_t r0 = seq.row0;
    cpu::GdnMixerArgs m;
    m.heads = {a.n_k_heads, n_v, a.head_k_dim, a.head_v_dim, cpu::GdnHeadOrder::kTiled};
    m.conv_kernel = a.conv_kernel;
    m.conv_weight = a.conv_weight->f32();
    m.a_neg = a.a_neg->f32();
    m.dt_bias = a.dt_bias->f32();
    m.norm_weight = a.norm->f32();
    m.n_tokens = seq.n_tokens;
    m.qkv = a.qkv + r0 * conv_dim;
    m.qkv_stride = conv_dim;
    m.b = a.b + r0 * n_v;
    m.a = a.a + r0 * n_v;
    m.ba_stride = n_v;
    m.z = a.z + r0 * vd;
    m.z_stride = vd;
    m.out = a.out + r0 * vd;
    m.out_stride = vd;
    m.conv_state = state;
    m.ssm_state = state + int64_t(a.conv_kernel - 1) * conv_dim;
    m.norm_eps = a.norm_eps;
    m.pool = pool_;
    if (!seq.tree_parents.empty()) {
      MOESERVE_RETURN_IF_ERROR(gated_delta_net_tree(a, seq, m));
      continue;
    }
    MOESERVE_RETURN_IF_ERROR(cpu::gdn_mixer_core(m));
  }
  return Status::ok();
}

// A draft tree: row by row, each from its parent's state (the root from
// the sequence's), into its own node state; the sequence's state stays as
// it was. One row at a time is exactly a decode step's arithmetic.
Status CpuOps::gated_delta_net_tree(const GatedDeltaNetArgs& a, const SequenceSlice& seq,
                                    const cpu::GdnMixerArgs& base) {
  const KvLayerView& cache = seq.kv.layers[size_t(a.layer)];
  const int64_t conv_dim = a.conv_dim(), n_v = a.n_v_heads, vd = n_v * a.head_v_dim;
  const int64_t floats = a.state_floats();
  if (cache.node_states == nullptr || cache.max_nodes < seq.n_tokens) {
    return make_error(StatusCode::kInternal,
                      "gated_delta_net: layer {} has room for {} draft-tree states, {} needed", a.layer,
                      cache.max_nodes, seq.n_tokens);
  }
  for (int64_t j = 0; j < seq.n_tokens; ++j) {
    const int32_t parent = seq.tree_parents[size_t(j)];
    const float* from = parent < 0 ? cache.state : cache.node_states + int64_t(parent) * floats;
    float* node = cache.node_states + j * floats;
    std::copy(from, from + floats, node);
    cpu::GdnMixerArgs m = base;
    m.n_tokens = 1;
    m.qkv = base.qkv + j * conv_dim;
    m.b = base.b + j * n_v;
    m.a = base.a + j * n_v;
    m.z = base.z + j * vd;
    m.out = base.out + j * vd;
    m.conv_state = node;
    m.ssm_state = node + int64_t(a.conv_kernel - 1) * conv_dim;
    MOESERVE_RETURN_IF_ERROR(cpu::gdn_mixer_core(m));
  }
  return Status::ok();
}

Status CpuOps::attention(const AttentionOpArgs& a) {
  const int64_t hd = a.head_dim, qd = a.n_head * hd, kvd = a.n_head_kv * hd;
  const int64_t group = a.n_head / a.n_head_kv;
  // Tasks: (kv head, block of one sequence's queries). Later queries see
  // more keys, so small blocks handed out dynamically balance the causal
  // triangle.
  constexpr int64_t kQueryBlock = 16;
  query_blocks_.clear();
  for (size_t i = 0; i < layout_.slices.size(); ++i) {
    const SequenceSlice& q = layout_.slices[i];
    // A draft tree's rows see different keys: one row a block.
    const int64_t block = q.tree_parents.empty() ? kQueryBlock : 1;
    for (int64_t r = 0; r < q.n_tokens; r += block) {
      query_blocks_.push_back({int32_t(i), q.row0 + r, std::min(block, q.n_tokens - r)});
    }
  }
  const int64_t n_blocks = int64_t(query_blocks_.size());
  auto task = [&](int64_t idx, int) {
    const int64_t g = idx % a.n_head_kv;
    const QueryBlock& qb = query_blocks_[size_t(idx / a.n_head_kv)];
    const SequenceSlice& seq = layout_.slices[size_t(qb.slice)];
    const KvLayerView& cache = seq.kv.layers[size_t(a.layer)];
    const int64_t t0 = qb.row0, n = qb.n;
    const int64_t p0 = seq.pos0 + (t0 - seq.row0);
    cpu::AttentionArgs c;
    c.q = a.q + t0 * qd + g * group * hd;
    c.out = a.out + t0 * qd + g * group * hd;
    c.k = cache.k + g * hd;
    c.v = cache.v + g * hd;
    c.n_q = n;
    c.n_heads = group;
    c.q_head_stride = hd;
    c.q_token_stride = qd;
    c.n_kv = p0 + n;
    c.kv_stride = kvd;
    c.head_dim = hd;
    c.q_pos0 = p0;
    c.scale = a.scale;
    c.window = a.window;
    c.block_table = seq.kv.block_table;
    c.block_shift = seq.kv.block_shift;
    if (a.whole_slice) {
      c.causal = false;
      c.n_kv = seq.pos0 + seq.n_tokens;
    }
    if (!seq.tree_parents.empty()) {
      // Keys at positions pos0.. are the row's ancestors (AttentionArgs::tree_base).
      const int64_t pos = layout_.row_pos[size_t(t0)];
      c.q_pos0 = pos;
      c.n_kv = pos + 1;
      c.tree_base = seq.pos0;
      c.tree_path = tree_paths_.data() + tree_path_at_[size_t(t0)];
    }
    k_.attention(c);
  };
  if (pool_ != nullptr) {
    pool_->run(n_blocks * a.n_head_kv, task);
  } else {
    for (int64_t i = 0; i < n_blocks * a.n_head_kv; ++i) task(i, 0);
  }
  return Status::ok();
}

Status CpuOps::top_k_rows(const TopKOpArgs& a) {
  if (a.n_rows < 0 || a.n_cols < 1 || a.k < 1 || a.k > 64 || a.k > a.n_cols)
    return make_error(StatusCode::kInvalidArgument, "top_k_rows: {} x {}, k {}", a.n_rows, a.n_cols, a.k);
  // The scaled (and capped) row, then the kernel table's top-k (ties to the
  // lower index, as the sampler's) and the log-softmax of what it picked.
  for_each_index(pool_, a.n_rows, [&](int64_t r) {
    std::vector<float> v(static_cast<size_t>(a.n_cols));
    const float* row = a.x + r * a.n_cols;
    float max = -INFINITY;
    for (int64_t i = 0; i < a.n_cols; ++i) {
      float x = row[i] * a.scale;
      if (a.softcap > 0.0f) x = a.softcap * std::tanh(x / a.softcap);
      v[size_t(i)] = std::isnan(x) ? -INFINITY : x;
      max = std::max(max, v[size_t(i)]);
    }
    double sum = 0.0;
    if (max > -INFINITY) {
      for (float x : v) sum += std::exp(double(x - max));
    }
    const double lse = max > -INFINITY ? double(max) + std::log(sum) : 0.0;
    int32_t* ids = a.host_ids + r * a.k;
    k_.top_k(v.data(), a.n_cols, a.k, ids);
    for (int j = 0; j < a.k; ++j) a.host_log_probs[r * a.k + j] = float(double(v[size_t(ids[j])]) - lse);
  });
  return Status::ok();
}

Status CpuOps::route(const RouteOpArgs& a) {
  const int64_t T = a.n_tokens, E = a.n_expert, K = a.n_used;
  n_used_ = K;
  n_expert_ = E;
  sel_.resize(size_t(T * K));
  sel_w_.resize(size_t(T * K));
  float* probs = const_cast<float*>(a.logits);
  const bool sigmoid_gating = a.gating == RouterGating::kSigmoid;
  // Probabilities (f32) -> top-k (of the biased scores when a bias is set)
  // -> the unbiased probabilities, renormalised to sum 1 when asked, x scale.
  if (a.selection_bias != nullptr) route_scratch_.resize(size_t(T * E));
  for_each_index(pool_, T, [&](int64_t t) {
    float* p = probs + t * E;
    if (sigmoid_gating) {
      for (int64_t e = 0; e < E; ++e) p[e] = sigmoid(p[e]);
    } else {
      k_.softmax(p, E);
    }
    int32_t* ids = sel_.data() + t * K;
    if (a.selection_bias != nullptr) {
      float* biased = route_scratch_.data() + t * E;
      for (int64_t e = 0; e < E; ++e) biased[e] = p[e] + a.selection_bias[e];
      k_.top_k(biased, E, K, ids);
    } else {
      k_.top_k(p, E, K, ids);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) sum += p[ids[j]];
    const float scale = a.weight_scale / (a.normalize && sum > 0.0f ? sum : 1.0f);
    for (int64_t j = 0; j < K; ++j) sel_w_[size_t(t * K + j)] = p[ids[j]] * scale;
  });
  if (a.counts != nullptr) {
    for (int32_t id : sel_) a.counts[id] += 1;
  }
  return Status::ok();
}

// (token, slot) pairs grouped by expert, tokens in order within an expert
// (a counting sort: the stable order), one ExpertJob per selected expert,
// and each pair's input row gathered next to its expert's other rows.
void CpuOps::group_by_expert(const ExpertFfnArgs& a) {
  const int64_t T = a.n_tokens, H = a.n_embd, E = n_expert_, K = n_used_, n = T * K;
  order_.resize(size_t(n));
  position_.resize(size_t(n));
  expert_out_.resize(size_t(n * H));
  expert_count_.assign(size_t(E) + 1, 0);
  for (int64_t i = 0; i < n; ++i) expert_count_[size_t(sel_[size_t(i)]) + 1] += 1;
  for (int64_t e = 0; e < E; ++e) expert_count_[size_t(e) + 1] += expert_count_[size_t(e)];
  // One token: every expert reads the same row, in place.
  const bool gather_rows = T > 1;
  if (gather_rows) gathered_.resize(size_t(n * H));
  jobs_.clear();
  for (int64_t e = 0; e < E; ++e) {
    const int32_t begin = expert_count_[size_t(e)], end = expert_count_[size_t(e) + 1];
    if (end > begin) {
      const float* x = gather_rows ? gathered_.data() + int64_t(begin) * H : a.xn;
      jobs_.push_back({int32_t(e), x, end - begin, expert_out_.data() + int64_t(begin) * H});
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t at = expert_count_[size_t(sel_[size_t(i)])]++;
    order_[size_t(at)] = int32_t(i);
    position_[size_t(i)] = at;
  }
  // Gathering is a copy of T*K rows: worth the threads only for a chunk.
  constexpr int64_t kParallelGatherRows = 64;
  auto gather = [&](int64_t i) {
    std::copy_n(a.xn + (order_[size_t(i)] / K) * H, H, gathered_.data() + i * H);
  };
  if (gather_rows) for_each_index(n >= kParallelGatherRows ? pool_ : nullptr, n, gather);
}

Status CpuOps::expert_ffn(const ExpertFfnArgs& a) {
  if (int64_t(sel_.size()) != a.n_tokens * n_used_) {
    return make_error(StatusCode::kInternal, "expert_ffn: {} tokens, but the last route() had {}", a.n_tokens,
                      n_used_ > 0 ? int64_t(sel_.size()) / n_used_ : 0);
  }
  group_by_expert(a);
  const int64_t H = a.n_embd, K = n_used_;
  ExpertBatch batch;
  batch.layer = a.layer;
  batch.n_embd = H;
  batch.n_ff = a.n_ff;
  batch.gate = a.gate;
  batch.up = a.up;
  batch.down = a.down;
  batch.jobs = jobs_;
  HostCall host;
  if (a.split != nullptr && !a.split->all_local()) {
    // Jobs of the host's experts go there; this device computes the rest.
    // Both write the same output rows, so the combine below is unchanged.
    host_jobs_.clear();
    for (size_t p = 0; p < sel_.size(); ++p)
      a.split->count_pair(sel_[p], int64_t(p) / K < layout_.decode_rows);
    std::erase_if(jobs_, [&](const ExpertJob& j) {
      if (a.split->is_local(j.expert)) return false;
      host_jobs_.push_back(j);
      return true;
    });
    batch.jobs = jobs_;
    // A host backend in another process computes while this device does.
    host = a.split->start_on_host(a.layer, H, a.n_ff, host_jobs_);
  }
  const Status local = batch.jobs.empty() ? Status::ok() : experts_->compute(batch);
  Status hosted = host.finish();
  if (hosted.code() == StatusCode::kUnavailable) {
    // The host backend is gone (a worker process died or timed out): its
    // experts are computed here, with this device's weights and kernels,
    // which is what computing them in process gives, bit for bit.
    batch.jobs = host_jobs_;
    hosted = experts_->compute(batch);
  }
  MOESERVE_RETURN_IF_ERROR(local);
  MOESERVE_RETURN_IF_ERROR(hosted);
  // Scatter-add, one token per task. A token's slots are added in the order
  // of their experts' ids (the grouped order), the same for any thread count.
  for_each_index(pool_, a.n_tokens, [&](int64_t t) {
    constexpr int64_t kSlotsOnStack = 32;
    int32_t on_stack[kSlotsOnStack];
    std::vector<int32_t> on_heap;
    int32_t* slots = on_stack;
    if (K > kSlotsOnStack) on_heap.resize(size_t(K)), slots = on_heap.data();
    for (int64_t j = 0; j < K; ++j) slots[j] = int32_t(t * K + j);
    std::sort(slots, slots + K, [&](int32_t x, int32_t y) { return sel_[size_t(x)] < sel_[size_t(y)]; });
    for (int64_t j = 0; j < K; ++j) {
      const int32_t pair = slots[j];
      k_.axpy(sel_w_[size_t(pair)], expert_out_.data() + int64_t(position_[size_t(pair)]) * H, a.x + t * H,
              H);
    }
    if (a.norm_out != nullptr) k_.rms_norm(a.x + t * H, a.norm_w, a.norm_out + t * H, H, a.norm_eps);
  });
  return Status::ok();
}

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(ThreadPool* pool, ExpertBackend* experts, ActivationObserver* observer) {
  return std::make_unique<CpuOps>(pool, experts, observer);
}

}  // namespace moeserve::backend
