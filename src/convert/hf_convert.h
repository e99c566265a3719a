// moeserve convert: a Hugging Face model directory (config.json,
// *.safetensors, tokenizer.json) -> one GGUF file.
//
// Weights are converted while the file is written (add_tensor_deferred),
// straight from the mmapped safetensors, rows in parallel on a ThreadPool,
// so memory stays small whatever the model size. Types per tensor follow
// convert/quant_mix.h (norms and the router stay F32).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "convert/quant_mix.h"
#include "convert/quantize_model.h"
#include "core/progress.h"
#include "core/status.h"

namespace moeserve::convert {

struct ConvertOptions {
  std::string hf_dir;
  std::string output_path;
  FileType file_type = FileType::kBF16;
  int threads = 0;  // <= 0: one per physical core
  ProgressOptions::Mode progress = ProgressOptions::Mode::kAuto;
};

struct ConvertSummary {
  std::string arch;
  size_t n_tensors = 0;
  size_t n_tokens = 0;  // vocabulary as written (padded)
  uint64_t bytes_after = 0;
  std::map<std::string, TypeTally> by_type;
  // What was left out on purpose (MTP layers, a vision tower), one line each;
  // also logged at info level.
  std::vector<std::string> notes;
};

Result<ConvertSummary> convert_hf_model(const ConvertOptions& options);

}  // namespace moeserve::convert
