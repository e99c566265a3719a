// Reading an architecture's hyperparameters and weights from a GGUF file,
// shared by the model families: every value is checked where it is read,
// and errors name the file and the key or tensor at fault.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"
#include "models/language_model.h"
#include "tensor/weight_view.h"

namespace moeserve::models {

// {arch}.suffix as an integer in [min_value, 2^31]; `fallback` < 0 means required.
Result<int64_t> read_hparam_int(const GgufFile& f, std::string_view suffix, int64_t min_value,
                                int64_t fallback = -1);
// {arch}.suffix as a float; `fallback` is used when absent (NaN: required).
Result<double> read_hparam_float(const GgufFile& f, std::string_view suffix, double fallback);
// kInvalidFormat "{file}: inconsistent hyperparameters: {what}".
Status inconsistent_hparams(const GgufFile& f, std::string_view what);

// Zero-copy views of a file's tensors, each checked for presence, exact
// shape and type; counts the parameters and bytes of what it hands out.
struct TensorLoader {
  const GgufFile& file;
  uint64_t n_params = 0;
  uint64_t n_bytes = 0;

  // `expected` in ne order; f32_only for tensors used elementwise (norms,
  // conv weights), never through a matmul.
  Result<WeightView> get(const std::string& name, std::vector<int64_t> expected, bool f32_only);
};

// The embedding, final norm and output head of a file; output is
// token_embd (tied) when output.weight is absent. n_vocab = token_embd's rows.
struct EmbeddingWeights {
  WeightView token_embd, output_norm, output;
  bool tied_output = false;
  int64_t n_vocab = 0;
};
Result<EmbeddingWeights> load_embeddings(TensorLoader& ld, int64_t n_embd);
// Those into an architecture's weights (token_embd, output_norm, output,
// tied_output) and the vocabulary size into its hyperparameters.
template <class HParams, class Weights>
Status load_io_weights(TensorLoader& ld, HParams& hp, Weights& w) {
  MOESERVE_ASSIGN_OR_RETURN(EmbeddingWeights e, load_embeddings(ld, hp.n_embd));
  hp.n_vocab = e.n_vocab;
  w.token_embd = e.token_embd;
  w.output_norm = e.output_norm;
  w.output = e.output;
  w.tied_output = e.tied_output;
  return Status::ok();
}

// An architecture's factory (registry.cpp): its hyperparameters and weights
// read from the file, then Model::create over them (which places the weights).
template <class Model, class HParams, class Weights>
Result<std::unique_ptr<LanguageModel>> load_language_model(const GgufFile& file, const Placement& placement,
                                                           Result<HParams> (*load_hparams)(const GgufFile&),
                                                           Result<Weights> (*load_weights)(const GgufFile&,
                                                                                           HParams&)) {
  MOESERVE_ASSIGN_OR_RETURN(HParams hp, load_hparams(file));
  MOESERVE_ASSIGN_OR_RETURN(Weights w, load_weights(file, hp));
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Model::create(std::move(hp), std::move(w), placement));
  return std::unique_ptr<LanguageModel>(std::move(m));
}

}  // namespace moeserve::models
