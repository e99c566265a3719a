#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace moeserve::runtime {
namespace {

struct Candidate {
  int32_t id;
  float logit;
  float p;
};

// Softmax of c[i].logit / temp into c[i].p (c sorted descending by logit).
void softmax(std::vector<Candidate>& c, float temp) {
  if (c.empty()) return;
  const float max_logit = c.front().logit;
  double sum = 0.0;
  for (Candidate& x : c) {
    x.p = std::exp((x.logit - max_logit) / temp);
    sum += x.p;
  }
  for (Candidate& x : c) x.p = float(x.p / sum);
}

}  // namespace

void Sampler::apply_penalties(std::span<float> logits, std::span<const int32_t> history) const {
  const SamplerOptions& o = options_;
  if (o.repeat_last_n == 0 ||
      (o.repeat_penalty == 1.0f && o.presence_penalty == 0.0f && o.frequency_penalty == 0.0f)) {
    return;
  }
  size_t n = history.size();
  if (o.repeat_last_n > 0) n = std::min(n, size_t(o.repeat_last_n));
  std::unordered_map<int32_t, int32_t> counts;
  for (int32_t id : history.subspan(history.size() - n)) {
    if (id >= 0 && size_t(id) < logits.size()) ++counts[id];
  }
  for (const auto& [id, count] : counts) {
    float& l = logits[size_t(id)];
    l = l > 0.0f ? l / o.repeat_penalty : l * o.repeat_penalty;
    l -= float(count) * o.frequency_penalty + o.presence_penalty;
  }
}

namespace {

// Index of the largest value; ties go to the lowest index, NaN ranks below
// everything (the order by_logit below defines).
int32_t arg_max(std::span<const float> l) {
  int32_t best = -1;
  float best_v = -INFINITY;
  for (size_t i = 0; i < l.size(); ++i) {
    const float v = std::isnan(l[i]) ? -INFINITY : l[i];
    if (best < 0 || v > best_v) best = int32_t(i), best_v = v;
  }
  return best;
}

}  // namespace

bool Sampler::penalties_active() const {
  const SamplerOptions& o = options_;
  return o.repeat_last_n != 0 &&
         (o.repeat_penalty != 1.0f || o.presence_penalty != 0.0f || o.frequency_penalty != 0.0f);
}

std::vector<TokenProb> Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history) const {
  if (greedy()) {
    // Greedy is an arg-max: no candidate list (this runs once per token
    // per sequence, over the whole vocabulary).
    if (logits.empty()) return {};
    if (!penalties_active()) return {{arg_max(logits), 1.0f}};
    std::vector<float> l(logits.begin(), logits.end());
    apply_penalties(l, history);
    return {{arg_max(l), 1.0f}};
  }
  std::vector<float> l(logits.begin(), logits.end());
  apply_penalties(l, history);
  std::vector<Candidate> c(l.size());
  for (size_t i = 0; i < l.size(); ++i) c[i] = {int32_t(i), std::isnan(l[i]) ? -INFINITY : l[i], 0.0f};
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };
  const SamplerOptions& o = options_;
  // top-k (partial sort keeps this cheap for a 150k vocabulary).
  const size_t k = o.top_k > 0 ? std::min(c.size(), size_t(o.top_k)) : c.size();
  std::partial_sort(c.begin(), c.begin() + ptrdiff_t(k), c.end(), by_logit);
  c.resize(k);
  softmax(c, 1.0f);
  if (o.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = c.size();
    for (size_t i = 0; i < c.size(); ++i) {
      cum += c[i].p;
      if (cum >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
    c.resize(std::max<size_t>(keep, 1));
  }
  if (o.min_p > 0.0f && !c.empty()) {
    const float threshold = o.min_p * c.front().p;
    size_t keep = 1;
    while (keep < c.size() && c[keep].p >= threshold) ++keep;
    c.resize(keep);
  }
  softmax(c, o.temperature);
  std::vector<TokenProb> out;
  out.reserve(c.size());
  for (const Candidate& x : c) out.push_back({x.id, x.p});
  return out;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const std::vector<TokenProb> d = distribution(logits, history);
  if (d.empty()) return -1;
  if (greedy() || d.size() == 1) return d.front().id;
  const double r = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  double cum = 0.0;
  for (const TokenProb& t : d) {
    cum += t.p;
    if (r < cum) return t.id;
  }
  return d.back().id;  // rounding left r above the last cumulative sum
}

}  // namespace moeserve::runtime
