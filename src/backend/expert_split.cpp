#include "backend/expert_split.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace moeserve::backend {

ExpertSplit::ExpertSplit(int64_t n_expert, std::vector<int32_t> local, ExpertBackend* host)
    : n_expert_(n_expert), local_(std::move(local)), host_(host) {
  std::sort(local_.begin(), local_.end());
  local_.erase(std::unique(local_.begin(), local_.end()), local_.end());
  std::erase_if(local_, [&](int32_t e) { return e < 0 || e >= n_expert_; });
  local_index_.assign(size_t(n_expert_), -1);
  selections_ = std::make_unique<std::atomic<int64_t>[]>(size_t(std::max<int64_t>(n_expert_, 1)));
  decode_selections_ = std::make_unique<std::atomic<int64_t>[]>(size_t(std::max<int64_t>(n_expert_, 1)));
  window_base_.assign(size_t(n_expert_), 0);
  mask_.assign(size_t(n_expert_ + 63) / 64, 0);
  for (size_t i = 0; i < local_.size(); ++i) {
    local_index_[size_t(local_[i])] = int32_t(i);
    mask_[size_t(local_[i]) >> 6] |= uint64_t(1) << (local_[i] & 63);
  }
}

void ExpertSplit::start_window() {
  for (int64_t e = 0; e < n_expert_; ++e) window_base_[size_t(e)] = selections(int32_t(e));
}

void ExpertSplit::replace_local(size_t slot, int32_t expert) {
  const int32_t old = local_[slot];
  local_index_[size_t(old)] = -1;
  mask_[size_t(old) >> 6] &= ~(uint64_t(1) << (old & 63));
  local_[slot] = expert;
  local_index_[size_t(expert)] = int32_t(slot);
  mask_[size_t(expert) >> 6] |= uint64_t(1) << (expert & 63);
}

void ExpertSplit::set_host_view(WeightUse use, const WeightView& view) {
  if (use == WeightUse::kExpertGate) host_gate_ = view;
  if (use == WeightUse::kExpertUp) host_up_ = view;
  if (use == WeightUse::kExpertDown) host_down_ = view;
}

double ExpertSplit::host_expert_bytes() const {
  const WeightView *g = host_view(WeightUse::kExpertGate), *u = host_view(WeightUse::kExpertUp),
                   *d = host_view(WeightUse::kExpertDown);
  if (g == nullptr || u == nullptr || d == nullptr) return 0.0;
  return double(g->matrix_stride + u->matrix_stride + d->matrix_stride);
}

const WeightView* ExpertSplit::host_view(WeightUse use) const {
  const WeightView* v = use == WeightUse::kExpertGate   ? &host_gate_
                        : use == WeightUse::kExpertUp   ? &host_up_
                        : use == WeightUse::kExpertDown ? &host_down_
                                                        : nullptr;
  return v != nullptr && v->present() ? v : nullptr;
}

void ExpertSplit::set_router(const float* router, int64_t n_embd, const float* bias) {
  router_ = n_embd > 0 ? router : nullptr;
  router_n_embd_ = n_embd;
  router_bias_ = bias;
}

bool ExpertSplit::warm_on_host(const WarmArgs& a) const {
  if (router_ == nullptr || host_ == nullptr || a.max_experts <= 0 || a.n_embd != router_n_embd_ ||
      all_local()) {
    return false;
  }
  // A guess must never hold up real work: another caller's experts go first.
  std::unique_lock<std::mutex> lock(host_lock(), std::try_to_lock);
  if (!lock.owns_lock()) return false;
  ExpertWarmup w;
  w.router = router_, w.bias = router_bias_, w.x = a.x, w.n_embd = a.n_embd, w.n_expert = n_expert_;
  w.local_bits = mask_.data(), w.max_experts = a.max_experts;
  w.gate = host_view(WeightUse::kExpertGate), w.up = host_view(WeightUse::kExpertUp);
  w.down = host_view(WeightUse::kExpertDown);
  if (w.gate == nullptr || w.up == nullptr || w.down == nullptr) return false;
  w.stop = a.stop, w.chosen = a.chosen;
  host_->warm(w);
  return true;
}

