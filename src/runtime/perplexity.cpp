#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "runtime/generator.h"

namespace moeserve::runtime {

double negative_log_likelihood(std::span<const float> logits, int32_t target) {
  float max = logits[0];
  for (float v : logits) max = std::max(max, v);
  double sum = 0.0;
  for (float v : logits) sum += std::exp(double(v) - double(max));
  return -(double(logits[size_t(target)]) - double(max) - std::log(sum));
}

Result<PerplexityResult> perplexity(Model& model, std::span<const int32_t> tokens, const PerplexityOptions& o,
                                    const PerplexityProgress& progress) {
  const int64_t n_ctx = o.n_ctx, n_vocab = model.info().n_vocab;
  if (n_ctx < 4) return make_error(StatusCode::kInvalidArgument, "perplexity: a context of {} tokens is too small", n_ctx);
  if (int64_t(tokens.size()) < 2 * n_ctx) {
    return make_error(StatusCode::kInvalidArgument,
                      "the text has {} tokens; perplexity with a context of {} needs at least {} (use a longer text "
                      "or a smaller --ctx-size)",
                      tokens.size(), n_ctx, 2 * n_ctx);
  }
  int64_t n_chunks = int64_t(tokens.size()) / n_ctx;
  if (o.max_chunks > 0) n_chunks = std::min(n_chunks, o.max_chunks);
  const int64_t first = n_ctx / 2, n_batch = std::max<int64_t>(o.n_batch, 1);
  Generator gen(model, n_ctx);
  MOESERVE_RETURN_IF_ERROR(gen.status());
  const std::optional<int32_t> bos =
      model.tokenizer().add_bos() ? model.tokenizer().bos_id() : std::optional<int32_t>();
  PerplexityResult r;
  double nll = 0.0, nll2 = 0.0;
  std::vector<int32_t> chunk(size_t(n_ctx), 0);
  std::vector<float> logits;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const std::span<const int32_t> orig = tokens.subspan(size_t(c * n_ctx), size_t(n_ctx));
    std::copy(orig.begin(), orig.end(), chunk.begin());
    if (bos) chunk[0] = *bos;
    gen.sequence().clear();
    MOESERVE_RETURN_IF_ERROR(gen.prefill(std::span<const int32_t>(chunk).first(size_t(first)), n_batch, {}));
    // The second half with every row's logits, n_batch rows a forward.
    for (int64_t p0 = first; p0 < n_ctx; p0 += n_batch) {
      const int64_t n = std::min(n_batch, n_ctx - p0);
      const std::span<const int32_t> rows = std::span<const int32_t>(chunk).subspan(size_t(p0), size_t(n));
      logits.resize(size_t(n * n_vocab));
      MOESERVE_RETURN_IF_ERROR(gen.verify(rows, 0, logits.data(), nullptr));
      gen.sequence().append(rows);
      for (int64_t i = 0; i < n && p0 + i + 1 < n_ctx; ++i) {
        const double v = negative_log_likelihood(
            std::span<const float>(logits).subspan(size_t(i * n_vocab), size_t(n_vocab)), orig[size_t(p0 + i + 1)]);
        nll += v, nll2 += v * v;
        ++r.tokens_scored;
      }
    }
    r.running_ppl.push_back(std::exp(nll / double(r.tokens_scored)));
    if (progress) progress(c, n_chunks, r.running_ppl.back());
  }
  r.chunks = n_chunks;
  const double count = double(r.tokens_scored);
  r.mean_nll = nll / count;
  r.ppl = std::exp(r.mean_nll);
  const double var = nll2 / count - r.mean_nll * r.mean_nll;
  r.ppl_error = var > 0 && count > 1 ? std::sqrt(var / (count - 1)) * r.ppl : 0.0;
  return r;
}

}  // namespace moeserve::runtime
