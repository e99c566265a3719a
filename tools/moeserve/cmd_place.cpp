// moeserve place -m FILE [--stats stats.json] --gpu-mem SIZE -o placement.json:
// chooses each layer's hot experts (kept on the GPU) for a GPU memory budget,
// from routing statistics or, without them, evenly over the layers.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>

#include "format/gguf.h"
#include "moe/json_file.h"
#include "moe/plan.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {
namespace {

struct PlaceCliOptions {
  std::string model, stats, gpu_mem, reserve = "1GiB", output;
  int64_t ctx_size = 4096, parallel = 1;
};

double gib(uint64_t b) { return double(b) / double(uint64_t(1) << 30); }

Status run(const PlaceCliOptions& cli) {
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(cli.model));
  MOESERVE_ASSIGN_OR_RETURN(moe::MoeShape shape, moe::moe_shape(file));
  moe::BudgetOptions b;
  MOESERVE_ASSIGN_OR_RETURN(b.gpu_bytes, moe::parse_size(cli.gpu_mem, "--gpu-mem"));
  MOESERVE_ASSIGN_OR_RETURN(b.reserve_bytes, moe::parse_size(cli.reserve, "--reserve"));
  b.ctx_size = cli.ctx_size, b.parallel = cli.parallel;
  MOESERVE_ASSIGN_OR_RETURN(moe::ExpertBudget budget, moe::expert_budget(shape, b));
  std::unique_ptr<moe::ExpertStats> stats;
  if (!cli.stats.empty()) {
    MOESERVE_ASSIGN_OR_RETURN(moe::ExpertStats s, moe::read_expert_stats(cli.stats, &shape));
    stats = std::make_unique<moe::ExpertStats>(std::move(s));
  }
  const moe::PlacementPlan plan = moe::plan_placement(shape, stats.get(), budget.experts);
  MOESERVE_RETURN_IF_ERROR(moe::write_text_file(cli.output, moe::to_json(plan.placement, shape)));
  int64_t lo = shape.n_expert, hi = 0;
  for (const auto& h : plan.placement.hot)
    lo = std::min<int64_t>(lo, int64_t(h.size())), hi = std::max<int64_t>(hi, int64_t(h.size()));
  fmt::print("{}: {} layers x {} experts ({} used a token), {:.2f} GiB of experts, {:.2f} GiB dense\n",
             cli.model, shape.n_layer, shape.n_expert, shape.n_expert_used, gib(shape.all_expert_bytes()),
             gib(shape.dense_bytes));
  fmt::print(
      "GPU budget {:.2f} GiB = dense {:.2f} + KV {:.2f} (--ctx-size {} x --parallel {}) + reserve {:.2f} + "
      "experts {:.2f}\n",
      gib(b.gpu_bytes), gib(budget.dense), gib(budget.kv), b.ctx_size, b.parallel, gib(budget.reserve),
      gib(budget.experts));
  fmt::print(
      "hot: {} of {} experts ({:.2f} GiB, {}-{} a layer{}), {} {:.1f}%\n", plan.placement.n_hot(),
      shape.n_expert * shape.n_layer, gib(plan.hot_bytes), lo, hi,
      plan.layer_floor ? ", every layer can run all-hot" : "",
      stats ? "expected hot-hit ratio (from the statistics)" : "hot share (no statistics: spread evenly)",
      100.0 * plan.expected_hit_ratio);
  if (const std::string hint = moe::layerwise_hint(shape, stats.get(), plan, budget.experts); !hint.empty())
    fmt::print("note: {}\n", hint);
  fmt::print("wrote {}\n", cli.output);
  return Status::ok();
}

}  // namespace

void register_place(CLI::App& app) {
  auto cli = std::make_shared<PlaceCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "place",
      "Choose which experts of a MoE model live on the GPU (hot) for a GPU memory budget and write them\n"
      "as a placement file. The budget left after the dense weights, the KV cache and a reserve goes to\n"
      "the experts with the most selections per byte in the routing statistics (moeserve calibrate),\n"
      "each layer first getting its n_expert_used most selected when every layer can; without\n"
      "statistics the hot experts are spread evenly over the layers.");
  cmd->add_option("-m,--model", cli->model, "GGUF model file")->required();
  cmd->add_option("--stats", cli->stats, "Routing statistics of this model (JSON from moeserve calibrate)");
  cmd->add_option("--gpu-mem", cli->gpu_mem, "GPU memory the model may use, e.g. 24GiB, 40G, 16000MiB")
      ->required();
  cmd->add_option("-c,--ctx-size", cli->ctx_size, "Context per sequence the KV cache is sized for")
      ->capture_default_str();
  cmd->add_option("--parallel", cli->parallel, "Sequences decoded together (KV caches)")
      ->capture_default_str();
  cmd->add_option("--reserve", cli->reserve, "GPU memory kept for activations, scratch and the CUDA context")
      ->capture_default_str();
  cmd->add_option("-o,--output", cli->output, "Placement file to write (JSON)")->required();
  cmd->callback([cli] { report_status(run(*cli)); });
}

}  // namespace moeserve::tools
