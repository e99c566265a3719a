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

void choose_warm_experts(const cpu::CpuKernels& k, std::span<float> score, const uint64_t* local_bits,
                         int max_experts, std::vector<int32_t>& out) {
  const auto n = int64_t(score.size());
  for (int64_t e = 0; e < n; ++e) {
    const bool local = local_bits != nullptr && ((local_bits[e >> 6] >> (e & 63)) & 1u) != 0;
    if (local || !std::isfinite(score[size_t(e)])) score[size_t(e)] = -INFINITY;
  }
  out.resize(size_t(std::max(max_experts, 0)));
  if (!out.empty()) k.top_k(score.data(), n, int64_t(out.size()), out.data());
  // Fewer candidates than asked: the rest came back as -1 or an excluded -inf.
  std::erase_if(out, [&](int32_t e) { return e < 0 || score[size_t(e)] == -INFINITY; });
}

void CpuExpertBackend::warm(const ExpertWarmup& w) {
  if (w.max_experts <= 0 || w.router == nullptr || w.x == nullptr || w.n_embd <= 0 || w.n_expert <= 0 ||
      w.gate == nullptr || w.up == nullptr || w.down == nullptr) {
    return;
  }
  const cpu::CpuKernels& k = kernels_ != nullptr ? *kernels_ : cpu::cpu_kernels();
  const cpu::VecDotFn dot = k.vec_dot[dtype_slot(DType::F32)];
  warm_score_.resize(size_t(w.n_expert));
  auto score_rows = [&](int64_t begin, int64_t end, int) {
    for (int64_t e = begin; e < end; ++e) {
      const float logit = dot(w.n_embd, w.router + e * w.n_embd, w.x);
      warm_score_[size_t(e)] = w.bias == nullptr ? logit : 1.0f / (1.0f + std::exp(-logit)) + w.bias[e];
    }
  };
  if (pool_ != nullptr) {
    pool_->parallel_for(w.n_expert, score_rows);
  } else {
    score_rows(0, w.n_expert, 0);
  }
  choose_warm_experts(k, warm_score_, w.local_bits, w.max_experts, warm_ids_);
  if (w.chosen != nullptr) *w.chosen = warm_ids_;
  // Pieces of every guessed expert's three matrices, the likeliest first.
  warm_pieces_.clear();
  for (int32_t e : warm_ids_) {
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
