// moeserve quantize IN OUT --type T [--imatrix FILE] [--threads N]: re-type
// the tensors of a GGUF file by llama.cpp's per-tensor mixing rule
// (convert/quant_mix.h), optionally weighting the error by an importance
// matrix (format/imatrix.h).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "convert/quant_mix.h"
#include "convert/quantize_model.h"
#include "format/imatrix.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {
namespace {

struct QuantizeCliOptions {
  std::string input;
  std::string output;
  std::string type;
  std::string imatrix;
  int threads = 0;
  bool progress = false;
  bool no_progress = false;
};

void run_quantize(const QuantizeCliOptions& cli) {
  auto type = convert::file_type_from_name(cli.type);
  if (!type) {
    fmt::print(stderr, "error: unknown --type '{}' (supported: {})\n", cli.type,
               convert::supported_file_type_names());
    set_exit_code(1);
    return;
  }
  if (cli.input == cli.output) {
    fmt::print(stderr, "error: the output must differ from the input ({})\n", cli.input);
    set_exit_code(1);
    return;
  }
  convert::QuantizeOptions options;
  options.input_path = cli.input;
  options.output_path = cli.output;
  options.file_type = *type;
  options.threads = cli.threads;
  options.progress = progress_mode(cli.progress, cli.no_progress);
  Imatrix imatrix;
  if (!cli.imatrix.empty()) {
    auto read = read_imatrix(cli.imatrix);
    if (!read) {
      fmt::print(stderr, "error: --imatrix: {}\n", read.status().to_string());
      set_exit_code(1);
      return;
    }
    imatrix = std::move(read.value());
    options.imatrix = &imatrix;
    options.imatrix_name = cli.imatrix;
    fmt::print(stderr, "quantize: imatrix {}: {} entries, {} chunks of {}\n", cli.imatrix,
               imatrix.entries.size(), imatrix.chunk_count, imatrix.chunk_size);
  }
  // llama-quantize refuses these without an importance matrix; here they
  // are written, with a warning: 2-bit codebooks lose most without one.
  if (options.imatrix == nullptr &&
      (*type == convert::FileType::kIQ2_XXS || *type == convert::FileType::kIQ2_XS ||
       *type == convert::FileType::kIQ2_S || *type == convert::FileType::kIQ1_S ||
       *type == convert::FileType::kIQ1_M)) {
    fmt::print(stderr,
               "warning: --type {} without --imatrix: expect a much worse model than with one (moeserve "
               "imatrix -m {} -f TEXT -o imatrix.gguf makes one)\n",
               cli.type, cli.input);
  }
  auto summary = convert::quantize_model(options);
  if (!summary) {
    fmt::print(stderr, "error: {}\n", summary.status().to_string());
    set_exit_code(1);
    return;
  }
  if (summary->imatrix_missing > 0) {
    fmt::print(stderr,
               "warning: the imatrix has no data for {} tensors (e.g. {}); they were quantized without it\n",
               summary->imatrix_missing, summary->first_missing);
  }
  fmt::print("wrote {} ({})\n{}", cli.output, cli.type, convert::format_quantize_summary(*summary));
}

}  // namespace

void register_quantize(CLI::App& app) {
  auto cli = std::make_shared<QuantizeCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "quantize",
      "Write a copy of a GGUF model with its weights in another type. Any source type is read\n"
      "(dequantized, then quantized again); all metadata is copied and general.file_type set.\n"
      "Prints the tensor count and size per type, and the size before and after.");
  cmd->add_option("input", cli->input, "GGUF file to read")->required();
  cmd->add_option("output", cli->output, "GGUF file to write (written via OUT.tmp, then renamed)")
      ->required();
  cmd->add_option(
         "--type", cli->type,
         "Target file type, with llama-quantize's per-tensor choices: q4_k_m (Q4_K; Q6_K for output and\n"
         "for attn_v/ffn_down in the first/last eighth of the layers and every third layer between; Q8_0\n"
         "attn_v for 8-expert models), q5_k_m, q4_k_s, q5_k_s, q3_k_s/m/l, q2_k, q2_k_s, q6_k, q8_0, q4_0,\n"
         "q4_1, q5_0, q5_1, iq4_nl, iq4_xs, iq3_m, iq3_s, iq3_xs, iq3_xxs, iq2_m, iq2_s, iq2_xs, iq2_xxs,\n"
         "iq1_m, iq1_s (the 1- and 2-bit ones want --imatrix), mxfp4_moe, or the float types f16, bf16,\n"
         "f32. Norms and ffn_gate_inp stay f32; rows whose length the type's block does not divide\n"
         "fall back as llama-quantize's do")
      ->required();
  cmd->add_option(
      "--imatrix", cli->imatrix,
      "Importance matrix (moeserve imatrix or llama-imatrix: GGUF or the legacy .dat): weights each\n"
      "column's error by its importance in the K-quants, Q4_0/Q4_1/Q5_0/Q5_1, IQ4_NL and IQ4_XS");
  cmd->add_option("--threads", cli->threads, "Threads quantizing rows (default: one per physical core)");
  cmd->add_flag("--progress", cli->progress, "Show the progress bar even when stderr is not a terminal");
  cmd->add_flag("--no-progress", cli->no_progress, "Never show the progress bar");
  cmd->callback([cli] { run_quantize(*cli); });
}

}  // namespace moeserve::tools
