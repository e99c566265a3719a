// moeserve perplexity -m FILE -f TEXT [-c N] [-b N] [--chunks N]: the
// model's perplexity over a text file, windowed as llama.cpp's perplexity
// tool does (runtime/perplexity.h), so a quantization's quality compares
// across files and with llama.cpp's numbers.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "runtime/model.h"
#include "runtime/perplexity.h"
#include "tools/moeserve/commands.h"
#include "tools/moeserve/expert_flags.h"
#include "tools/moeserve/split_flags.h"

namespace moeserve::tools {
namespace {

struct PerplexityCliOptions {
  std::string model_path, text_path;
  int64_t ctx_size = 512, batch = 512, chunks = -1;
  int threads = 0;
  std::string device = "auto";
  moe::ExpertPolicyOptions experts;
  LayerSplitFlags layer_split;
};

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "-f {}: cannot open the file", path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Status run_perplexity(const PerplexityCliOptions& o) {
  MOESERVE_ASSIGN_OR_RETURN(const std::string text, read_text(o.text_path));
  runtime::ModelLoadOptions load{.n_threads = o.threads, .device = o.device};
  moe::ExpertPolicyOptions experts = o.experts;
  experts.ctx_size = o.ctx_size;
  MOESERVE_RETURN_IF_ERROR(apply_expert_flags(o.model_path, experts, &load));
  LayerSplitProcesses shard_processes;  // outlives the model
  MOESERVE_RETURN_IF_ERROR(apply_layer_split(o.model_path, o.layer_split, o.device, &load, &shard_processes));
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Model> model, runtime::Model::load(o.model_path, load));
  const std::vector<int32_t> tokens = model->tokenizer().encode(text);
  const int64_t n_chunks = int64_t(tokens.size()) / o.ctx_size;
  fmt::print(stderr, "perplexity: {} tokens, {} chunks of {} (scoring the second half of each), batch {}\n",
             tokens.size(), o.chunks > 0 ? std::min(o.chunks, n_chunks) : n_chunks, o.ctx_size, o.batch);
  const auto t0 = std::chrono::steady_clock::now();
  MOESERVE_ASSIGN_OR_RETURN(
      runtime::PerplexityResult r,
      runtime::perplexity(*model, tokens, {.n_ctx = o.ctx_size, .n_batch = o.batch, .max_chunks = o.chunks},
                          [](int64_t chunk, int64_t, double ppl) {
                            // llama.cpp's running line: "[1]5.1234,[2]5.0101,..."
                            fmt::print("[{}]{:.4f},", chunk + 1, ppl);
                            std::fflush(stdout);
                          }));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("\nFinal estimate: PPL = {:.4f} +/- {:.5f}\n", r.ppl, r.ppl_error);
  std::fflush(stdout);  // the summary on stderr after it
  fmt::print(stderr, "perplexity: {} tokens scored in {:.1f} s ({:.1f} tok/s evaluated)\n", r.tokens_scored, seconds,
             double(r.chunks * o.ctx_size) / seconds);
  return Status::ok();
}

}  // namespace

void register_perplexity(CLI::App& app) {
  auto o = std::make_shared<PerplexityCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "perplexity",
      "Perplexity of a model over a text file, windowed as llama.cpp's perplexity tool (chunks of --ctx-size "
      "tokens, the second half of each scored), so numbers compare across quantizations and with llama.cpp");
  cmd->add_option("-m,--model", o->model_path, "GGUF model file")->required();
  cmd->add_option("-f,--file", o->text_path, "Text file to score (e.g. wiki.test.raw)")->required();
  cmd->add_option("-c,--ctx-size", o->ctx_size, "Tokens per chunk")->capture_default_str()
      ->check(CLI::Range(int64_t(4), int64_t(1) << 20));
  cmd->add_option("-b,--batch", o->batch, "Rows per forward")->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  cmd->add_option("--chunks", o->chunks, "Score at most this many chunks (-1: all)")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0: one per physical core)")->capture_default_str();
  cmd->add_option("--device", o->device, "Device: auto, cpu, cuda or cuda:N")->capture_default_str();
  add_expert_flags(cmd, &o->experts);
  add_layer_split_flag(cmd, &o->layer_split);
  cmd->callback([o] { report_status(run_perplexity(*o)); });
}

}  // namespace moeserve::tools
