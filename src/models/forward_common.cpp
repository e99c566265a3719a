#include "models/forward_common.h"

#include <algorithm>
#include <cmath>

namespace moeserve::models {

Status check_batch(const ForwardBatch& b, const BatchLimits& limits, BatchRows& rows) {
  const int64_t T = int64_t(b.tokens.size());
  for (size_t t = 0; t < b.tokens.size(); ++t) {
    if (b.tokens[t] < 0 || b.tokens[t] >= limits.n_vocab) {
      return make_error(StatusCode::kInvalidArgument,
                        "token id {} at chunk index {} is outside the vocabulary (0..{})", b.tokens[t], t,
                        limits.n_vocab - 1);
    }
  }
  std::vector<SequenceSlice> slices;
  if (b.sequences.empty()) {
    slices.push_back({0, T, b.pos0, b.kv});
  } else {
    slices.assign(b.sequences.begin(), b.sequences.end());
  }
  int64_t next_row = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const SequenceSlice& q = slices[i];
    if (q.row0 != next_row || q.n_tokens <= 0) {
      return make_error(StatusCode::kInvalidArgument,
                        "forward: sequence {} covers rows {}+{}, expected to start at {}", i, q.row0,
                        q.n_tokens, next_row);
    }
    if (q.pos0 < 0 || q.pos0 + q.n_tokens > q.kv.capacity || int64_t(q.kv.layers.size()) != limits.n_layer) {
      return make_error(StatusCode::kOutOfRange,
                        "forward: positions {}..{} do not fit a KV cache of {} positions", q.pos0,
                        q.pos0 + q.n_tokens - 1, q.kv.capacity);
    }
    if (!q.tree_parents.empty()) {
      if (int64_t(q.tree_parents.size()) != q.n_tokens || q.n_tokens > kMaxTreeRows ||
          q.tree_parents[0] != -1) {
        return make_error(
            StatusCode::kInvalidArgument,
            "forward: sequence {}'s draft tree has {} parents for {} rows (at most {}; row 0 is the "
            "root, parent -1)",
            i, q.tree_parents.size(), q.n_tokens, kMaxTreeRows);
      }
      for (int64_t j = 1; j < q.n_tokens; ++j) {
        const int32_t p = q.tree_parents[size_t(j)];
        if (p < 0 || p >= j) {
          return make_error(StatusCode::kInvalidArgument,
                            "forward: sequence {}'s draft tree gives row {} the parent {} (a row before it)",
                            i, j, p);
        }
      }
    }
    next_row += q.n_tokens;
  }
  if (next_row != T) {
    return make_error(StatusCode::kInvalidArgument, "forward: the sequences cover {} rows, the batch has {}",
                      next_row, T);
  }
  for (int64_t r : b.logit_rows) {
    if (r < 0 || r >= T)
      return make_error(StatusCode::kInvalidArgument, "forward: logit row {} outside chunk", r);
  }
  if (!b.expert_counts.empty() && int64_t(b.expert_counts.size()) != limits.n_layer * limits.n_expert) {
    return make_error(StatusCode::kInvalidArgument,
                      "forward: expert counts for {} selections, the model has {} x {}",
                      b.expert_counts.size(), limits.n_layer, limits.n_expert);
  }
  if (!b.logit_rows.empty() && b.logits == nullptr && b.greedy == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "forward: logits requested, no buffer");
  }
  rows.slices = std::move(slices);
  rows.row_slice.resize(size_t(T));
  rows.row_pos.resize(size_t(T));
  rows.row_slot.resize(size_t(T));
  rows.row_parent.clear();
  const bool any_tree = std::any_of(rows.slices.begin(), rows.slices.end(),
                                    [](const SequenceSlice& q) { return !q.tree_parents.empty(); });
  if (any_tree) rows.row_parent.assign(size_t(T), -1);
  for (size_t i = 0; i < rows.slices.size(); ++i) {
    const SequenceSlice& q = rows.slices[i];
    for (int64_t j = 0; j < q.n_tokens; ++j) {
      const size_t r = size_t(q.row0 + j);
      rows.row_slice[r] = int32_t(i);
      rows.row_slot[r] = q.pos0 + j;
      rows.row_pos[r] = q.pos0 + j;
      if (!q.tree_parents.empty() && j > 0) {
        const int32_t parent = q.tree_parents[size_t(j)];
        rows.row_parent[r] = int32_t(q.row0) + parent;
        rows.row_pos[r] = rows.row_pos[size_t(q.row0 + parent)] + 1;  // one past its parent: pos0 + depth
      }
    }
  }
  return Status::ok();
}

