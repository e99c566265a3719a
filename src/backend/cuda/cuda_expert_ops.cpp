// The CUDA device's routing and expert ops: a layer's experts on this GPU
// (grouped over its full or compact stack), and for a layer sharing its
// experts with the host, the host's share — through mailboxes inside the
// forward's graph for small forwards (decode), through the eager stage
// (which can copy experts over) for prefill chunks.
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_ops.h"
#include "kernels/cuda/host_mailbox.h"
#include "kernels/cuda/matmul.h"

namespace moeserve::backend::cuda_impl {
namespace {

cuda::ExpertWeights expert_weights(const WeightView& w) {
  return {w.data, w.type, w.n_rows, w.n_cols, w.row_bytes, w.matrix_stride};
}

}  // namespace

Status CudaOps::route(const RouteOpArgs& a) {
  const int64_t T = a.n_tokens, E = a.n_expert, K = a.n_used, pairs = T * K;
  routed_tokens_ = T;
  if (replaying()) return Status::ok();
  const size_t sel_bytes = align_up(size_t(pairs) * 4), off_bytes = align_up(size_t(E + 1) * 4);
  const size_t scratch_bytes = align_up(cuda::route_scratch_bytes(T, E));
  // The cut groups' offsets: any groups' (a compact stack's, the streamed ones').
  const size_t cut_off_bytes = align_up(size_t(cuda::kRouteMaxExperts + 1) * 4);
  MOESERVE_ASSIGN_OR_RETURN(
      void* mem,
      moe_mem_.get(5 * sel_bytes + off_bytes + 2 * cut_off_bytes + scratch_bytes, "workspace (routing)"));
  auto* p = static_cast<uint8_t*>(mem);
  selected_ = reinterpret_cast<int32_t*>(p);
  weights_ = reinterpret_cast<float*>(p + sel_bytes);
  pairs_ = reinterpret_cast<int32_t*>(p + 2 * sel_bytes);
  offsets_ = reinterpret_cast<int32_t*>(p + 3 * sel_bytes);
  p += 3 * sel_bytes + off_bytes;
  for (int i = 0; i < 2; ++i) {
    cut_pairs_[i] = reinterpret_cast<int32_t*>(p + size_t(i) * sel_bytes);
    cut_offsets_[i] = reinterpret_cast<int32_t*>(p + 2 * sel_bytes + size_t(i) * cut_off_bytes);
  }
  p += 2 * sel_bytes + 2 * cut_off_bytes;
  cuda::RouteArgs r;
  r.logits = a.logits;
  r.n_tokens = T;
  r.n_expert = E;
  r.n_used = K;
  r.sigmoid = a.gating == RouterGating::kSigmoid;
  r.selection_bias = a.selection_bias;
  r.normalize = a.normalize;
  r.weight_scale = a.weight_scale;
  // The probabilities replace the logits, as backend.h says (unbiased).
  r.probs = const_cast<float*>(a.logits);
  r.selected = selected_;
  r.weights = weights_;
  r.pairs_by_expert = pairs_;
  r.expert_offsets = offsets_;
  r.scratch = p;
  routed_tokens_ = T;
  n_expert_ = E;
  n_used_ = K;
  MOESERVE_RETURN_IF_ERROR(cuda::route_and_group(r, stream_));
  if (a.counts == nullptr) return Status::ok();
  // Routing statistics: the selections come back (begin_batch captured no
  // graph for such a forward).
  count_ids_.resize(size_t(pairs));
  MOESERVE_RETURN_IF_ERROR(download(count_ids_.data(), selected_, size_t(pairs) * sizeof(int32_t)));
  for (int32_t id : count_ids_) {
    if (id >= 0 && id < E) a.counts[id] += 1;
  }
  return Status::ok();
}

Status CudaOps::expert_ffn(const ExpertFfnArgs& a) {
  if (a.n_tokens != routed_tokens_) {
    return make_error(StatusCode::kInternal, "expert_ffn: {} tokens, but the last route() had {}", a.n_tokens,
                      routed_tokens_);
  }
  if (replaying()) return Status::ok();
  const int64_t pairs = a.n_tokens * n_used_;
  const size_t h_bytes = align_up(size_t(pairs * a.n_ff) * 4), y_bytes = size_t(pairs * a.n_embd) * 4;
  MOESERVE_ASSIGN_OR_RETURN(void* mem, hidden_mem_.get(h_bytes + y_bytes, "workspace (experts)"));
  float* h = static_cast<float*>(mem);
  float* y = reinterpret_cast<float*>(static_cast<uint8_t*>(mem) + h_bytes);
  // A layer sharing its experts with the host: the host's inputs go down
  // first, the GPU computes its local experts (groups over the compact
  // stack) while the host computes the rest.
  const ExpertSplit* split = a.split != nullptr && !a.split->all_local() ? a.split : nullptr;
  if (split == nullptr) {
    MOESERVE_RETURN_IF_ERROR(local_experts(a, {pairs_, offsets_, n_expert_, n_used_, a.n_tokens}, h, y));
  } else if (use_mailboxes_) {
    MOESERVE_RETURN_IF_ERROR(mailbox_experts(a, *split, h, y));
  } else {
    if (host_stage_ == nullptr) host_stage_ = std::make_unique<HostExpertStage>(device_, stream_);
    MOESERVE_RETURN_IF_ERROR(host_stage_->start(selected_, a.xn, a.n_tokens, n_used_, a.n_embd));
    MOESERVE_ASSIGN_OR_RETURN(const cuda::ExpertGroups groups, local_groups(*split, pairs));
    if (groups.n_expert > 0) MOESERVE_RETURN_IF_ERROR(local_experts(a, groups, h, y));
    MOESERVE_RETURN_IF_ERROR(cold_experts(a, *split, h, y));
  }
  if (a.norm_out != nullptr) {
    cuda::CombineRmsNormArgs c;
    c.x = a.x, c.y = y, c.weights = weights_, c.n_used = n_used_;
    c.w = a.norm_w, c.out = a.norm_out, c.n_rows = a.n_tokens, c.n_cols = a.n_embd, c.eps = a.norm_eps;
    return cuda::combine_rms_norm(c, stream_);
  }
  return cuda::combine_experts({a.x, y, weights_, a.n_tokens, n_used_, a.n_embd}, stream_);
}

// A split layer of a small forward: the selections go up to the layer's
// mailbox, the GPU computes its local experts, then takes the host's rows
// (at once when every selection was local). Eagerly the host serves the
// mailbox right away; in a capture, when the graph has been launched.
Status CudaOps::mailbox_experts(const ExpertFfnArgs& a, const ExpertSplit& split, float* h, float* y) {
  if (mailboxes_ == nullptr) mailboxes_ = std::make_unique<HostMailboxes>(device_);
  const int slot = next_mailbox_++;
  bool moved = false;
  MOESERVE_ASSIGN_OR_RETURN(const cuda::MailboxView box,
                            mailboxes_->slot(slot, {a.n_tokens, n_used_, a.n_embd}, &moved));
  if (moved) buffers_moved();
  const int64_t pairs = a.n_tokens * n_used_;
  cuda::PublishArgs p;
  p.selected = selected_, p.xn = a.xn, p.n_tokens = a.n_tokens, p.n_used = n_used_, p.n_embd = a.n_embd;
  p.local = device_.local_expert_ids(&split), p.n_local = int64_t(split.local().size());
  p.forward = forward_on_device_, p.box = box, p.trace = expert_trace_enabled();
  MOESERVE_ASSIGN_OR_RETURN(const HostMailboxes::Streaming streaming, mailboxes_->streaming(slot, split));
  p.stream_offsets = streaming.offsets, p.stream_pairs = streaming.pairs, p.stream_ids = streaming.ids;
  p.n_expert = split.n_expert();
  std::copy(streaming.share.begin(), streaming.share.end(), p.stream_share);
  MOESERVE_RETURN_IF_ERROR(cuda::publish_to_host(p, stream_));
  // The cold experts the GPU streams first (their weights cross PCIe into
  // the staging while the CPU reads its share), then its own.
  if (streaming.offsets != nullptr) {
    MOESERVE_RETURN_IF_ERROR(cuda::stage_streamed(streaming.stage, stream_));
    ExpertFfnArgs streamed = a;
    streamed.gate = &streaming.staged[0], streamed.up = &streaming.staged[1],
    streamed.down = &streaming.staged[2];
    const cuda::ExpertGroups g{streaming.pairs, streaming.offsets, cuda::kStreamMaxTaken, n_used_,
                               a.n_tokens};
    MOESERVE_RETURN_IF_ERROR(local_experts(streamed, g, h, y));
  }
  MOESERVE_ASSIGN_OR_RETURN(const cuda::ExpertGroups groups, local_groups(split, pairs));
  if (groups.n_expert > 0) MOESERVE_RETURN_IF_ERROR(local_experts(a, groups, h, y));
  cuda::TakeArgs t;
  t.y = y, t.n_pairs = pairs, t.n_embd = a.n_embd, t.forward = forward_on_device_, t.box = box;
  t.trace = p.trace;
  MOESERVE_RETURN_IF_ERROR(cuda::take_from_host(t, stream_));
  const HostMailboxes::Layer layer{slot, &split, a.layer, a.n_tokens, n_used_, a.n_embd, a.n_ff};
  if (mode_ == Mode::kCapture) {
    capture_layers_.push_back(layer);
    return Status::ok();
  }
  return serve_mailboxes({&layer, 1});
}

// The host's side of a launched forward's split layers, in order. After a
// failure the rest are posted empty: the GPU finishes the forward (its
// results unused) instead of waiting for ever.
Status CudaOps::serve_mailboxes(std::span<const HostMailboxes::Layer> layers) {
  Status first = Status::ok();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (first.is_ok()) {
      first = mailboxes_->serve(layers[i], {forward_, decode_rows_}, stream_);
      if (first.is_ok() && i + 1 < layers.size()) mailboxes_->warm_next(layers[i], layers[i + 1], forward_);
    } else {
      mailboxes_->post_empty(layers[i], forward_);
    }
  }
  return first;
}

