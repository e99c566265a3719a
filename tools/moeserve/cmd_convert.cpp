// moeserve convert HF_DIR -o FILE [--type T] [--threads N]: a Hugging Face
// Qwen3 / Qwen3-MoE / Qwen3.5 (qwen35moe, qwen35) / Laguna checkpoint (config.json, *.safetensors,
// tokenizer.json) to a GGUF file llama.cpp and moeserve load.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "convert/hf_config.h"
#include "convert/hf_convert.h"
#include "convert/quant_mix.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {
namespace {

struct ConvertCliOptions {
  std::string hf_dir;
  std::string output;
  std::string type = "bf16";
  int threads = 0;
  bool progress = false;
  bool no_progress = false;
};

void run_convert(const ConvertCliOptions& cli) {
  auto type = convert::file_type_from_name(cli.type);
  if (!type) {
    fmt::print(stderr, "error: unknown --type '{}' (supported: {})\n", cli.type, convert::supported_file_type_names());
    set_exit_code(1);
    return;
  }
  convert::ConvertOptions options;
  options.hf_dir = cli.hf_dir;
  options.output_path = cli.output;
  options.file_type = *type;
  options.threads = cli.threads;
  options.progress = progress_mode(cli.progress, cli.no_progress);
  auto summary = convert::convert_hf_model(options);
  if (!summary) {
    fmt::print(stderr, "error: {}\n", summary.status().to_string());
    set_exit_code(1);
    return;
  }
  fmt::print("wrote {} ({}, {}, {} tensors, {} tokens, {:.2f} MiB of tensor data)\n", cli.output, summary->arch, cli.type,
             summary->n_tensors, summary->n_tokens, double(summary->bytes_after) / (1024.0 * 1024.0));
  for (const auto& [name, tally] : summary->by_type) {
    fmt::print("  {:<6} {:5} tensors  {:10.2f} MiB\n", name, tally.tensors, double(tally.bytes) / (1024.0 * 1024.0));
  }
}

}  // namespace

void register_convert(CLI::App& app) {
  auto cli = std::make_shared<ConvertCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Convert a Hugging Face model directory to GGUF. Reads config.json (supported: " +
          convert::supported_hf_architectures() +
          "), the weights from model.safetensors.index.json, model.safetensors or all *.safetensors, and the\n"
          "tokenizer from tokenizer.json (+ tokenizer_config.json, generation_config.json). Tensors are\n"
          "converted while the file is written, so memory use stays small.");
  cmd->add_option("hf_dir", cli->hf_dir, "Hugging Face model directory")->required();
  cmd->add_option("-o,--output", cli->output, "GGUF file to write (written via FILE.tmp, then renamed)")->required();
  cmd->add_option("--type", cli->type,
                  "Weight type: f32, f16 or bf16 store every matrix in that type; q8_0, q4_0, q4_k_m, q5_k_m, q6_k\n"
                  "quantize with llama.cpp's per-tensor mix (output and some attn_v/ffn_down get more bits).\n"
                  "Norms and the MoE router always stay f32. Default bf16 (lossless for bf16 checkpoints)");
  cmd->add_option("--threads", cli->threads, "Threads converting rows (default: one per physical core)");
  cmd->add_flag("--progress", cli->progress, "Show the progress bar even when stderr is not a terminal");
  cmd->add_flag("--no-progress", cli->no_progress, "Never show the progress bar");
  cmd->callback([cli] { run_convert(*cli); });
}

}  // namespace moeserve::tools
