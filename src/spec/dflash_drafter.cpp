#include "spec/dflash_drafter.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "backend/cpu/cpu_device.h"
#include "backend/devices.h"
#include "core/log.h"
#include "models/forward_common.h"
#include "spec/ddtree.h"

namespace moeserve::spec {
namespace {
// Observed rows wait for the next draft, or go into the context once this
// many wait (a sequence whose drafting the policy has turned off keeps no backlog).
constexpr int64_t kMaxWaitingRows = 256;
// Candidates per draft position for a tree (DDTree's K).
constexpr int kTreeTopK = 8;
}  // namespace

namespace {
// The device named `name` for a draft beside `target`: the target's own
// when it uses it (one set of streams and memory accounting), else opened here.
Result<backend::Device*> draft_device(std::string_view name, const models::LanguageModel& target,
                                      std::unique_ptr<backend::Device>& owned) {
  if (name.empty()) return static_cast<backend::Device*>(nullptr);
  MOESERVE_ASSIGN_OR_RETURN(backend::DeviceSpec spec, backend::parse_device_spec(name));
  const std::string wanted = spec.to_string();
  for (backend::Device* d : models::placement_devices(target.placement(), target.info().n_layer)) {
    if (d != nullptr && d->name() == wanted) return d;
  }
  if (spec.kind == backend::DeviceKind::kCpu) return static_cast<backend::Device*>(&backend::host_device());
  MOESERVE_ASSIGN_OR_RETURN(owned, backend::open_cuda_device(spec.index));
  return owned.get();
}
}  // namespace

Result<std::shared_ptr<DflashModel>> DflashModel::load(const std::string& path, const models::LanguageModel& target,
                                                       std::string_view device) {
  auto m = std::make_shared<DflashModel>();
  MOESERVE_ASSIGN_OR_RETURN(backend::Device * d, draft_device(device, target, m->own_device_));
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  m->file_.emplace(std::move(file));
  MOESERVE_ASSIGN_OR_RETURN(m->draft_, models::load_dflash_draft(*m->file_, target, d));
  MOESERVE_ASSIGN_OR_RETURN(m->ws_, m->draft_->create_workspace());
  return m;
}

std::unique_ptr<runtime::Drafter> DflashModel::make_drafter() {
  return std::make_unique<DflashDrafter>(shared_from_this());
}

std::string DflashModel::description() const {
  const models::DflashHParams& h = draft_->hparams();
  std::string layers;
  for (int32_t l : h.target_layers) {
    if (!layers.empty()) layers += ',';
    layers += std::to_string(l);
  }
  return fmt::format("DFlash draft {}: {} layers, hidden {}, block {}, reads target layers {}, {:.1f} MiB, on {}",
                     file_->name(), h.n_layer, h.n_embd, h.block_size, layers,
                     double(draft_->n_bytes()) / (1024.0 * 1024.0), draft_->device()->name());
}

DflashDrafter::DflashDrafter(std::shared_ptr<DflashModel> model) : model_(std::move(model)) {
  const char* p = std::getenv("MOESERVE_DFLASH_PROFILE");
  if (p != nullptr && std::string(p) == "1") profile_ = std::make_unique<models::ForwardProfile>();
}

DflashDrafter::~DflashDrafter() {
  if (profile_ == nullptr || profiled_steps_ == 0) return;
  const double n = double(profiled_steps_), ms = 1e-6;
  const models::ForwardProfile& p = *profile_;
  MOESERVE_LOG_INFO(
      "DFlash draft, per step ({} steps, waiting after each part): context rows {:.3f} ms, block embedding "
      "{:.3f} ms, q/k/v {:.3f} ms, attention {:.3f} ms, output projection + FFN {:.3f} ms, output head "
      "{:.3f} "
      "ms, top-k and tree {:.3f} ms",
      profiled_steps_, double(p.other) * ms / n, double(p.embed) * ms / n, double(p.attn_proj) * ms / n,
      double(p.attention) * ms / n, double(p.dense_ffn) * ms / n, double(p.lm_head) * ms / n,
      host_seconds_ * 1e3 / n);
}

void DflashDrafter::reset() {
  ctx_.clear();
  waiting_.clear();
  n_waiting_ = 0;
  status_ = Status::ok();
}

void DflashDrafter::fail(const Status& st) {
  if (!status_.is_ok()) return;
  status_ = st;
  MOESERVE_LOG_WARN("DFlash drafting stops for this request: {}", st.message());
}

void DflashDrafter::observe_features(int64_t pos0, std::span<const float> rows, int64_t n) {
  (void)pos0;  // rows arrive in position order; RoPE sees only distances
  if (!status_.is_ok() || n <= 0) return;
  waiting_.insert(waiting_.end(), rows.begin(), rows.end());
  n_waiting_ += n;
  if (n_waiting_ >= kMaxWaitingRows) {
    std::lock_guard lock(model_->mu_);
    if (Status st = flush_features(); !st.is_ok()) fail(st);
  }
}

Status DflashDrafter::flush_features() {
  if (n_waiting_ == 0) return Status::ok();
  const Status st = model_->draft_->extend(ctx_, waiting_, n_waiting_, *model_->ws_, profile_.get());
  waiting_.clear();
  n_waiting_ = 0;
  return st;
}

void DflashDrafter::draft(std::span<const int32_t> context, const runtime::DraftBudget& budget,
                          runtime::DraftTree& out) {
  out.clear();
  if (!status_.is_ok() || context.empty()) return;
  const models::DflashHParams& h = model_->hparams();
  const int64_t depth = std::min<int64_t>(budget.max_depth, h.block_size - 1);
  if (depth < 1 || budget.max_nodes < 1) return;
  std::lock_guard lock(model_->mu_);
  if (Status st = flush_features(); !st.is_ok()) return fail(st);
  if (ctx_.length() == 0) return;  // no features yet (nothing to draft from)
  const int32_t root = context.back();
  ++profiled_steps_;
  const int64_t n_vocab = model_->draft_->n_vocab();
  if (budget.max_nodes <= budget.max_depth) {
    // A chain: each row's arg-max, computed on the device.
    greedy_.assign(size_t(depth), 0);
    const models::DraftOutputs o{.n_out = depth, .greedy = greedy_.data()};
    if (Status st = model_->draft_->propose(ctx_, root, o, *model_->ws_, profile_.get()); !st.is_ok())
      return fail(st);
    for (int64_t i = 0; i < depth; ++i) out.add(greedy_[size_t(i)], int32_t(i) - 1);
    return;
  }
  // A tree: each row's top candidates, computed on the device.
  const int k = int(std::min<int64_t>({budget.max_nodes, int64_t(kTreeTopK), n_vocab}));
  top_ids_.resize(size_t(depth * k));
  top_log_probs_.resize(size_t(depth * k));
  const models::DraftOutputs o{
      .n_out = depth, .top_k = k, .top_ids = top_ids_.data(), .top_log_probs = top_log_probs_.data()};
  if (Status st = model_->draft_->propose(ctx_, root, o, *model_->ws_, profile_.get()); !st.is_ok())
    return fail(st);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<DepthCandidates> depths(static_cast<size_t>(depth));
  for (int64_t d = 0; d < depth; ++d) {
    depths[size_t(d)].tokens.assign(top_ids_.begin() + d * k, top_ids_.begin() + (d + 1) * k);
    depths[size_t(d)].log_probs.assign(top_log_probs_.begin() + d * k, top_log_probs_.begin() + (d + 1) * k);
  }
  build_draft_tree(depths, budget, /*chain_seed=*/true, out);
  host_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace moeserve::spec
