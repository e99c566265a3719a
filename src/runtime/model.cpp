#include "runtime/model.h"

#include <chrono>

#include "core/log.h"
#include "models/qwen3_hparams.h"
#include "models/qwen3_weights.h"
#include "tokenizer/vocab_gguf.h"

namespace moeserve::runtime {

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelLoadOptions& options) {
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  return from_gguf(std::move(file), options);
}

Result<std::unique_ptr<Model>> Model::from_gguf(GgufFile file, const ModelLoadOptions& options) {
  std::unique_ptr<Model> m(new Model(std::move(file)));
  MOESERVE_ASSIGN_OR_RETURN(models::Qwen3HParams hp, models::load_qwen3_hparams(m->file_));
  MOESERVE_ASSIGN_OR_RETURN(models::Qwen3Weights w, models::load_qwen3_weights(m->file_, hp));
  MOESERVE_ASSIGN_OR_RETURN(tok::VocabData vocab, tok::vocab_from_gguf(m->file_));
  if (int64_t(vocab.tokens.size()) > hp.n_vocab) {
    return make_error(StatusCode::kInvalidFormat, "{}: the tokenizer has {} tokens but token_embd only {} rows",
                      m->file_.name(), vocab.tokens.size(), hp.n_vocab);
  }
  MOESERVE_ASSIGN_OR_RETURN(m->tokenizer_, tok::Tokenizer::create(std::move(vocab)));
  m->pool_ = std::make_unique<ThreadPool>(options.n_threads);
  if (options.populate && m->file_.file_backed()) MappedFile::populate(m->file_.bytes());
  if (options.pack_weights) {
    PackWeightsOptions po;
    po.pool = m->pool_.get();
    po.release_source = m->file_.file_backed();
    const auto t0 = std::chrono::steady_clock::now();
    MOESERVE_ASSIGN_OR_RETURN(m->packed_, pack_weights(w, hp, po));
    if (m->packed_.tensors > 0) {
      MOESERVE_LOG_INFO("packed {} weight tensors ({:.2f} GiB) for the {} kernels in {:.2f} s", m->packed_.tensors,
                        double(m->packed_.bytes) / double(1 << 30), cpu::simd_level_name(cpu::cpu_kernels().level),
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  models::Qwen3Options net_options;
  net_options.pool = m->pool_.get();
  m->net_ = std::make_unique<models::Qwen3Model>(std::move(hp), std::move(w), net_options);
  return m;
}

}  // namespace moeserve::runtime