// The host's experts of a split layer: computed by the CPU threads, or
// (a prefill chunk, when the cost model says so) their weights copied here
// and computed like the local ones.
Status CudaOps::cold_experts(const ExpertFfnArgs& a, const ExpertSplit& split, float* h, float* y) {
  MOESERVE_ASSIGN_OR_RETURN(const int64_t n_host, host_stage_->collect(split, a.layer, decode_rows_));
  const ExpertSplit* next = device_.next_split(&split);
  HostExpertStage::Copied c;
  if (host_stage_->prefetched(split)) {
    // This chunk's copies were started a layer ago: the GPU computes them,
    // the CPU its share (the experts the prefetch left out) meanwhile, and
    // this thread starts the next layer's copies.
    MOESERVE_ASSIGN_OR_RETURN(c, host_stage_->take_prefetch(split));
    MOESERVE_RETURN_IF_ERROR(copied_experts(a, c, h, y));
    MOESERVE_RETURN_IF_ERROR(host_stage_->start_share(split, a.layer, a.n_ff, y));
    if (next != nullptr) MOESERVE_RETURN_IF_ERROR(host_stage_->prefetch(*next, a.n_ff));
    return host_stage_->prefetch_used(split);
  }
  if (n_host == 0) return Status::ok();
  host_stage_->plan(split, a.n_ff);
  if (host_stage_->has_copies()) {
    MOESERVE_RETURN_IF_ERROR(host_stage_->copy_to_device(split));  // on the copy stream, meanwhile:
    // A chunk that copies most of a layer's cold experts will want the
    // next layer's too: they follow on the copy stream at once.
    if (next != nullptr && host_stage_->copies_most(split) && prefetch_enabled()) {
      MOESERVE_RETURN_IF_ERROR(host_stage_->prefetch(*next, a.n_ff));
    }
  }
  MOESERVE_RETURN_IF_ERROR(host_stage_->compute_on_host(split, a.layer, a.n_ff, y));
  if (!host_stage_->has_copies()) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(c, host_stage_->wait_copies());
  MOESERVE_RETURN_IF_ERROR(copied_experts(a, c, h, y));
  return host_stage_->copies_used();
}

