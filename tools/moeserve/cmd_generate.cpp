// moeserve generate -m FILE -p PROMPT [-n N] [--chat] [sampling flags]:
// streams the continuation to stdout and a stats line to stderr.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "runtime/chat_prompt.h"
#include "runtime/generator.h"
#include "runtime/model.h"
#include "spec/drafter_factory.h"
#include "tools/moeserve/commands.h"
#include "tools/moeserve/expert_flags.h"
#include "tools/moeserve/expert_worker_flags.h"
#include "tools/moeserve/spec_flags.h"
#include "tools/moeserve/split_flags.h"

namespace moeserve::tools {
namespace {

struct GenerateCliOptions {
  std::string model_path, prompt, system;
  bool chat = false;
  int64_t n_predict = 128, ctx_size = 4096, batch = 512;
  int threads = 0;
  bool no_pack = false;
  std::string device = "auto";
  moe::ExpertPolicyOptions experts;  // --placement, --n-cpu-moe, --cpu-moe, --gpu-mem
  ExpertWorkerCliOptions worker;     // --expert-worker ...
  runtime::SamplerOptions sampling;
  std::vector<std::string> stop;
  SpecCliOptions spec;          // --spec ...
  LayerSplitFlags layer_split;  // --layer-split SPEC, --micro-batches N
};

Result<std::string> render_chat(const runtime::Model& model, const GenerateCliOptions& o) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  messages.push_back({{"role", "user"}, {"content", o.prompt}});
  Result<std::string> text = runtime::render_chat_prompt(model, messages);
  if (!text.is_ok() && text.status().code() == StatusCode::kNotFound) {
    return make_error(
        StatusCode::kNotFound,
        "{}: the file has no chat template (tokenizer.chat_template); drop --chat and write the "
        "prompt in the model's format yourself",
        model.file().name());
  }
  return text;
}

Status run_generate(const GenerateCliOptions& o) {
  MOESERVE_ASSIGN_OR_RETURN(const runtime::SpecConfig spec_config, resolve_spec_flags(o.spec));
  runtime::ModelLoadOptions load{.n_threads = o.threads, .pack_weights = !o.no_pack, .device = o.device};
  moe::ExpertPolicyOptions experts = o.experts;
  experts.ctx_size = o.ctx_size;
  // Declared before the model: it outlives it.
  experts.with_expert_worker = !o.worker.worker.empty();
  MOESERVE_RETURN_IF_ERROR(apply_expert_flags(o.model_path, experts, &load));
  LayerSplitProcesses shard_processes;  // declared before the model: it outlives it
  MOESERVE_RETURN_IF_ERROR(apply_layer_split(o.model_path, o.layer_split, o.device, &load, &shard_processes));
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<ipc::WorkerExpertBackend> worker,
                            apply_expert_worker_flags(o.model_path, experts.placement_path, o.worker, &load));
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Model> model, runtime::Model::load(o.model_path, load));
  std::string text = o.prompt;
  if (o.chat) {
    MOESERVE_ASSIGN_OR_RETURN(text, render_chat(*model, o));
  }
  const std::vector<int32_t> prompt = model->tokenizer().encode(text);
  if (prompt.empty()) return make_error(StatusCode::kInvalidArgument, "the prompt is empty");
  if (int64_t(prompt.size()) > o.ctx_size) {
    return make_error(StatusCode::kOutOfRange,
                      "the prompt has {} tokens, more than the context size {} (raise --ctx-size)",
                      prompt.size(), o.ctx_size);
  }
  runtime::Generator gen(*model, o.ctx_size);
  runtime::GenerateOptions go;
  go.max_tokens = o.n_predict;
  go.n_batch = o.batch;
  go.sampling = o.sampling;
  go.stop = o.stop;
  go.spec = spec_config;
  go.spec_adaptive = !o.spec.fixed;
  MOESERVE_ASSIGN_OR_RETURN(std::shared_ptr<runtime::DraftSource> draft_model,
                            load_draft_model(o.spec, model->net(), o.model_path));
  std::unique_ptr<runtime::Drafter> drafter = spec::drafter_factory(draft_model)(spec_config);
  go.drafter = drafter.get();
  MOESERVE_ASSIGN_OR_RETURN(runtime::GenerateResult r, gen.generate(prompt, go, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  }));
  std::fputc('\n', stdout);
  std::fflush(stdout);  // the stats line on stderr must come after the text
  const double decode_tps =
      r.tokens.size() > 1 && r.decode_seconds > 0 ? double(r.tokens.size() - 1) / r.decode_seconds : 0.0;
  fmt::print(stderr,
             "prompt: {} tokens, prefill {:.1f} tok/s | generated: {} tokens, decode {:.1f} tok/s | "
             "first token {:.0f} ms | stop: {}\n",
             r.prompt_tokens, r.prefill_seconds > 0 ? double(r.prompt_tokens) / r.prefill_seconds : 0.0,
             r.tokens.size(), decode_tps, r.first_token_seconds * 1e3, runtime::stop_reason_name(r.reason));
  if (drafter != nullptr) fmt::print(stderr, "{}\n", spec_summary_line(spec_config.mode, r.spec));
  if (worker != nullptr) {
    fmt::print(stderr, "{}\n",
               worker_metrics_line(worker->metrics(), r.prompt_tokens + int64_t(r.tokens.size())));
  }
  return Status::ok();
}

}  // namespace

