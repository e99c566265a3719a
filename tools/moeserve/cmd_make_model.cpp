// moeserve make-model: write a deterministic synthetic Qwen3 / Qwen3-MoE,
// Qwen3.5/3.6 (hybrid Gated DeltaNet, dense or MoE) or Laguna GGUF (convert/make_model.h)
// for tests, benchmarks and expert-placement studies.
#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <string>

#include "convert/make_model.h"
#include "convert/quant_mix.h"
#include "core/progress.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {
namespace {

struct MakeModelCliOptions {
  std::string arch = "qwen3moe";
  std::string preset = "tiny";
  std::string type = "q4_k_m";
  uint64_t seed = 0;
  double router_skew = 0.0;
  int64_t layers = 0;  // 0: the preset's
  int threads = 0;
  bool quick_quant = false;
  std::string output;
  bool progress = false;
  bool no_progress = false;
};

std::string human_size(uint64_t bytes) {
  const double gib = double(bytes) / double(1ull << 30);
  return gib >= 1.0 ? fmt::format("{:.2f} GiB", gib)
                    : fmt::format("{:.2f} MiB", double(bytes) / double(1 << 20));
}

// The options from the command line, or a message saying which flag is wrong.
Result<convert::MakeModelOptions> to_options(const MakeModelCliOptions& cli) {
  const std::optional<convert::ModelArch> arch = convert::arch_from_name(cli.arch);
  if (!arch) {
    return make_error(StatusCode::kInvalidArgument, "unknown --arch '{}' (supported: {})", cli.arch,
                      convert::kArchNames);
  }
  Result<convert::ModelShape> shape = convert::model_preset(*arch, cli.preset);
  if (!shape) return make_error(StatusCode::kInvalidArgument, "--preset: {}", shape.status().message());
  const std::optional<convert::FileType> type = convert::file_type_from_name(cli.type);
  if (!type) {
    return make_error(StatusCode::kInvalidArgument, "unknown --type '{}' (supported: {})", cli.type,
                      convert::supported_file_type_names());
  }
  if (!(cli.router_skew >= 0.0)) {
    return make_error(StatusCode::kInvalidArgument, "--router-skew must be >= 0 (got {})", cli.router_skew);
  }
  if (cli.layers < 0 || cli.layers > 1024) {
    return make_error(StatusCode::kInvalidArgument, "--layers must be 1..1024 (got {})", cli.layers);
  }
  convert::MakeModelOptions o;
  o.shape = std::move(shape.value());
  if (cli.layers > 0) o.shape.n_layer = cli.layers;
  o.file_type = *type;
  o.seed = cli.seed;
  o.router_skew = cli.router_skew;
  o.n_threads = cli.threads;
  o.quick_quant = cli.quick_quant;
  return o;
}

void run_make_model(const MakeModelCliOptions& cli) {
  Result<convert::MakeModelOptions> options = to_options(cli);
  if (!options) {
    fmt::print(stderr, "error: {}\n", options.status().message());
    set_exit_code(1);
    return;
  }
  const convert::ModelShape& shape = options->shape;
  std::unique_ptr<Progress> progress;
  uint64_t reported = 0;
  options->on_progress = [&](uint64_t done, uint64_t total) {
    if (!progress) {
      progress = std::make_unique<Progress>(ProgressOptions{
          .label = "make-model", .total_units = total, .mode = progress_mode(cli.progress, cli.no_progress)});
    }
    progress->add_units(done - reported);
    reported = done;
  };
  const auto start = std::chrono::steady_clock::now();
  Result<convert::MakeModelSummary> summary = convert::make_model(*options, cli.output);
  if (progress) progress->finish();
  if (!summary) {
    fmt::print(stderr, "error: {}: {}\n", cli.output, summary.status().to_string());
    set_exit_code(1);
    return;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(
      "wrote {}: {} {} {}, seed {}, router skew {}: {:.3f} B params, {} tensors, {} of tensor data in {:.1f} "
      "s\n",
      cli.output, convert::arch_name(shape.arch), shape.preset, cli.type, cli.seed, cli.router_skew,
      double(summary->n_params) / 1e9, summary->n_tensors, human_size(summary->tensor_bytes), seconds);
}

}  // namespace

void register_make_model(CLI::App& app) {
  auto cli = std::make_shared<MakeModelCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "make-model",
      "Write a synthetic Qwen3-MoE, dense Qwen3, Qwen3.5/3.6 hybrid Gated DeltaNet (MoE qwen35moe or\n"
      "dense qwen35) or Poolside Laguna (laguna) model: standard llama.cpp tensor names and keys, an\n"
      "embedded byte-level BPE vocabulary (gpt2; pre-tokenizer qwen2, or qwen35 for the hybrids;\n"
      "Qwen's special tokens, Qwen3's chat template) and random weights that are a pure function of\n"
      "--seed (the same file for any --threads). Weights are generated and quantized while the file\n"
      "is written, so memory stays small even for 30b-a3b (~17 GiB in q4_k_m). The model computes\n"
      "nonsense, but at the real cost.");
  cmd->add_option(
      "--arch", cli->arch,
      "qwen3moe (default), qwen3 (dense), qwen35moe (Qwen3.5/3.6 MoE: every 4th layer gated\n"
      "full attention, the others Gated DeltaNet; routed + shared experts), qwen35 (the same\n"
      "layers with a dense FFN) or laguna (Laguna: every 4th layer full attention, the others\n"
      "sliding-window; layer 0 dense, then sigmoid-routed + shared experts). Presets: qwen3moe and\n"
      "qwen3: tiny, small, 30b-a3b; qwen35moe: tiny, small, 35b-a3b; qwen35: tiny, small, 27b;\n"
      "laguna: tiny, small, laguna-xs");
  cmd->add_option(
      "--preset", cli->preset,
      "tiny (default; 2 layers, hidden 256, 4/2 heads of 64, 8 experts top-2 of FF 256, dense FF\n"
      "512, vocab 2048), small (16 layers, hidden 1024, 16/4 heads of 64, 64 experts top-8 of FF 512,\n"
      "vocab 151936; dense FF 3072), 30b-a3b (Qwen3-30B-A3B: 48 layers, hidden 2048, 32/4 heads of\n"
      "128, 128 experts top-8 of FF 768; with --arch qwen3 it means Qwen3-32B's shapes: 64 layers,\n"
      "hidden 5120, 64/8 heads, FF 25600). For qwen35moe/qwen35: tiny (4 layers, layer 3 full\n"
      "attention, hidden 256, attention 4/2 heads of 64, DeltaNet 2 K / 4 V heads of 64, 8 experts\n"
      "top-2 of FF 256 + shared FF 256 or dense FF 512, vocab 2048), small (16 layers, hidden 1024,\n"
      "attention 8/2 heads of 128, DeltaNet 8/16 heads of 64, 64 experts top-8 of FF 512 + shared\n"
      "FF 512 or dense FF 3072, vocab 151936), 35b-a3b (qwen35moe only, Qwen3.6-35B-A3B: 40 layers,\n"
      "hidden 2048, 16/2 heads of 256, DeltaNet 16/32 heads of 128, 256 experts top-8 of FF 512,\n"
      "vocab 248320), 27b (qwen35 only, Qwen3.6-27B: 64 layers, hidden 5120, 24/4 heads of 256,\n"
      "DeltaNet 16/48 heads of 128, FF 17408, vocab 248320). For laguna: tiny (4 layers, hidden 256,\n"
      "heads [4, 6, 6, 6] of 64 / 2 KV, window 16, 8 experts top-2 of FF 128 + shared 128, dense FF\n"
      "512, vocab 2048), small (8 layers, hidden 1024, heads [8, 16, 16, 16] of 128 / 4 KV, window 128,\n"
      "64 experts top-8 of FF 512 + shared 512, dense FF 2048, vocab 151936), laguna-xs (Laguna-XS.2:\n"
      "40 layers, hidden 2048, heads [48, 64, 64, 64] of 128 / 8 KV, window 512, 256 experts top-8 of\n"
      "FF 512 + shared 512, dense FF 8192, vocab 100352, YaRN x32)");
  cmd->add_option(
      "--type", cli->type,
      "Weight type: q4_k_m (default; llama.cpp's mix: Q4_K, Q6_K output and some attn_v/ffn_down),\n"
      "q8_0, bf16, f32 (also f16, q4_0, q5_k_m, q6_k). Norms, the router and ssm_conv1d stay f32");
  cmd->add_option("--layers", cli->layers,
                  "Number of layers (default: the preset's). The per-layer shapes stay the preset's, so a\n"
                  "few-layer 30b-a3b is a quick stand-in for timing its kernels. In qwen35moe/qwen35 the\n"
                  "layers il with (il + 1) % 4 == 0 stay full attention, so keep 4 or more to have one;\n"
                  "in laguna the layers il with il % 4 == 0 (layer 0 keeps the dense FFN)");
  cmd->add_option("--seed", cli->seed,
                  "Seed of the weights (default 0); equal seeds give byte-identical files");
  cmd->add_option(
      "--router-skew", cli->router_skew,
      "S >= 0 (default 0: all experts equally popular). In each layer the experts get a popularity\n"
      "rank r from a seed-derived permutation (different per layer) and expert e's router row is\n"
      "scaled by (r_e + 1)^-S, widening the logit distribution of popular experts so they win the\n"
      "top-k more often. Measured on random hidden states (64 experts, top-8): the top 25% of\n"
      "experts take 27% of selections at S=0, 53% at S=0.5, 68% at S=1");
  cmd->add_option("--threads", cli->threads,
                  "Threads generating and quantizing rows (default: one per physical core)");
  cmd->add_flag("--quick-quant", cli->quick_quant,
                "Scales from each block's plain range, no search (K-quants, IQ4_XS, IQ2/IQ3 i-quants):\n"
                "10-25x faster to write and up to 1.25x the quantization error; the same shapes, types\n"
                "and speed to run. For speed benchmarks (scripts/device/bench_30b.sh, lowbit_30b.sh)");
  cmd->add_option("-o,--output", cli->output, "GGUF file to write (via FILE.tmp, then renamed)")->required();
  cmd->add_flag("--progress", cli->progress, "Show the progress bar even when stderr is not a terminal");
  cmd->add_flag("--no-progress", cli->no_progress, "Never show the progress bar");
  cmd->callback([cli] { run_make_model(*cli); });
}

}  // namespace moeserve::tools
