#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "kernels/cpu/cpu_kernels.h"

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

// Index of the largest value, ties to the lowest index, NaN counting as -inf
// (the order by_logit below defines). The scan is the SIMD top-k kernel with
// k = 1: microseconds, where a scalar loop over 150k logits took a few
// hundred per token. The kernel ranks NaN below -inf, so when nothing beats
// -inf the answer is the first index, as in by_logit's order.
int32_t arg_max(std::span<const float> l) {
  int32_t best = 0;
  cpu::cpu_kernels().top_k(l.data(), int64_t(l.size()), 1, &best);
  return l[size_t(best)] > -INFINITY ? best : 0;
}

bool by_logit(const Candidate& a, const Candidate& b) {
  return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
}

// The candidates top-p and min-p start from, in by_logit order (NaN counts
// as -inf), each with its probability at temperature 1 over the candidate
// set (over the whole vocabulary when top-k is off). Sorting candidate
// records for all of a 150k vocabulary took most of a millisecond with
// top-k and 30 ms without it, so:
// - top-k: the SIMD heap kernel picks the k (one pass over the logits);
// - no top-k but min-p: only logits within log(min_p) of the largest can
//   survive min-p (and top-p keeps a prefix of the same order), so only
//   those are sorted; the softmax denominator still covers every token;
// - neither: every token, sorted.
std::vector<Candidate> ranked_candidates(std::span<float> l, const SamplerOptions& o) {
  for (float& x : l) x = std::isnan(x) ? -INFINITY : x;
  std::vector<Candidate> c;
  if (o.top_k > 0 && size_t(o.top_k) < l.size()) {
    std::vector<int32_t> ids(size_t(o.top_k));
    cpu::cpu_kernels().top_k(l.data(), int64_t(l.size()), o.top_k, ids.data());
    c.reserve(ids.size());
    for (int32_t id : ids) c.push_back({id, l[size_t(id)], 0.0f});
    softmax(c, 1.0f);
    return c;
  }
  const float max_logit = l.empty() ? -INFINITY : l[size_t(arg_max(l))];
  if (o.min_p > 0.0f && max_logit > -INFINITY && max_logit < INFINITY) {
    // p >= min_p * p_max  <=>  logit >= max + log(min_p); the margin keeps
    // every token rounding could put on either side (min-p itself decides).
    const float cutoff = max_logit + std::log(o.min_p) - 1e-3f * std::max(1.0f, std::abs(max_logit));
    double sum = 0.0;
    for (size_t i = 0; i < l.size(); ++i) {
      sum += std::exp(l[i] - max_logit);
      if (l[i] >= cutoff) c.push_back({int32_t(i), l[i], 0.0f});
    }
    std::sort(c.begin(), c.end(), by_logit);
    for (Candidate& x : c) x.p = float(double(std::exp(x.logit - max_logit)) / sum);
    return c;
  }
  c.resize(l.size());
  for (size_t i = 0; i < l.size(); ++i) c[i] = {int32_t(i), l[i], 0.0f};
  std::sort(c.begin(), c.end(), by_logit);
  softmax(c, 1.0f);
  return c;
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
  const SamplerOptions& o = options_;
  std::vector<Candidate> c = ranked_candidates(l, o);
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

int32_t Sampler::sample_against_draft(std::span<const float> logits, std::span<const int32_t> history,
                                      int32_t draft, bool* accepted) {
  int index = -1;
  const int32_t t = sample_against_drafts(logits, history, std::span<const int32_t>(&draft, 1), &index);
  *accepted = index == 0;
  return t;
}

int32_t Sampler::sample_against_drafts(std::span<const float> logits, std::span<const int32_t> history,
                                       std::span<const int32_t> drafts, int* accepted_index) {
  std::vector<TokenProb> d = distribution(logits, history);
  *accepted_index = -1;
  if (d.empty()) return -1;
  auto index_of = [&](int32_t id) {
    for (size_t i = 0; i < drafts.size(); ++i) {
      if (drafts[i] == id) return int(i);
    }
    return -1;
  };
  if (greedy() || d.size() == 1) {
    *accepted_index = index_of(d.front().id);
    return d.front().id;
  }
  // Each refused draft leaves p without it: the residual max(p - q, 0) of a
  // one-hot q, renormalised by `rest`.
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  double rest = 1.0;
  for (size_t i = 0; i < drafts.size(); ++i) {
    auto it = std::find_if(d.begin(), d.end(), [&](const TokenProb& t) { return t.id == drafts[i]; });
    if (it == d.end() || it->p <= 0.0f) continue;
    const double p = double(it->p);
    if (unit(rng_) * rest < p) {
      *accepted_index = int(i);
      return drafts[i];
    }
    rest -= p;
    it->p = 0.0f;
  }
  const double r = unit(rng_) * rest;
  double cum = 0.0;
  int32_t last = -1;
  for (const TokenProb& t : d) {
    if (t.p <= 0.0f) continue;
    cum += t.p;
    last = t.id;
    if (r < cum) return t.id;
  }
  // Rounding left r above the last sum; or the drafts held all the mass
  // (then one was certain to be kept above, short of rounding).
  if (last >= 0 || drafts.empty()) return last >= 0 ? last : d.front().id;
  *accepted_index = 0;
  return drafts[0];
}

Logprobs logprobs_of(std::span<const float> logits, int32_t chosen, int top_n) {
  Logprobs out;
  if (logits.empty()) return out;
  const cpu::CpuKernels& k = cpu::cpu_kernels();
  // log Z = max + log(sum exp(l - max)). The SIMD softmax leaves
  // p[i] = exp(l[i] - max) / sum, so at the arg-max p = 1 / sum (at least
  // 1 / n: no underflow). A scalar double-precision sum over 150k logits
  // took about a millisecond per token.
  std::vector<float> p(logits.begin(), logits.end());
  const float max_logit = k.softmax(p.data(), int64_t(p.size()));
  const float log_z = max_logit - std::log(p[size_t(arg_max(logits))]);
  if (chosen >= 0 && size_t(chosen) < logits.size()) out.chosen = logits[size_t(chosen)] - log_z;
  const size_t n = std::min(logits.size(), size_t(std::max(top_n, 0)));
  std::vector<int32_t> ids(n);
  if (n > 0) k.top_k(logits.data(), int64_t(logits.size()), int64_t(n), ids.data());
  for (int32_t id : ids) out.top.push_back({id, logits[size_t(id)] - log_z});
  return out;
}

}  // namespace moeserve::runtime
