// moeserve calibrate -m FILE --prompts FILE [-n TOKENS] -o stats.json: counts
// which experts each layer selects on representative prompts (prefill and
// decode apart), for `moeserve place --stats`.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>

#include "core/progress.h"
#include "moe/calibrate.h"
#include "moe/json_file.h"
#include "runtime/model.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {
namespace {

struct CalibrateCliOptions {
  std::string model, prompts, output, device = "auto";
  int64_t n_predict = 32, ctx_size = 4096, batch = 512;
  int threads = 0;
  bool progress = false, no_progress = false;
};

// The share of a layer's selections that its busiest eighth of experts took.
double top_eighth_share(const moe::ExpertStats& s, int64_t l) {
  std::vector<int64_t> c(size_t(s.n_expert));
  for (int64_t e = 0; e < s.n_expert; ++e) c[size_t(e)] = s.selections(l, e);
  std::sort(c.rbegin(), c.rend());
  const int64_t total = std::accumulate(c.begin(), c.end(), int64_t(0));
  const size_t k = std::max<size_t>(1, c.size() / 8);
  return total > 0
             ? double(std::accumulate(c.begin(), c.begin() + std::ptrdiff_t(k), int64_t(0))) / double(total)
             : 0.0;
}

Status run(const CalibrateCliOptions& cli) {
  MOESERVE_ASSIGN_OR_RETURN(
      std::unique_ptr<runtime::Model> model,
      runtime::Model::load(cli.model, {.n_threads = cli.threads, .device = cli.device}));
  MOESERVE_ASSIGN_OR_RETURN(moe::MoeShape shape, moe::moe_shape(model->file()));
  MOESERVE_ASSIGN_OR_RETURN(std::string text, moe::read_text_file(cli.prompts));
  MOESERVE_ASSIGN_OR_RETURN(auto prompts, moe::calibration_prompts(*model, text, cli.prompts));
  Progress bar({.label = "calibrate",
                .total_units = prompts.size(),
                .total_items = prompts.size(),
                .item_name = "prompts",
                .units_are_bytes = false,
                .mode = progress_mode(cli.progress, cli.no_progress)});
  moe::CalibrateOptions o;
  o.n_predict = cli.n_predict, o.ctx_size = cli.ctx_size, o.n_batch = cli.batch;
  o.on_prompt = [&](size_t, size_t) { bar.add_units(1), bar.add_items(1); };
  MOESERVE_ASSIGN_OR_RETURN(moe::ExpertStats stats, moe::calibrate(*model, shape, prompts, o));
  bar.finish();
  MOESERVE_RETURN_IF_ERROR(moe::write_text_file(cli.output, moe::to_json(stats)));
  double lo = 1.0, hi = 0.0;
  for (int64_t l = 0; l < stats.n_layer; ++l) {
    if (shape.expert_bytes[size_t(l)] == 0) continue;
    lo = std::min(lo, top_eighth_share(stats, l)), hi = std::max(hi, top_eighth_share(stats, l));
  }
  fmt::print("{} prompts on {}: {} prefill and {} decode tokens counted over {} layers x {} experts\n",
             prompts.size(), model->device().name(), stats.prefill_tokens, stats.decode_tokens, stats.n_layer,
             stats.n_expert);
  fmt::print(
      "the busiest eighth of a layer's experts took {:.0f}-{:.0f}% of its selections (uniform routing: "
      "12.5%)\n",
      100.0 * lo, 100.0 * hi);
  fmt::print("wrote {}\n", cli.output);
  return Status::ok();
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto cli = std::make_shared<CalibrateCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "Count which experts each MoE layer selects on representative prompts and write the routing\n"
      "statistics (JSON) that `moeserve place --stats` chooses the GPU's hot experts from. Each prompt is\n"
      "prefilled, then decoded greedily for up to -n tokens; prefill and decode tokens are counted apart.");
  cmd->add_option("-m,--model", cli->model, "GGUF model file (with stacked experts)")->required();
  cmd->add_option(
         "--prompts", cli->prompts,
         "Prompts, one a line: text, or a JSON line {\"messages\": [...]} (or an array of messages)\n"
         "rendered with the model's chat template")
      ->required();
  cmd->add_option("-n,--n-predict", cli->n_predict, "Greedy tokens decoded after each prompt")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  cmd->add_option("-c,--ctx-size", cli->ctx_size, "Context size (the longest prompt plus -n must fit)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_option("-b,--batch", cli->batch, "Prompt tokens per prefill chunk")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  cmd->add_option("-t,--threads", cli->threads, "Worker threads (0: one per physical core)")
      ->capture_default_str();
  cmd->add_option(
         "--device", cli->device,
         "Device: auto (the first CUDA GPU when this binary has CUDA and one is visible, else the CPU), "
         "cpu, cuda or cuda:N")
      ->capture_default_str();
  cmd->add_option("-o,--output", cli->output, "Statistics file to write (JSON)")->required();
  cmd->add_flag("--progress", cli->progress, "Show the progress bar even when stderr is not a terminal");
  cmd->add_flag("--no-progress", cli->no_progress, "Never show the progress bar");
  cmd->callback([cli] { report_status(run(*cli)); });
}

}  // namespace moeserve::tools
