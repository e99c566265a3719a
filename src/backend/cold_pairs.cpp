#include "backend/cold_pairs.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/mapped_file.h"

namespace moeserve::backend {
bool expert_trace_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESERVE_EXPERT_TRACE");
    return v != nullptr && std::string(v) != "0";
  }();
  return on;
}

Result<int64_t> ColdPairs::collect(const ExpertSplit& split, int layer, std::span<const int32_t> ids,
                                   int64_t n_used, int64_t decode_rows) {
  const int64_t E = split.n_expert();
  if (n_used < 1 || int64_t(ids.size()) % n_used != 0) {
    return make_error(StatusCode::kInternal, "layer {}: {} selections for {} per token", layer, ids.size(),
                      n_used);
  }
  ids_ = ids;
  n_used_ = n_used;
  n_tokens_ = int64_t(ids.size()) / n_used;
  count_.assign(size_t(E) + 1, 0);
  n_host_ = 0;
  for (size_t p = 0; p < ids.size(); ++p) {
    const int32_t e = ids[p];
    if (e < 0 || e >= E)
      return make_error(StatusCode::kInternal, "layer {}: routed to expert {} of {}", layer, e, E);
    split.count_pair(e, int64_t(p) / n_used < decode_rows);
    if (!split.is_local(e)) count_[size_t(e) + 1] += 1, n_host_ += 1;
  }
  experts_.clear();
  for (int64_t e = 0; e < E; ++e) {
    if (count_[size_t(e) + 1] > 0) experts_.push_back(int32_t(e));
  }
  split.cold_experts_seen += int64_t(experts_.size());
  return n_host_;
}

Result<int64_t> ColdPairs::compute(const ExpertSplit& split, const ComputeArgs& a) {
  const int64_t E = split.n_expert(), H = a.n_embd;
  auto skipped = [&](int32_t e) { return a.skip != nullptr && a.skip[e] != 0; };
  // Each computed expert's first output row: exclusive prefix sums of their counts.
  begin_.assign(size_t(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e)
    begin_[size_t(e) + 1] = begin_[size_t(e)] + (skipped(int32_t(e)) ? 0 : count_[size_t(e) + 1]);
  const int64_t n = begin_[size_t(E)];
  if (n == 0) return int64_t(0);
  next_.assign(begin_.begin(), begin_.end() - 1);
  for (int64_t p = 0; p < int64_t(ids_.size()); ++p) {
    const int32_t e = ids_[size_t(p)];
    if (!split.is_local(e) && !skipped(e)) a.rows[next_[size_t(e)]++] = int32_t(p);
  }
  computed_.clear();
  for (const int32_t e : experts_) {
    if (!skipped(e)) computed_.push_back(e);
  }
  // The kernel starts reading the experts in while the rows are gathered.
  for (WeightUse use : {WeightUse::kExpertGate, WeightUse::kExpertUp, WeightUse::kExpertDown}) {
    const WeightView* v = a.will_need ? split.host_view(use) : nullptr;
    for (size_t i = 0; v != nullptr && i < computed_.size(); ++i)
      MappedFile::will_need({v->matrix(computed_[i]), v->matrix_stride});
  }
  // One job per expert; one token reads its row in place, a chunk's rows
  // are gathered next to their expert's others.
  const bool gather = n_tokens_ > 1;
  if (gather) gathered_.resize(size_t(n * H));
  for (int64_t i = 0; gather && i < n; ++i) {
    std::memcpy(gathered_.data() + i * H, a.xn + (a.rows[i] / n_used_) * H, size_t(H) * sizeof(float));
  }
  jobs_.clear();
  for (const int32_t e : computed_) {
    const int32_t b = begin_[size_t(e)], rows = begin_[size_t(e) + 1] - b;
    jobs_.push_back({e, gather ? gathered_.data() + int64_t(b) * H : a.xn, rows, a.out + int64_t(b) * H});
  }
  const auto t0 = std::chrono::steady_clock::now();
  MOESERVE_RETURN_IF_ERROR(split.compute_on_host(a.layer, H, a.n_ff, jobs_));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  totals_.calls += 1, totals_.rows += n, totals_.seconds += s;
  if (split.cost() != nullptr) {
    split.cost()->observe_host(double(computed_.size()) * split.host_expert_bytes(),
                               6.0 * double(H) * double(a.n_ff) * double(n), s, n, int64_t(computed_.size()));
  }
  return n;
}

}  // namespace moeserve::backend