// The expert kernels over experts copied from the host (compact stacks).
Status CudaOps::copied_experts(const ExpertFfnArgs& a, const HostExpertStage::Copied& c, float* h, float* y) {
  MOESERVE_ASSIGN_OR_RETURN(const cuda::ExpertGroups groups,
                            local_groups(c.ids, c.n, a.n_tokens * n_used_, copied_groups_mem_));
  ExpertFfnArgs copied = a;
  copied.gate = &c.gate, copied.up = &c.up, copied.down = &c.down;
  return local_experts(copied, groups, h, y);
}

Result<cuda::ExpertGroups> CudaOps::local_groups(const ExpertSplit& split, int64_t pairs) {
  return local_groups(device_.local_expert_ids(&split), int64_t(split.local().size()), pairs,
                      local_groups_mem_);
}

Result<cuda::ExpertGroups> CudaOps::local_groups(const int32_t* ids, int64_t n_local, int64_t pairs,
                                                 Scratch& mem_for) {
  const size_t off_bytes = align_up(size_t(n_local + 1) * 4);
  MOESERVE_ASSIGN_OR_RETURN(void* mem, mem_for.get(off_bytes + size_t(pairs) * 4, "workspace (routing)"));
  auto* local_offsets = static_cast<int32_t*>(mem);
  auto* local_pairs = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(mem) + off_bytes);
  if (n_local > 0) {
    cuda::LocalGroupsArgs g;
    g.offsets = offsets_, g.pairs = pairs_, g.local = ids;
    g.n_expert = n_expert_, g.n_local = n_local;
    g.local_offsets = local_offsets, g.local_pairs = local_pairs;
    MOESERVE_RETURN_IF_ERROR(cuda::local_expert_groups(g, stream_));
  }
  return cuda::ExpertGroups{local_pairs, local_offsets, n_local, n_used_, routed_tokens_};
}

