// moeserve imatrix -m FILE -f TEXT -o imatrix.gguf [-c N] [--chunks N]: the
// importance matrix of a model over a text (runtime/imatrix.h), written in
// llama.cpp's GGUF imatrix format for `moeserve quantize --imatrix` (or
// llama-quantize).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "runtime/imatrix.h"
#include "runtime/model.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {
namespace {

struct ImatrixCliOptions {
  std::string model_path, text_path, output_path = "imatrix.gguf";
  int64_t ctx_size = 512, batch = 512, chunks = -1;
  int threads = 0;
  std::string device = "cpu";
};

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "-f {}: cannot open the file", path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Status run_imatrix(const ImatrixCliOptions& o) {
  if (o.device != "cpu") {
    return make_error(StatusCode::kUnsupported,
                      "imatrix runs on the CPU only so far (--device {}): use --device cpu", o.device);
  }
  MOESERVE_ASSIGN_OR_RETURN(const std::string text, read_text(o.text_path));
  // Weights in place: the collector recognises each product's weight by its
  // bytes in the file (runtime/imatrix.h).
  const runtime::ModelLoadOptions load{.n_threads = o.threads, .pack_weights = false, .device = "cpu"};
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Model> model, runtime::Model::load(o.model_path, load));
  const std::vector<int32_t> tokens = model->tokenizer().encode(text);
  const int64_t whole = int64_t(tokens.size()) / o.ctx_size;
  fmt::print(stderr, "imatrix: {} tokens, {} chunks of {}, batch {}\n", tokens.size(),
             o.chunks > 0 ? std::min(o.chunks, whole) : whole, o.ctx_size, o.batch);
  const auto t0 = std::chrono::steady_clock::now();
  const runtime::ImatrixOptions options{
      .n_ctx = o.ctx_size, .n_batch = o.batch, .max_chunks = o.chunks, .dataset = o.text_path};
  auto progress = [&](int64_t chunk, int64_t n_chunks) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print(stderr, "imatrix: chunk {}/{} done ({:.1f} s)\n", chunk + 1, n_chunks, s);
  };
  MOESERVE_ASSIGN_OR_RETURN(const Imatrix m, runtime::collect_imatrix(*model, tokens, options, progress));
  MOESERVE_RETURN_IF_ERROR(write_imatrix(m, o.output_path));
  fmt::print(stderr, "imatrix: wrote {} ({} entries, {} chunks of {})\n", o.output_path, m.entries.size(),
             m.chunk_count, m.chunk_size);
  return Status::ok();
}

}  // namespace

void register_imatrix(CLI::App& app) {
  auto o = std::make_shared<ImatrixCliOptions>();
  CLI::App* cmd = app.add_subcommand("imatrix",
                                     "Importance matrix of a model over a text file: per weight matrix and "
                                     "input column, the sum of x^2 over the\n"
                                     "activations it multiplies (per expert for MoE expert tensors), in "
                                     "llama.cpp's GGUF imatrix format, for\n"
                                     "`moeserve quantize --imatrix`. The text is cut into chunks of "
                                     "--ctx-size tokens, as `perplexity` does");
  cmd->add_option("-m,--model", o->model_path, "GGUF model file")->required();
  cmd->add_option("-f,--file", o->text_path, "Calibration text file")->required();
  cmd->add_option("-o,--output", o->output_path, "imatrix file to write")->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx_size, "Tokens per chunk")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(2), int64_t(1) << 20));
  cmd->add_option("-b,--batch", o->batch, "Rows per forward")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  cmd->add_option("--chunks", o->chunks, "Evaluate at most this many chunks (-1: all)")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Worker threads (0: one per physical core)")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "Device (cpu only so far)")->capture_default_str();
  cmd->callback([o] { report_status(run_imatrix(*o)); });
}

}  // namespace moeserve::tools
