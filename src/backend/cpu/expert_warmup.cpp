// CpuExpertBackend::warm (backend/expert_compute.h's ExpertWarmup): guess
// the next layer's cold experts from its router and this layer's input,
// then read their weights into the caches, in pieces the pool's threads
// share, until the real selections arrive.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "backend/cpu/expert_backend.h"

namespace moeserve::backend {
namespace {

// Bytes one pool task reads: small enough that a stop is seen within a few
// microseconds, large enough that the hardware prefetchers get going.
constexpr size_t kWarmPiece = size_t(64) << 10;

float dot(const float* a, const float* b, int64_t n) {
  float s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  }
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// One load per cache line; the sum keeps the loads from being dropped.
uint64_t touch(const uint8_t* p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i += 64) {
    uint64_t v;
    std::memcpy(&v, p + i, sizeof v);
    sum += v;
  }
  return sum;
}

}  // namespace

std::vector<int32_t> choose_warm_experts(std::span<const float> score, const uint8_t* candidate,
                                         int max_experts) {
  std::vector<int32_t> ids;
  for (int32_t e = 0; e < int32_t(score.size()); ++e) {
    if ((candidate == nullptr || candidate[e] != 0) && std::isfinite(score[size_t(e)])) ids.push_back(e);
  }
  const size_t k = std::min(ids.size(), size_t(std::max(max_experts, 0)));
  // Larger first, ties to the lower id (as the routing's top-k).
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), [&](int32_t a, int32_t b) {
    return score[size_t(a)] > score[size_t(b)] || (score[size_t(a)] == score[size_t(b)] && a < b);
  });
  ids.resize(k);
  return ids;
}

void CpuExpertBackend::warm(const ExpertWarmup& w) {
  if (w.max_experts <= 0 || w.router == nullptr || w.x == nullptr || w.n_embd <= 0 || w.n_expert <= 0 ||
      w.gate == nullptr || w.up == nullptr || w.down == nullptr) {
    return;
  }
  warm_score_.resize(size_t(w.n_expert));
  auto score_rows = [&](int64_t begin, int64_t end, int) {
    for (int64_t e = begin; e < end; ++e) {
      const float logit = dot(w.router + e * w.n_embd, w.x, w.n_embd);
      warm_score_[size_t(e)] = w.bias == nullptr ? logit : 1.0f / (1.0f + std::exp(-logit)) + w.bias[e];
    }
  };
  if (pool_ != nullptr) {
    pool_->parallel_for(w.n_expert, score_rows);
  } else {
    score_rows(0, w.n_expert, 0);
  }
  const std::vector<int32_t> ids = choose_warm_experts(warm_score_, w.candidate, w.max_experts);
  if (w.chosen != nullptr) *w.chosen = ids;
  // Pieces of every guessed expert's three matrices, the likeliest first.
  warm_pieces_.clear();
  for (int32_t e : ids) {
    for (const WeightView* v : {w.gate, w.up, w.down}) {
      for (size_t off = 0; off < v->matrix_stride; off += kWarmPiece) {
        warm_pieces_.push_back({v->matrix(e) + off, std::min(kWarmPiece, v->matrix_stride - off)});
      }
    }
  }
  std::atomic<bool> stopped{false};
  std::atomic<uint64_t> sink{0};
  auto read_piece = [&](int64_t i, int) {
    if (stopped.load(std::memory_order_relaxed)) return;
    if (w.stop && w.stop()) {
      stopped.store(true, std::memory_order_relaxed);
      return;
    }
    sink.fetch_add(touch(warm_pieces_[size_t(i)].data, warm_pieces_[size_t(i)].bytes),
                   std::memory_order_relaxed);
  };
  if (pool_ != nullptr) {
    pool_->run(int64_t(warm_pieces_.size()), read_piece);
  } else {
    for (size_t i = 0; i < warm_pieces_.size(); ++i) read_piece(int64_t(i), 0);
  }
  warm_sink_ += sink.load(std::memory_order_relaxed);
}

}  // namespace moeserve::backend