// The groups' experts of the (possibly compact) stacks. Those of types
// whose kernels choose their arithmetic by row count (all but those of
// gemm_kq.cu's integer kernel: matmul.h, expert_kernel_ignores_batch) give
// a verify's rows, and a mixed forward's decode rows,
// the kernels their decode steps take: a verify (decoding rows of a
// sequence with more than one row) runs the matvec kernels at any count; a
// mixed forward's groups are cut at the decode rows, each part run as a
// forward of its rows alone would. A pair's result then equals its decode
// step's bit for bit, whatever the verify's length or the prompt chunk
// beside it (as cuda_ops_row_groups.cpp does for the dense products).
Status CudaOps::local_experts(const ExpertFfnArgs& a, const cuda::ExpertGroups& groups, float* h, float* y) {
  const int64_t n = a.n_tokens, d = std::min(decode_rows_, n);
  const bool exact =
      cuda::expert_kernel_ignores_batch(a.gate->type) && cuda::expert_kernel_ignores_batch(a.down->type);
  if (exact || n <= cuda::kMatvecMaxTokens || d <= 0) return expert_products(a, groups, h, y);
  if (d == n) {
    cuda::ExpertGroups g = groups;
    g.decode_kernels = decode_verifies_;
    return expert_products(a, g, h, y);
  }
  if (split_rows_ != d) return expert_products(a, groups, h, y);  // MOESERVE_CUDA_ROW_GROUPS=0
  const int64_t K = groups.n_used;
  cuda::SplitGroupsArgs c;
  c.offsets = groups.expert_offsets, c.pairs = groups.pairs_by_expert, c.n_expert = groups.n_expert;
  c.bound = static_cast<int32_t>(d * K);
  c.lo_offsets = cut_offsets_[0], c.lo_pairs = cut_pairs_[0];
  c.hi_offsets = cut_offsets_[1], c.hi_pairs = cut_pairs_[1];
  MOESERVE_RETURN_IF_ERROR(cuda::split_expert_groups(c, stream_));
  ExpertFfnArgs decoding = a;
  decoding.n_tokens = d;
  const cuda::ExpertGroups lo{cut_pairs_[0], cut_offsets_[0], groups.n_expert, K, d, decode_verifies_};
  MOESERVE_RETURN_IF_ERROR(expert_products(decoding, lo, h, y));
  ExpertFfnArgs prompt = a;
  prompt.xn += d * a.n_embd;
  prompt.n_tokens = n - d;
  const cuda::ExpertGroups hi{cut_pairs_[1], cut_offsets_[1], groups.n_expert, K, n - d};
  return expert_products(prompt, hi, h + d * K * a.n_ff, y + d * K * a.n_embd);
}

// gate/up then down over the groups' experts of the (possibly compact) stacks.
Status CudaOps::expert_products(const ExpertFfnArgs& a, const cuda::ExpertGroups& groups, float* h,
                                float* y) {
  const int64_t pairs = a.n_tokens * n_used_;
  // One scratch for both products' converted activations (they run in turn).
  const size_t gu_scratch = cuda::gemm_scratch_bytes(a.gate->type, a.n_tokens, a.n_embd);
  const size_t dn_scratch = cuda::gemm_scratch_bytes(a.down->type, pairs, a.n_ff);
  void* scratch = nullptr;
  if (gu_scratch > 0 || dn_scratch > 0) {
    MOESERVE_ASSIGN_OR_RETURN(
        scratch, q8_mem_.get(std::max(gu_scratch, dn_scratch), "workspace (expert activations)"));
  }
  cuda::ExpertGateUpArgs gu;
  gu.gate = expert_weights(*a.gate);
  gu.up = expert_weights(*a.up);
  gu.groups = groups;
  gu.x = a.xn;
  gu.h = h;
  gu.scratch = scratch, gu.scratch_bytes = gu_scratch;
  MOESERVE_RETURN_IF_ERROR(cuda::expert_gate_up(gu, stream_));
  cuda::ExpertDownArgs dn;
  dn.down = expert_weights(*a.down);
  dn.groups = groups;
  dn.h = h;
  dn.y = y;
  dn.scratch = scratch, dn.scratch_bytes = dn_scratch;
  return cuda::expert_down(dn, stream_);
}

}  // namespace moeserve::backend::cuda_impl