backend::BatchLayout batch_layout(const ForwardBatch& b, const BatchRows& rows,
                                  std::span<const backend::RopeSpec> ropes, bool profiling) {
  backend::BatchLayout layout;
  layout.tokens = b.tokens;
  layout.slices = rows.slices;
  layout.row_slice = rows.row_slice;
  layout.row_pos = rows.row_pos;
  layout.row_slot = rows.row_slot;
  layout.row_parent = rows.row_parent;
  layout.logit_rows = b.logit_rows;
  layout.ropes = ropes;
  layout.profiling = profiling;
  layout.argmax = b.greedy != nullptr && !b.logit_rows.empty();
  layout.count_experts = !b.expert_counts.empty();
  layout.decode_rows = std::clamp<int64_t>(b.decode_rows, 0, int64_t(b.tokens.size()));
  return layout;
}

Status move_rows(backend::Ops& from, const float* src, backend::Ops& to, float* dst, int64_t T, int64_t width,
                 std::vector<float>& staging) {
  const size_t bytes = size_t(T * width) * sizeof(float);
  staging.resize(size_t(T * width));
  MOESERVE_RETURN_IF_ERROR(from.download(staging.data(), src, bytes));
  return to.upload(dst, staging.data(), bytes);
}

Status output_head(const OutputHeadArgs& a, const ForwardBatch& b) {
  backend::Ops& ops = *a.ops;
  const int64_t H = a.n_embd, R = int64_t(b.logit_rows.size());
  if (R == 0) return ops.finish();
  auto grow = [&](backend::DeviceMemory& m, size_t bytes, const char* what) -> Status {
    if (m.bytes() >= bytes) return Status::ok();
    m.reset();
    MOESERVE_ASSIGN_OR_RETURN(m, a.device->allocate(bytes, what));
    ops.buffers_moved();
    return Status::ok();
  };
  MOESERVE_RETURN_IF_ERROR(grow(*a.final_rows, size_t(R * H) * sizeof(float), "workspace (final rows)"));
  float* rows = a.final_rows->as<float>();
  MOESERVE_RETURN_IF_ERROR(ops.rms_norm({.x = a.x,
                                         .w = a.norm->f32(),
                                         .out = rows,
                                         .n_rows = R,
                                         .n_cols = H,
                                         .eps = a.eps,
                                         .rows = b.logit_rows}));
  const size_t logit_bytes = size_t(R * a.n_vocab) * sizeof(float);
  // A device on host memory writes the caller's buffer directly (when given).
  float* logits = b.logits;
  if (!a.device->host_memory() || logits == nullptr) {
    MOESERVE_RETURN_IF_ERROR(grow(*a.logits, logit_bytes, "workspace (logits)"));
    logits = a.logits->as<float>();
  }
  const backend::MatmulOp head[] = {{a.output, rows, logits, R}};
  MOESERVE_RETURN_IF_ERROR(ops.matmul(head));
  if (b.greedy != nullptr) MOESERVE_RETURN_IF_ERROR(ops.argmax_rows(logits, R, a.n_vocab, b.greedy));
  if (b.logits != nullptr && logits != b.logits)
    MOESERVE_RETURN_IF_ERROR(ops.download(b.logits, logits, logit_bytes));
  return ops.finish();
}

void WeightPlacement::add(backend::Device* d, WeightView& v, backend::WeightUse use, int64_t n_matrices,
                          bool shared, backend::ExpertSplit* split) {
  if (!v.present() || d == nullptr) return;  // null: a layer another process computes
  auto it = std::find_if(per_device_.begin(), per_device_.end(), [&](const auto& p) { return p.first == d; });
  if (it == per_device_.end()) it = per_device_.insert(per_device_.end(), {d, {}});
  it->second.push_back({&v, n_matrices, use, shared, split});
}

Status check_placement(const Placement& p, int64_t n_layer, std::string_view arch) {
  if (p.io == nullptr || (!p.layers.empty() && int64_t(p.layers.size()) != n_layer) ||
      (!p.expert_splits.empty() && int64_t(p.expert_splits.size()) != n_layer)) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: the placement names {} layers ({} expert splits), the model has {}", arch,
                      p.layers.size(), p.expert_splits.size(), n_layer);
  }
  return Status::ok();
}

void WeightPlacement::add_experts(backend::Device* d, WeightView& gate, WeightView& up, WeightView& down,
                                  int64_t n_expert, backend::ExpertSplit* split) {
  add(d, gate, backend::WeightUse::kExpertGate, n_expert, false, split);
  add(d, up, backend::WeightUse::kExpertUp, n_expert, false, split);
  add(d, down, backend::WeightUse::kExpertDown, n_expert, false, split);
}