std::mutex& ExpertSplit::host_lock() {
  static std::mutex m;
  return m;
}

HostCall& HostCall::operator=(HostCall&& o) noexcept {
  if (this != &o) {
    (void)finish();
    lock_ = std::move(o.lock_);
    backend_ = o.backend_;
    started_ = std::move(o.started_);
    pending_ = o.pending_;
    o.pending_ = false;
  }
  return *this;
}

Status HostCall::finish() {
  Status started = std::move(started_);
  started_ = Status::ok();
  if (!pending_) return started;
  pending_ = false;
  Status done = backend_->finish();
  if (lock_.owns_lock()) lock_.unlock();
  return started.is_ok() ? done : started;
}

Status ExpertSplit::compute_on_host(int layer, int64_t n_embd, int64_t n_ff,
                                    std::span<const ExpertJob> jobs) const {
  if (jobs.empty()) return Status::ok();
  HostCall call = start_on_host(layer, n_embd, n_ff, jobs);
  return call.finish();
}

HostCall ExpertSplit::start_on_host(int layer, int64_t n_embd, int64_t n_ff,
                                    std::span<const ExpertJob> jobs) const {
  HostCall call;
  if (jobs.empty()) return call;
  const WeightView *g = host_view(WeightUse::kExpertGate), *u = host_view(WeightUse::kExpertUp),
                   *d = host_view(WeightUse::kExpertDown);
  if (host_ == nullptr || g == nullptr || u == nullptr || d == nullptr) {
    // Nothing started: finish() reports the error.
    call.started_ =
        make_error(StatusCode::kInternal,
                   "layer {}: experts placed off the device, but no host copy to compute them", layer);
    return call;
  }
  ExpertBatch batch;
  batch.layer = layer;
  batch.n_embd = n_embd;
  batch.n_ff = n_ff;
  batch.gate = g, batch.up = u, batch.down = d;
  batch.jobs = jobs;
  call.lock_ = std::unique_lock<std::mutex>(host_lock());
  call.backend_ = host_;
  call.pending_ = true;
  call.started_ = host_->start(batch);
  return call;
}

Result<double> ExpertSplit::probe_host_flops(int layer, int64_t n_tokens) const {
  const WeightView *g = host_view(WeightUse::kExpertGate), *d = host_view(WeightUse::kExpertDown);
  if (g == nullptr || d == nullptr || host_view(WeightUse::kExpertUp) == nullptr || host_ == nullptr) {
    return make_error(StatusCode::kNotFound, "layer {}: no host experts to time", layer);
  }
  const int64_t n_embd = g->n_cols, n_ff = g->n_rows, n_jobs = std::min<int64_t>(2, n_expert_);
  if (n_embd <= 0 || n_ff <= 0 || n_tokens <= 0 || n_jobs <= 0) {
    return make_error(StatusCode::kInvalidArgument, "layer {}: nothing to time", layer);
  }
  std::vector<float> x(size_t(n_tokens * n_embd)), y(size_t(n_jobs * n_tokens * n_embd));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * std::sin(0.37f * float(i));
  std::vector<ExpertJob> jobs;
  for (int64_t j = 0; j < n_jobs; ++j)
    jobs.push_back({int32_t(j), x.data(), n_tokens, y.data() + j * n_tokens * n_embd});
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    MOESERVE_RETURN_IF_ERROR(compute_on_host(layer, n_embd, n_ff, jobs));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0 && s > 0.0)
      best = std::max(best, 6.0 * double(n_embd * n_ff) * double(n_jobs * n_tokens) / s);
  }
  return best;
}

}  // namespace moeserve::backend
