// make-model: deterministic synthetic Qwen3 / Qwen3-MoE, Qwen3.5/3.6
// (qwen35 / qwen35moe: hybrid Gated DeltaNet) and Laguna GGUF files.
//
// The file has the standard llama.cpp tensor names and keys (model_keys.h), an
// embedded byte-level BPE vocabulary (synthetic_vocab.h) and weights from a
// counter-based generator (make_model_weights.h). Tensors are generated and
// quantized while the file is written (GgufWriter::add_tensor_deferred, rows in
// parallel on a ThreadPool), so memory use is bounded by the largest tensor,
// not the model. The bytes depend only on the options below minus n_threads
// and on_progress: same seed, same file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "convert/make_model_weights.h"
#include "convert/model_presets.h"
#include "core/status.h"
#include "format/gguf_writer.h"

namespace moeserve::convert {

struct MakeModelOptions {
  ModelShape shape;                     // from model_preset()
  FileType file_type = FileType::kF32;  // any of quant_mix.h
  uint64_t seed = 0;
  double router_skew = 0.0;  // >= 0; see make_model_weights.h
  int n_threads = 0;         // ThreadPool semantics: <= 0 means one per physical core
  // Scales from each block's plain range instead of the search (K-quants,
  // IQ4_XS, the IQ2/IQ3 i-quants; tensor/quantize.h QuantEffort::kQuick):
  // 10-25x faster, other bytes.
  bool quick_quant = false;
  // Called on the calling thread as tensor data is produced: bytes done, bytes in all.
  std::function<void(uint64_t done, uint64_t total)> on_progress;
};

struct MakeModelSummary {
  int64_t n_params = 0;
  size_t n_tensors = 0;
  uint64_t tensor_bytes = 0;  // tensor data without alignment padding
};

// Fills `writer` with the model's metadata and deferred tensors (nothing is
// generated until writer.write()). kInvalidArgument for bad options.
Result<MakeModelSummary> add_synthetic_model(const MakeModelOptions& options, GgufWriter& writer);

// add_synthetic_model + write to `path` (via path.tmp + rename).
Result<MakeModelSummary> make_model(const MakeModelOptions& options, const std::string& path);

}  // namespace moeserve::convert
