#include "moe/expert_policy.h"

#include <fmt/format.h>

#include <memory>
#include <numeric>

#include "moe/expert_stats.h"
#include "moe/placement.h"
#include "moe/plan.h"

namespace moeserve::moe {
namespace {

double gib(uint64_t b) { return double(b) / double(uint64_t(1) << 30); }

std::vector<int32_t> all_experts(int64_t n_expert) {
  std::vector<int32_t> v(static_cast<size_t>(n_expert));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The placement's hot lists as the policy, with its share and size.
ExpertPolicy from_placement(const MoeShape& shape, ExpertPlacement p, std::string how) {
  ExpertPolicy out;
  p.hot.resize(size_t(shape.n_layer));
  out.gpu_expert_bytes = p.hot_bytes(shape);
  const int64_t total = shape.n_layer * shape.n_expert;
  out.split = p.n_hot() < total;
  out.summary = fmt::format("experts: {} of {} on the GPU ({:.2f} GiB), the rest on the CPU threads ({})",
                            p.n_hot(), total, gib(out.gpu_expert_bytes), how);
  if (!out.split) out.summary = fmt::format("experts: all {} on the GPU ({})", total, how);
  out.gpu_experts = std::move(p.hot);
  return out;
}

Status check_fits(const MoeShape& shape, const ExpertPolicy& policy, const ExpertPolicyOptions& o,
                  const std::string& what) {
  if (o.gpu_free_bytes == 0) return Status::ok();
  const uint64_t kv = shape.kv_bytes_per_position * uint64_t(std::max<int64_t>(o.ctx_size, 1)) *
                      uint64_t(std::max<int64_t>(o.parallel, 1));
  const uint64_t reserve = BudgetOptions{}.reserve_bytes;
  const uint64_t need = shape.dense_bytes + kv + reserve + policy.gpu_expert_bytes;
  if (need <= o.gpu_free_bytes) return Status::ok();
  return make_error(
      StatusCode::kResourceExhausted,
      "{} does not fit the GPU: dense weights {:.2f} GiB + KV cache {:.2f} GiB (--ctx-size {} x "
      "--parallel {}) + {:.2f} GiB for activations and the CUDA context + hot experts {:.2f} GiB = {:.2f} "
      "GiB, {:.2f} GiB free; place fewer experts (moeserve place --gpu-mem), or use --gpu-mem SIZE",
      what, gib(shape.dense_bytes), gib(kv), o.ctx_size, o.parallel, gib(reserve),
      gib(policy.gpu_expert_bytes), gib(need), gib(o.gpu_free_bytes));
}

// --gpu-mem beside another placement flag: that placement must fit it.
Status check_budget(const MoeShape& shape, const ExpertPolicy& policy, const ExpertPolicyOptions& o,
                    const std::string& what) {
  BudgetOptions b;
  MOESERVE_ASSIGN_OR_RETURN(b.gpu_bytes, parse_size(o.gpu_mem, "--gpu-mem"));
  b.ctx_size = o.ctx_size, b.parallel = o.parallel;
  MOESERVE_ASSIGN_OR_RETURN(ExpertBudget budget, expert_budget(shape, b));
  if (policy.gpu_expert_bytes <= budget.experts) return Status::ok();
  return make_error(
      StatusCode::kResourceExhausted,
      "{}: its hot experts take {:.2f} GiB, but --gpu-mem {} leaves {:.2f} GiB for experts (after "
      "dense weights {:.2f} GiB, KV cache {:.2f} GiB, reserve {:.2f} GiB); make a placement for it "
      "(moeserve place --gpu-mem {}) or raise --gpu-mem",
      what, gib(policy.gpu_expert_bytes), o.gpu_mem, gib(budget.experts), gib(budget.dense), gib(budget.kv),
      gib(budget.reserve), o.gpu_mem);
}

}  // namespace

bool policy_requested(const ExpertPolicyOptions& o) {
  return !o.placement_path.empty() || o.n_cpu_moe >= 0 || o.cpu_moe || !o.gpu_mem.empty();
}

Result<ExpertPolicy> resolve_expert_policy(const GgufFile& file, const ExpertPolicyOptions& o) {
  const int given = int(!o.placement_path.empty()) + int(o.n_cpu_moe >= 0) + int(o.cpu_moe);
  if (given > 1) {
    return make_error(
        StatusCode::kInvalidArgument,
        "--placement, --n-cpu-moe and --cpu-moe each choose where the experts go: give one (with "
        "--gpu-mem SIZE, it must fit SIZE)");
  }
  if (!o.stats_path.empty() && (o.gpu_mem.empty() || given > 0)) {
    return make_error(
        StatusCode::kInvalidArgument,
        "--expert-stats is used with --gpu-mem SIZE alone, to plan a placement (or make one with "
        "moeserve place)");
  }
  // --gpu-mem alone plans; beside another flag it is the budget that one must fit.
  const bool plan_for_gpu_mem = !o.gpu_mem.empty() && given == 0;
  MOESERVE_ASSIGN_OR_RETURN(MoeShape shape, moe_shape(file));
  ExpertPlacement p;
  p.hot.resize(size_t(shape.n_layer));
  std::string how;
  if (!o.placement_path.empty()) {
    MOESERVE_ASSIGN_OR_RETURN(p, read_placement(o.placement_path, shape));
    how = o.placement_path;
  } else if (o.cpu_moe) {
    how = "--cpu-moe";
  } else if (o.n_cpu_moe >= 0) {
    if (o.n_cpu_moe > shape.n_layer) {
      return make_error(StatusCode::kInvalidArgument, "--n-cpu-moe {}: the model has {} layers (0..{})",
                        o.n_cpu_moe, shape.n_layer, shape.n_layer);
    }
    for (int64_t l = o.n_cpu_moe; l < shape.n_layer; ++l) p.hot[size_t(l)] = all_experts(shape.n_expert);
    how = fmt::format("--n-cpu-moe {}", o.n_cpu_moe);
  } else if (plan_for_gpu_mem) {
    BudgetOptions b;
    MOESERVE_ASSIGN_OR_RETURN(b.gpu_bytes, parse_size(o.gpu_mem, "--gpu-mem"));
    b.ctx_size = o.ctx_size, b.parallel = o.parallel;
    MOESERVE_ASSIGN_OR_RETURN(ExpertBudget budget, expert_budget(shape, b));
    std::unique_ptr<ExpertStats> stats;
    if (!o.stats_path.empty()) {
      MOESERVE_ASSIGN_OR_RETURN(ExpertStats s, read_expert_stats(o.stats_path, &shape));
      stats = std::make_unique<ExpertStats>(std::move(s));
    }
    PlacementPlan plan = plan_placement(shape, stats.get(), budget.experts);
    how =
        fmt::format("--gpu-mem {}, {} {:.1f}%", o.gpu_mem,
                    stats ? "expected hot-hit" : "spread evenly, hot share", 100.0 * plan.expected_hit_ratio);
    if (const std::string hint = layerwise_hint(shape, stats.get(), plan, budget.experts); !hint.empty())
      how += "; note: " + hint;
    p = std::move(plan.placement);
  } else {
    return make_error(StatusCode::kInvalidArgument, "no expert placement flag was given");
  }
  ExpertPolicy policy = from_placement(shape, std::move(p), how);
  if (!o.gpu_mem.empty() && !plan_for_gpu_mem) MOESERVE_RETURN_IF_ERROR(check_budget(shape, policy, o, how));
  MOESERVE_RETURN_IF_ERROR(check_fits(shape, policy, o, how));
  return policy;
}

}  // namespace moeserve::moe
