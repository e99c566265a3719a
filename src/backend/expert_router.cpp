#include "backend/expert_router.h"

namespace moeserve::backend {

ExpertRouter::ExpertRouter(ExpertBackend* remote, ExpertBackend* local,
                           const std::vector<std::vector<int32_t>>& owned, int64_t n_expert)
    : remote_(remote), local_(local), n_expert_(n_expert), owned_(owned.size()) {
  for (size_t l = 0; l < owned.size(); ++l) {
    owned_[l].assign(size_t(n_expert), 0);
    for (int32_t e : owned[l]) {
      if (e >= 0 && e < n_expert) owned_[l][size_t(e)] = 1;
    }
  }
}

bool ExpertRouter::owns(int layer, int32_t expert) const {
  return remote_ != nullptr && layer >= 0 && size_t(layer) < owned_.size() && expert >= 0 &&
         expert < n_expert_ && owned_[size_t(layer)][size_t(expert)] != 0;
}

Status ExpertRouter::compute(const ExpertBatch& batch) {
  const Status started = start(batch);
  const Status done = finish();
  return started.is_ok() ? done : started;
}

Status ExpertRouter::start(const ExpertBatch& batch) {
  remote_jobs_.clear();
  local_jobs_.clear();
  for (const ExpertJob& j : batch.jobs)
    (owns(batch.layer, j.expert) ? remote_jobs_ : local_jobs_).push_back(j);
  remote_batch_ = batch;
  remote_batch_.jobs = remote_jobs_;
  remote_started_ = Status::ok();
  remote_pending_ = !remote_jobs_.empty();
  if (remote_pending_) remote_started_ = remote_->start(remote_batch_);
  // The CPU's share while the remote computes its own.
  ExpertBatch local = batch;
  local.jobs = local_jobs_;
  local_done_ = local_jobs_.empty() ? Status::ok() : local_->compute(local);
  return Status::ok();
}

Status ExpertRouter::finish() {
  Status first = std::move(local_done_);
  local_done_ = Status::ok();
  if (!remote_pending_) return first;
  remote_pending_ = false;
  // Every start() is followed by its finish(), whatever start() said.
  const Status done = remote_->finish();
  Status remote = remote_started_.is_ok() ? done : remote_started_;
  remote_started_ = Status::ok();
  if (remote.code() == StatusCode::kUnavailable) {
    fallbacks_ += 1;
    remote = local_->compute(remote_batch_);
  }
  return first.is_ok() ? remote : first;
}

}  // namespace moeserve::backend
