// A loaded model, ready to run: the mapped GGUF file, its hyperparameters,
// zero-copy weight views, the network and the tokenizer.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "format/gguf.h"
#include "models/qwen3.h"
#include "runtime/weight_packing.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::runtime {

struct ModelLoadOptions {
  int n_threads = 0;  // <= 0: one per physical core
  // Re-lay-out the weights this CPU has packed kernels for (see
  // weight_packing.h). Off: every weight is used in place from the file.
  bool pack_weights = true;
  // Fault every page of the file in before use (MADV_POPULATE_READ), so the
  // first requests do not pay a page fault per 4 KiB (the server wants this).
  bool populate = false;
};

class Model {
 public:
  // open GGUF -> hparams -> weights -> tokenizer. Errors name the file and
  // the key or tensor at fault.
  static Result<std::unique_ptr<Model>> load(const std::string& path, const ModelLoadOptions& options = {});
  // The same from an already parsed file (tests build files in memory).
  static Result<std::unique_ptr<Model>> from_gguf(GgufFile file, const ModelLoadOptions& options = {});

  const GgufFile& file() const { return file_; }
  models::Qwen3Model& net() { return *net_; }
  const models::Qwen3HParams& hparams() const { return net_->hparams(); }
  const tok::Tokenizer& tokenizer() const { return *tokenizer_; }
  ThreadPool& pool() { return *pool_; }
  // What pack_weights did at load (0 tensors when off or not supported here).
  const PackedWeights& packed() const { return packed_; }

 private:
  explicit Model(GgufFile file) : file_(std::move(file)) {}
  GgufFile file_;
  std::unique_ptr<ThreadPool> pool_;
  PackedWeights packed_;  // declared before net_: outlives the views into it
  std::unique_ptr<models::Qwen3Model> net_;
  std::unique_ptr<tok::Tokenizer> tokenizer_;
};

}  // namespace moeserve::runtime
