// Perplexity of a model over a text, windowed as llama.cpp's `perplexity`
// tool does so that the numbers compare (issue 43: a quantization's quality):
// the tokens are cut into chunks of n_ctx; each chunk is evaluated on its own
// (its first token replaced by BOS when the vocabulary adds one), and the
// negative log-likelihood of each token in the chunk's second half counts —
// the logits at positions n_ctx/2 .. n_ctx-2 against the token after each.
// PPL = exp(mean NLL), with the delta-method standard error llama.cpp prints.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "runtime/model.h"

namespace moeserve::runtime {

struct PerplexityOptions {
  int64_t n_ctx = 512;     // tokens per chunk (llama.cpp's -c)
  int64_t n_batch = 512;   // rows per forward
  int64_t max_chunks = -1; // -1: every whole chunk of the text
};

struct PerplexityResult {
  double ppl = 0.0, ppl_error = 0.0;  // the estimate and its standard error
  double mean_nll = 0.0;
  int64_t tokens_scored = 0, chunks = 0;
  std::vector<double> running_ppl;  // after each chunk (llama.cpp's "[i]ppl," line)
};

// After each chunk: its index (from 0) and the running perplexity.
using PerplexityProgress = std::function<void(int64_t chunk, int64_t n_chunks, double running_ppl)>;

// kInvalidArgument when the text has fewer than 2 * n_ctx tokens (as
// llama.cpp), or n_ctx < 4; errors of the forward pass otherwise.
Result<PerplexityResult> perplexity(Model& model, std::span<const int32_t> tokens, const PerplexityOptions& o,
                                    const PerplexityProgress& progress = {});

// -log softmax(logits)[target], in double precision.
double negative_log_likelihood(std::span<const float> logits, int32_t target);

}  // namespace moeserve::runtime