void WeightPlacement::add_layer(backend::Device* d, std::initializer_list<WeightView*> vectors,
                                std::initializer_list<WeightView*> matrices, const LayerExperts& experts) {
  for (WeightView* v : vectors) add(d, *v, backend::WeightUse::kVector);
  for (WeightView* v : matrices) add(d, *v, backend::WeightUse::kMatrix);
  add_experts(d, *experts.gate, *experts.up, *experts.down, experts.n_expert, experts.split);
}

void WeightPlacement::add_io(const Placement& p, int64_t n_layer, WeightView& token_embd,
                             WeightView& output_norm, WeightView& output, bool tied_output) {
  const bool tied = tied_output || output.data == token_embd.data;
  const bool head = p.head_here(n_layer);
  if (p.embeds_here()) add(p.io, token_embd, backend::WeightUse::kLookup, 1, tied && head);
  if (head) {
    add(p.output(), output_norm, backend::WeightUse::kVector);
    add(p.output(), output, backend::WeightUse::kMatrix, 1, tied && p.embeds_here());
  }
}

Status WeightPlacement::place() {
  for (auto& [device, refs] : per_device_) MOESERVE_RETURN_IF_ERROR(device->place_weights(refs).status());
  return Status::ok();
}

Status check_attention_devices(const Placement& p, int64_t n_layer, int64_t head_dim, std::string_view arch,
                               const std::function<bool(int64_t)>& is_attention) {
  for (int64_t l = 0; l < n_layer; ++l) {
    if (p.layer(l) != nullptr && is_attention(l) && !p.layer(l)->supports_attention_head_dim(head_dim)) {
      return make_error(StatusCode::kUnsupported,
                        "{}: {} has no attention kernel for heads of {} (layer {}); use --device cpu", arch,
                        p.layer(l)->name(), head_dim, l);
    }
  }
  return Status::ok();
}

std::vector<backend::Device*> placement_devices(const Placement& p, int64_t n_layer) {
  std::vector<backend::Device*> devices = {p.io};
  for (int64_t il = 0; il < n_layer; ++il) {
    if (p.layer(il) != nullptr && std::find(devices.begin(), devices.end(), p.layer(il)) == devices.end())
      devices.push_back(p.layer(il));
  }
  if (p.head_here(n_layer) && std::find(devices.begin(), devices.end(), p.output()) == devices.end())
    devices.push_back(p.output());
  return devices;
}

Status norm_rope_attend(backend::Ops& ops, ForwardProfile* profile, const CacheAttentionArgs& a) {
  {
    ScopedTimer timer(profile, &ForwardProfile::attn_proj, ops);
    backend::QkNormRopeArgs r;
    r.q = a.q, r.k = a.k, r.v = a.v;
    r.q_norm = a.q_norm, r.k_norm = a.k_norm;
    r.n_head = a.n_head, r.n_head_kv = a.n_head_kv, r.head_dim = a.head_dim;
    r.eps = a.eps, r.layer = a.layer, r.rope = a.rope;
    MOESERVE_RETURN_IF_ERROR(ops.qk_norm_rope_store(r));
  }
  ScopedTimer timer(profile, &ForwardProfile::attention, ops);
  backend::AttentionOpArgs t;
  t.q = a.q, t.out = a.out;
  t.n_head = a.n_head, t.n_head_kv = a.n_head_kv, t.head_dim = a.head_dim;
  t.scale = 1.0f / std::sqrt(float(a.head_dim));
  t.layer = a.layer, t.window = a.window;
  return ops.attention(t);
}

Status check_capture(const ForwardBatch& b, int64_t n_layer) {
  if (b.capture_layers.empty()) return Status::ok();
  if (b.captured == nullptr) return make_error(StatusCode::kInvalidArgument, "capture: no destination");
  for (size_t k = 0; k < b.capture_layers.size(); ++k) {
    const int32_t l = b.capture_layers[k];
    if (l < 0 || l >= n_layer || (k > 0 && l <= b.capture_layers[k - 1])) {
      return make_error(StatusCode::kInvalidArgument,
                        "capture: layer {} (capture layers must be ascending ids below {})", l, n_layer);
    }
  }
  return Status::ok();
}

Status ensure_capture_buffer(backend::Device& device, backend::Ops& ops, backend::DeviceMemory& mem,
                             size_t bytes) {
  if (mem.bytes() >= bytes) return Status::ok();
  mem.reset();
  MOESERVE_ASSIGN_OR_RETURN(mem, device.allocate(bytes, "workspace (captured hidden rows)"));
  ops.buffers_moved();
  return Status::ok();
}