void register_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Generate text from a prompt (streams to stdout) on the CPU, a GPU, or both (--device, --n-cpu-moe)");
  cmd->add_option("-m,--model", o->model_path,
                  "GGUF model file (qwen3moe, qwen3, qwen35moe, qwen35 or laguna)")
      ->required();
  cmd->add_option("-p,--prompt", o->prompt, "Prompt text")->required();
  cmd->add_option("-n,--n-predict", o->n_predict, "Maximum tokens to generate")->capture_default_str();
  cmd->add_flag("--chat", o->chat, "Wrap the prompt as a user message with the file's chat template");
  cmd->add_option("--system", o->system, "System message (with --chat)");
  cmd->add_option("-c,--ctx-size", o->ctx_size, "Context size in tokens (KV cache capacity)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_option("-b,--batch", o->batch, "Prompt tokens per prefill chunk")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0: one per physical core)")
      ->capture_default_str();
  cmd->add_option("--device", o->device,
                  "Device: auto (the first CUDA GPU when this binary has CUDA and one is visible, else the "
                  "CPU), cpu, cuda or cuda:N")
      ->capture_default_str();
  add_expert_flags(cmd, &o->experts);
  add_expert_worker_flags(cmd, &o->worker);
  add_spec_flags(cmd, &o->spec);
  add_layer_split_flag(cmd, &o->layer_split);
  cmd->add_flag("--no-pack", o->no_pack,
                "Use every weight in place from the file (zero-copy), without the packed copy the AVX-512 "
                "kernels are fastest with (saves the Q4_K/Q6_K weights' size in RAM; slower)");
  cmd->add_option("--temp", o->sampling.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "Keep the k most likely tokens (0: all)")
      ->capture_default_str();
  cmd->add_option("--top-p", o->sampling.top_p, "Nucleus: smallest set with this probability mass (1: off)")
      ->capture_default_str();
  cmd->add_option("--min-p", o->sampling.min_p, "Drop tokens below min-p x the top probability (0: off)")
      ->capture_default_str();
  cmd->add_option("--repeat-penalty", o->sampling.repeat_penalty, "Penalise repeated tokens (1: off)")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", o->sampling.repeat_last_n,
                  "Tokens of history the penalties look at (-1: all)")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", o->sampling.presence_penalty, "Subtracted once from seen tokens")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", o->sampling.frequency_penalty,
                  "Subtracted per occurrence of seen tokens")
      ->capture_default_str();
  cmd->add_option("--seed", o->sampling.seed, "Random seed (same seed, same output)")->capture_default_str();
  cmd->add_option("--stop", o->stop, "Stop when this text appears (not printed; repeatable)");
  cmd->callback([o] {
    const Status st = run_generate(*o);
    if (!st.is_ok()) {
      fmt::print(stderr, "error: {}\n", st.message());
      set_exit_code(1);
    }
  });
}

}  // namespace moeserve::tools
