// A loaded model, ready to run: the mapped GGUF file, its hyperparameters,
// zero-copy weight views, the network and the tokenizer.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "format/gguf.h"
#include "models/qwen3.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::runtime {

struct ModelLoadOptions {
  int n_threads = 0;  // <= 0: one per physical core
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

 private:
  explicit Model(GgufFile file) : file_(std::move(file)) {}
  GgufFile file_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<models::Qwen3Model> net_;
  std::unique_ptr<tok::Tokenizer> tokenizer_;
};

}  // namespace moeserve::runtime