Status check_layer_range(const ForwardBatch& b, const Placement& p, int64_t n_layer) {
  if (!p.embeds_here() && p.first_layer > 0 && b.hidden_in == nullptr) {
    return make_error(StatusCode::kInvalidArgument,
                      "forward: this process computes layers {}:{}, the batch brings no hidden rows",
                      p.first_layer, p.local_end(n_layer));
  }
  if (p.local_end(n_layer) < n_layer && (b.hidden_out == nullptr || !b.logit_rows.empty())) {
    return make_error(StatusCode::kInvalidArgument,
                      "forward: this process ends at layer {} of {}: the batch must take the hidden rows "
                      "and ask for no logits",
                      p.local_end(n_layer), n_layer);
  }
  return Status::ok();
}

namespace {

// The remote forward of batch `b` over range `r` without its hidden rows;
// `slices` holds what its slices point to.
Status remote_forward(const ForwardBatch& b, const BatchRows& rows, const backend::RemoteRange& r,
                      int64_t n_layer, int64_t n_embd, std::vector<backend::RemoteSlice>& slices,
                      backend::RemoteForward& f) {
  const int64_t T = int64_t(b.tokens.size());
  slices.clear();
  slices.reserve(rows.slices.size());
  for (const SequenceSlice& q : rows.slices) {
    if (q.kv.remote_id == 0) {
      return make_error(StatusCode::kInvalidArgument,
                        "forward: a KV cache without a number for {} (layers {}:{}); make it with "
                        "Model::new_kv_cache",
                        r.layers->name(), r.begin, r.end);
    }
    slices.push_back({q.kv.remote_id, q.row0, q.n_tokens, q.pos0, q.tree_parents});
  }
  // The range's captured layers are consecutive among the ascending ids.
  const auto first = std::lower_bound(b.capture_layers.begin(), b.capture_layers.end(), int32_t(r.begin));
  const auto last = std::lower_bound(first, b.capture_layers.end(), int32_t(r.end));
  f.begin = r.begin, f.end = r.end;
  f.tokens = b.tokens;
  f.slices = slices;
  f.decode_rows = b.decode_rows;
  if (r.end == n_layer) f.logit_rows = b.logit_rows, f.logits = b.logits, f.greedy = b.greedy;
  f.capture_layers = {first, last};
  if (first != last) f.captured = b.captured + size_t(first - b.capture_layers.begin()) * size_t(T * n_embd);
  return Status::ok();
}

}  // namespace

Status run_remote_range(const ForwardBatch& b, const BatchRows& rows, const backend::RemoteRange& r,
                        int64_t n_layer, int64_t n_embd, std::vector<float>& staging) {
  const int64_t T = int64_t(b.tokens.size());
  std::vector<backend::RemoteSlice> slices;
  backend::RemoteForward f;
  MOESERVE_RETURN_IF_ERROR(remote_forward(b, rows, r, n_layer, n_embd, slices, f));
  staging.resize(size_t(T * n_embd));
  std::vector<float> out;
  if (r.begin > 0) f.hidden_in = staging.data();
  if (r.end < n_layer) {
    out.resize(size_t(T * n_embd));
    f.hidden_out = out.data();
  }
  MOESERVE_RETURN_IF_ERROR(r.layers->forward(f));
  if (r.end < n_layer) staging.swap(out);
  return Status::ok();
}

Status run_remote_range_on_device(const ForwardBatch& b, const BatchRows& rows, const backend::RemoteRange& r,
                                  int64_t n_layer, int64_t n_embd, const DeviceRows& on) {
  std::vector<backend::RemoteSlice> slices;
  backend::RemoteForward f;
  MOESERVE_RETURN_IF_ERROR(remote_forward(b, rows, r, n_layer, n_embd, slices, f));
  f.rows_device = on.device;
  if (r.begin > 0) f.hidden_in = on.in;
  if (r.end < n_layer) f.hidden_out = on.out;
  return r.layers->forward(f);
}

bool takes_rows_on(const backend::RemoteRange& r, const backend::Device& d, size_t bytes) {
  const std::string device = r.layers->rows_device();
  return !device.empty() && device == d.name() && bytes >= r.layers->rows_device_min_bytes();
}

Status check_hidden_device(const ForwardBatch& b, const backend::Device& d, int64_t layer) {
  if (b.hidden_device == d.name()) return Status::ok();
  return make_error(StatusCode::kInvalidArgument,
                    "forward: the hidden rows are in {}'s memory, layer {} runs on {}", b.hidden_device,
                    layer, d.name());
}

Status receive_rows(backend::Ops& ops, const backend::Device& d, float* dst, const float* src, size_t bytes) {
  const Status direct = ops.receive_from(d, dst, src, bytes);
  if (direct.code() != StatusCode::kUnsupported) return direct;
  // (The host's memory: a plain copy.)
  MOESERVE_RETURN_IF_ERROR(ops.copy(dst, src, bytes));
  return ops.finish();
}

}  // namespace moeserve::models
