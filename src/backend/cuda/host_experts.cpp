#include "backend/cuda/host_experts.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <utility>

#include "backend/cuda/cuda_device.h"
#include "core/log.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/host_mailbox.h"
#include "kernels/cuda/moe.h"

namespace moeserve::backend {
namespace {

size_t matrix_bytes(const WeightView& v) { return v.matrix_stride; }
size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

HostExpertStage::~HostExpertStage() {
  if (expert_trace_enabled() && cold_.totals().calls > 0) {
    const ColdPairs::Totals& t = cold_.totals();
    std::fprintf(stderr, "[trace] host stage: %lld layers computed on the CPU, %.1f us (%.1f rows) each\n",
                 (long long)t.calls, 1e6 * t.seconds / double(t.calls), double(t.rows) / double(t.calls));
  }
  if (expert_trace_enabled() && prefetch_totals_.layers > 0) {
    const PrefetchTotals& p = prefetch_totals_;
    std::fprintf(stderr,
                 "[trace] prefetched layers: %lld, %.1f%% of their cold experts copied, the CPU's share done "
                 "before the copy in %lld; of %lld taken, the copy was done at the routing in %lld; a layer "
                 "waited %.1f us for its routing, then %.1f us for the CPU's share\n",
                 (long long)p.layers, 100.0 * double(p.copied) / double(std::max<int64_t>(p.cold, 1)),
                 (long long)p.host_first, (long long)p.taken, (long long)p.copy_done_at_take,
                 1e6 * p.routing_wait_s / double(std::max<int64_t>(p.taken, 1)),
                 1e6 * p.host_share_s / double(std::max<int64_t>(p.taken, 1)));
  }
  if (copier_ != nullptr) copier_->wait();  // its copies are enqueued, the streams sync below
  if (worker_ != nullptr) worker_->wait();  // it posts before it ends: the stream's wait is over
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (post_ != nullptr) cudaFreeHost(post_);
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_), cudaStreamDestroy(copy_stream_);
  for (Pinned* p : {&ids_, &xn_, &y_, &rows_, &expert_ids_, &prefetch_ids_[0], &prefetch_ids_[1]}) {
    if (p->data != nullptr) cudaFreeHost(p->data);
  }
  for (cudaEvent_t e : {inputs_ready_, copies_done_, copies_free_, prefetch_done_[0], prefetch_done_[1],
                        prefetch_free_[0], prefetch_free_[1]}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

// Pinned buffers grow; the streams are idle when they move (a buffer is
// used by one thread at a time: the copier's by the copier, the others by
// the calling thread; each layer's uploads have been waited for by the
// next layer's download event).
Status HostExpertStage::reserve(Pinned& p, size_t bytes) {
  if (p.bytes >= bytes) return Status::ok();
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (copy_stream_ != nullptr) MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
  if (p.data != nullptr) cudaFreeHost(p.data);
  p.data = nullptr;
  p.bytes = 0;
  const size_t grown = std::max(bytes, size_t(64) << 10);
  if (cudaMallocHost(&p.data, grown) != cudaSuccess) {
    cudaGetLastError();
    p.data = nullptr;
    return make_error(StatusCode::kResourceExhausted,
                      "out of pinned host memory: host experts need {:.1f} MiB",
                      double(grown) / double(1 << 20));
  }
  p.bytes = grown;
  return Status::ok();
}

Status HostExpertStage::reserve_device(DeviceMemory& m, size_t bytes, const char* what) {
  if (m.bytes() >= bytes) return Status::ok();
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (copy_stream_ != nullptr) MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
  const size_t grown = std::max(bytes, 2 * m.bytes());
  m.reset();
  MOESERVE_ASSIGN_OR_RETURN(m, device_.allocate(grown, what));
  return Status::ok();
}

Status HostExpertStage::start(const int32_t* selected, const float* xn, int64_t n_tokens, int64_t n_used,
                              int64_t n_embd) {
  MOESERVE_RETURN_IF_ERROR(join_share());  // the last layer's share still reads ids_ and xn_
  n_tokens_ = n_tokens, n_used_ = n_used, n_embd_ = n_embd;
  const size_t id_bytes = size_t(n_tokens * n_used) * sizeof(int32_t);
  const size_t x_bytes = size_t(n_tokens * n_embd) * sizeof(float);
  MOESERVE_RETURN_IF_ERROR(reserve(ids_, id_bytes));
  MOESERVE_RETURN_IF_ERROR(reserve(xn_, x_bytes));
  if (inputs_ready_ == nullptr) {
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
  }
  MOESERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(ids_.data, selected, id_bytes, cudaMemcpyDeviceToHost, stream_));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(xn_.data, xn, x_bytes, cudaMemcpyDeviceToHost, stream_));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(inputs_ready_, stream_));
  return Status::ok();
}

Result<int64_t> HostExpertStage::collect(const ExpertSplit& split, int layer, int64_t decode_rows) {
  MOESERVE_RETURN_IF_ERROR(join());
  const auto t0 = std::chrono::steady_clock::now();
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(inputs_ready_));
  last_routing_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  layer_ = layer;
  const auto* ids = static_cast<const int32_t*>(ids_.data);
  MOESERVE_ASSIGN_OR_RETURN(
      n_host_, cold_.collect(split, layer, {ids, size_t(n_tokens_ * n_used_)}, n_used_, decode_rows));
  return n_host_;
}

void HostExpertStage::plan(const ExpertSplit& split, int64_t n_ff) {
  copy_experts_.clear();
  copied_.assign(size_t(split.n_expert()), 0);
  n_cpu_pairs_ = n_host_;
  const std::vector<int32_t>& experts = cold_.experts();
  if (split.cost() == nullptr || experts.empty()) return;
  std::vector<int32_t>& by_tokens = by_tokens_;  // busiest first, ties to the lower id
  by_tokens.assign(experts.begin(), experts.end());
  std::stable_sort(by_tokens.begin(), by_tokens.end(),
                   [&](int32_t a, int32_t b) { return cold_.tokens(a) > cold_.tokens(b); });
  std::vector<int32_t>& tokens = tokens_;
  tokens.resize(by_tokens.size());
  for (size_t i = 0; i < by_tokens.size(); ++i) tokens[i] = cold_.tokens(by_tokens[i]);
  const int64_t k =
      split.cost()->experts_to_copy(tokens, split.host_expert_bytes(), 6.0 * double(n_embd_) * double(n_ff));
  for (int64_t i = 0; i < k; ++i)
    copied_[size_t(by_tokens[size_t(i)])] = 1, n_cpu_pairs_ -= tokens[size_t(i)];
  for (int32_t e : experts) {
    if (copied_[size_t(e)]) copy_experts_.push_back(e);
  }
  // The per-layer decision, for MOESERVE_LOG=debug (a line per split layer of each chunk).
  MOESERVE_LOG_DEBUG(
      "experts, {} rows: layer {}'s {} cold ({} selections): {} copied to the GPU, {} on the CPU "
      "(PCIe {:.1f} GB/s, CPU {:.0f} GFLOP/s)",
      n_tokens_, layer_, experts.size(), n_host_, k, int64_t(experts.size()) - k,
      split.cost()->inputs().pcie_bytes_per_s / 1e9, split.cost()->inputs().cpu_flops_per_s / 1e9);
}

// The caller has reserved y_ and rows_ for n_cpu_pairs_ rows.
Status HostExpertStage::compute_rows(const ExpertSplit& split, int layer, int64_t n_ff) {
  ColdPairs::ComputeArgs c;
  c.layer = layer, c.n_embd = n_embd_, c.n_ff = n_ff;
  c.xn = static_cast<const float*>(xn_.data);
  c.skip = copied_.empty() ? nullptr : copied_.data();
  c.out = static_cast<float*>(y_.data), c.rows = static_cast<int32_t*>(rows_.data);
  // A chunk's cold experts from an unpinned mapping (the file could not be
  // pinned, or --no-pin): the kernel asks for them while it sets up.
  const WeightView* gate = split.host_view(WeightUse::kExpertGate);
  c.will_need = n_tokens_ > 1 && gate != nullptr &&
                !device_.host_memory_pinned(gate->data, gate->matrix_stride * size_t(split.n_expert()));
  MOESERVE_ASSIGN_OR_RETURN(const int64_t n, cold_.compute(split, c));
  if (n != n_cpu_pairs_) {
    return make_error(StatusCode::kInternal, "host experts: {} rows computed of {}", n, n_cpu_pairs_);
  }
  return Status::ok();
}

Status HostExpertStage::compute_on_host(const ExpertSplit& split, int layer, int64_t n_ff, float* y) {
  if (n_cpu_pairs_ == 0) return Status::ok();  // every selection was local or copied: nothing crosses back
  const int64_t H = n_embd_, n_cpu = n_cpu_pairs_;
  MOESERVE_RETURN_IF_ERROR(reserve(y_, size_t(n_cpu * H) * sizeof(float)));
  MOESERVE_RETURN_IF_ERROR(reserve(rows_, size_t(n_cpu) * sizeof(int32_t)));
  auto* rows = static_cast<int32_t*>(rows_.data);
  auto* out = static_cast<float*>(y_.data);
  MOESERVE_RETURN_IF_ERROR(compute_rows(split, layer, n_ff));
  // The scatter reads the rows from pinned memory itself where kernels can:
  // an upload would queue on the copy engine behind the next layer's
  // expert copies (measured: the whole prefetch, 4.7 ms a layer).
  if (device_.reads_pinned_host_memory()) return cuda::scatter_rows({y, out, rows, n_cpu, H}, stream_);
  const size_t y_bytes = size_t(n_cpu * H) * sizeof(float), r_bytes = size_t(n_cpu) * sizeof(int32_t);
  MOESERVE_RETURN_IF_ERROR(reserve_device(device_y_, y_bytes + r_bytes, "workspace (host experts)"));
  auto* dy = device_y_.as<float>();
  auto* drows = reinterpret_cast<int32_t*>(device_y_.as<uint8_t>() + y_bytes);
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dy, out, y_bytes, cudaMemcpyHostToDevice, stream_));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(drows, rows, r_bytes, cudaMemcpyHostToDevice, stream_));
  return cuda::scatter_rows({y, dy, drows, n_cpu, H}, stream_);
}

Status HostExpertStage::ensure_copy_stream() {
  if (copy_stream_ != nullptr) return Status::ok();
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copies_done_, cudaEventDisableTiming));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&copies_free_, cudaEventDisableTiming));
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_free_, stream_));
  return Status::ok();
}

// Runs of consecutive expert ids are one copy per stack (a whole layer's
// cold experts, as in --n-cpu-moe, are three copies).
Result<HostExpertStage::Copied> HostExpertStage::copy_experts(const ExpertSplit& split,
                                                              const std::vector<int32_t>& experts,
                                                              DeviceMemory& buffer, Pinned& ids) {
  const WeightView *g = split.host_view(WeightUse::kExpertGate), *u = split.host_view(WeightUse::kExpertUp),
                   *d = split.host_view(WeightUse::kExpertDown);
  if (g == nullptr || u == nullptr || d == nullptr) {
    return make_error(StatusCode::kInternal, "experts placed off the device, but no host copy to copy from");
  }
  const size_t n = experts.size(), mg = matrix_bytes(*g), mu = matrix_bytes(*u), md = matrix_bytes(*d);
  const size_t off_u = align_up(n * mg), off_d = off_u + align_up(n * mu), off_ids = off_d + align_up(n * md);
  MOESERVE_RETURN_IF_ERROR(
      reserve_device(buffer, off_ids + n * sizeof(int32_t), "workspace (copied experts)"));
  MOESERVE_RETURN_IF_ERROR(reserve(ids, n * sizeof(int32_t)));
  uint8_t* base = buffer.as<uint8_t>();
  const std::pair<const WeightView*, size_t> stacks[] = {{g, 0}, {u, off_u}, {d, off_d}};
  batch_dst_.clear(), batch_src_.clear(), batch_size_.clear();
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && experts[j] == experts[j - 1] + 1) ++j;
    for (const auto& [v, off] : stacks) {
      const size_t m = matrix_bytes(*v);
      batch_dst_.push_back(base + off + i * m);
      batch_src_.push_back(v->data + size_t(experts[i]) * m);
      batch_size_.push_back((j - i) * m);
    }
    i = j;
  }
  MOESERVE_RETURN_IF_ERROR(enqueue_copies());
  std::memcpy(ids.data, experts.data(), n * sizeof(int32_t));
  MOESERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(base + off_ids, ids.data, n * sizeof(int32_t), cudaMemcpyHostToDevice, copy_stream_));
  Copied c;
  c.gate = *g, c.up = *u, c.down = *d;
  c.gate.data = base, c.up.data = base + off_u, c.down.data = base + off_d;
  c.ids = reinterpret_cast<const int32_t*>(base + off_ids);
  c.n = int64_t(n);
  return c;
}

// One call for all of them where the runtime has it (CUDA 13): on the H200
// host a layer's ~100 scattered copies (a statistics placement's cold
// experts) then crossed PCIe 9% faster (pp512 3,118 -> 3,400), whole-layer
// copies 2-3% faster. MOESERVE_COPY_BATCH=0 issues them one by one.
Status HostExpertStage::enqueue_copies() {
  bool pinned = true;
  for (size_t i = 0; i < batch_src_.size() && pinned; ++i)
    pinned = device_.host_memory_pinned(batch_src_[i], batch_size_[i]);
  if (!pinned) return enqueue_staged_copies();
#if CUDART_VERSION >= 13000
  static const bool batch = [] {
    const char* v = std::getenv("MOESERVE_COPY_BATCH");
    return v == nullptr || std::string(v) != "0";
  }();
  if (batch && batch_works_ && !batch_dst_.empty()) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
    if (cudaMemcpyBatchAsync(batch_dst_.data(), batch_src_.data(), batch_size_.data(), batch_dst_.size(),
                             &attr, &attr_index, 1, copy_stream_) == cudaSuccess) {
      return Status::ok();
    }
    // A driver that refuses it (none seen so far): the copies go one by one,
    // now and from then on (copying a piece twice does no harm).
    cudaGetLastError();
    batch_works_ = false;
  }
#endif
  for (size_t i = 0; i < batch_dst_.size(); ++i) {
    MOESERVE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(batch_dst_[i], batch_src_[i], batch_size_[i], cudaMemcpyHostToDevice, copy_stream_));
  }
  return Status::ok();
}

// The file is not pinned (pinning failed, or --no-pin): the CPU copies
// each piece into one of two pinned buffers while the copy engine moves
// the other's to the GPU, in the copy stream's order.
Status HostExpertStage::enqueue_staged_copies() {
  MOESERVE_RETURN_IF_ERROR(staging_.init(copy_stream_));
  for (size_t i = 0; i < batch_dst_.size(); ++i) {
    MOESERVE_RETURN_IF_ERROR(staging_.copy(static_cast<uint8_t*>(batch_dst_[i]),
                                           static_cast<const uint8_t*>(batch_src_[i]), batch_size_[i]));
  }
  return staging_.flush();
}

Status HostExpertStage::copy_to_device(const ExpertSplit& split) {
  MOESERVE_RETURN_IF_ERROR(ensure_copy_stream());
  split.copied_pairs += n_host_ - n_cpu_pairs_;
  return on_copier(split, [this, &split]() -> Status {
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, copies_free_, 0));
    MOESERVE_ASSIGN_OR_RETURN(copies_view_, copy_experts(split, copy_experts_, copies_, expert_ids_));
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_done_, copy_stream_));
    return Status::ok();
  });
}

// Copies from the pinned file are enqueued at once (the copy engine reads
// it itself). From an unpinned one the CPU stages every byte first: that
// runs on the copier thread, so this one goes on (the CPU's own experts,
// the next layer's kernels); whatever reads what the job makes (the views,
// the events it records) joins it first (join_copier).
Status HostExpertStage::on_copier(const ExpertSplit& split, std::function<Status()> job) {
  const WeightView* gate = split.host_view(WeightUse::kExpertGate);
  const bool pinned = gate == nullptr ||
                      device_.host_memory_pinned(gate->data, gate->matrix_stride * size_t(split.n_expert()));
  if (pinned && copier_ == nullptr) return job();
  if (copier_ == nullptr) copier_ = std::make_unique<SerialWorker>();
  copier_->run([this, job = std::move(job)] {
    Status s = device_.activate();
    if (s.is_ok()) s = job();
    if (!s.is_ok() && copier_status_.is_ok()) copier_status_ = std::move(s);
  });
  return Status::ok();
}

Status HostExpertStage::join_copier() {
  if (copier_ == nullptr) return Status::ok();
  copier_->wait();
  return std::exchange(copier_status_, Status::ok());
}

bool HostExpertStage::copies_most(const ExpertSplit& split) const {
  const size_t n_cold = size_t(split.n_expert()) - split.local().size();
  return n_tokens_ > 1 && 4 * copy_experts_.size() >= 3 * n_cold && n_cold > 0;
}

void HostExpertStage::choose_prefetch(const ExpertSplit& next, int64_t n_ff, std::vector<int32_t>& copy) {
  all_cold_.clear();
  for (int32_t e = 0; e < int32_t(next.n_expert()); ++e) {
    if (!next.is_local(e)) all_cold_.push_back(e);
  }
  double share = 0.0;
  if (next.cost() != nullptr && !all_cold_.empty()) {
    const double expected = double(n_tokens_ * n_used_) / double(next.n_expert());
    share = next.cost()->prefetch_host_share(expected, next.host_expert_bytes(),
                                             6.0 * double(n_embd_) * double(n_ff));
  }
  const auto n_host = size_t(share * double(all_cold_.size()) + 0.5);
  MOESERVE_LOG_DEBUG("experts, {} rows: the next layer's {} cold prefetched, {} of them left to the CPU",
                     n_tokens_, all_cold_.size(), n_host);
  if (n_host == 0) {
    copy = all_cold_;
    return;
  }
  cold_selections_.resize(all_cold_.size());
  for (size_t i = 0; i < all_cold_.size(); ++i) cold_selections_[i] = next.selections(all_cold_[i]);
  const std::vector<int32_t> host = prefetch_host_experts(all_cold_, cold_selections_, n_host);
  copy.clear();
  std::set_difference(all_cold_.begin(), all_cold_.end(), host.begin(), host.end(), std::back_inserter(copy));
}

Status HostExpertStage::prefetch(const ExpertSplit& next, int64_t n_ff) {
  if (prefetched(next) || next.all_local()) return Status::ok();
  MOESERVE_RETURN_IF_ERROR(ensure_copy_stream());
  const int b = next_prefetch_;
  for (int i = 0; i < 2; ++i) {
    if (prefetch_done_[i] == nullptr) {
      MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&prefetch_done_[i], cudaEventDisableTiming));
      MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&prefetch_free_[i], cudaEventDisableTiming));
      MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(prefetch_free_[i], stream_));
    }
  }
  choose_prefetch(next, n_ff, prefetch_copied_[b]);
  if (prefetch_copied_[b].empty()) return Status::ok();  // the CPU takes them all: the layer plans
  prefetch_shared_[b] = prefetch_copied_[b].size() < all_cold_.size();
  prefetch_totals_.layers += 1, prefetch_totals_.cold += int64_t(all_cold_.size());
  prefetch_totals_.copied += int64_t(prefetch_copied_[b].size());
  MOESERVE_RETURN_IF_ERROR(on_copier(next, [this, &next, b]() -> Status {
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, prefetch_free_[b], 0));
    MOESERVE_ASSIGN_OR_RETURN(prefetch_views_[b],
                              copy_experts(next, prefetch_copied_[b], prefetch_[b], prefetch_ids_[b]));
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(prefetch_done_[b], copy_stream_));
    return Status::ok();
  }));
  prefetched_[b] = &next;
  next_prefetch_ = 1 - b;
  return Status::ok();
}

Result<HostExpertStage::Copied> HostExpertStage::take_prefetch(const ExpertSplit& split) {
  const int b = prefetched_[0] == &split ? 0 : 1;
  MOESERVE_RETURN_IF_ERROR(join_copier());  // it has recorded prefetch_done_[b]
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, prefetch_done_[b], 0));
  if (expert_trace_enabled()) {
    prefetch_totals_.taken += 1, prefetch_totals_.routing_wait_s += last_routing_wait_s_;
    prefetch_totals_.copy_done_at_take += cudaEventQuery(prefetch_done_[b]) == cudaSuccess ? 1 : 0;
    taken_at_ = std::chrono::steady_clock::now();
  }
  copied_.assign(size_t(split.n_expert()), 0);
  int64_t copied_pairs = 0;
  for (int32_t e : prefetch_copied_[b]) copied_[size_t(e)] = 1, copied_pairs += cold_.tokens(e);
  split.copied_pairs += copied_pairs;
  n_cpu_pairs_ = n_host_ - copied_pairs;
  return prefetch_views_[b];
}

// Whether the copy of the rest was still running when the CPU's share was
// done says which side the next layer's share should favour.
void HostExpertStage::observe_prefetch(const ExpertSplit& split, int b) {
  if (expert_trace_enabled()) {
    prefetch_totals_.host_share_s +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - taken_at_).count();
  }
  if (!prefetch_shared_[b] || split.cost() == nullptr) return;
  const bool copying = cudaEventQuery(prefetch_done_[b]) == cudaErrorNotReady;
  split.cost()->observe_prefetch(copying);
  prefetch_totals_.host_first += copying ? 1 : 0;
}

Status HostExpertStage::start_share(const ExpertSplit& split, int layer, int64_t n_ff, float* y) {
  const int b = prefetched_[0] == &split ? 0 : 1;
  if (n_cpu_pairs_ == 0 || !device_.reads_pinned_host_memory()) {
    MOESERVE_RETURN_IF_ERROR(compute_on_host(split, layer, n_ff, y));
    observe_prefetch(split, b);
    return Status::ok();
  }
  const int64_t H = n_embd_, n_cpu = n_cpu_pairs_;
  MOESERVE_RETURN_IF_ERROR(reserve(y_, size_t(n_cpu * H) * sizeof(float)));
  MOESERVE_RETURN_IF_ERROR(reserve(rows_, size_t(n_cpu) * sizeof(int32_t)));
  if (post_ == nullptr) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, sizeof(PostWords), cudaHostAllocMapped) != cudaSuccess) {
      cudaGetLastError();
      return make_error(StatusCode::kResourceExhausted,
                        "out of pinned host memory (host experts' post words)");
    }
    post_ = static_cast<PostWords*>(p);
    post_->posted = 0, post_->timed_out = 0;
    void* dev = nullptr;
    MOESERVE_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&dev, p, 0));
    post_dev_ = static_cast<PostWords*>(dev);
  }
  if (worker_ == nullptr) worker_ = std::make_unique<SerialWorker>();
  const uint32_t number = ++shares_ == 0 ? ++shares_ : shares_;
  cuda::HostWaitArgs w;
  w.word = &post_dev_->posted, w.value = number, w.timed_out = &post_dev_->timed_out;
  MOESERVE_RETURN_IF_ERROR(cuda::wait_for_host(w, stream_));
  MOESERVE_RETURN_IF_ERROR(cuda::scatter_rows(
      {y, static_cast<const float*>(y_.data), static_cast<const int32_t*>(rows_.data), n_cpu, H}, stream_));
  // Posted whatever happens: the stream must not wait for ever.
  worker_->run([this, &split, layer, n_ff, b, number] {
    share_status_ = compute_rows(split, layer, n_ff);
    if (share_status_.is_ok()) observe_prefetch(split, b);
    std::atomic_ref<uint32_t>(post_->posted).store(number, std::memory_order_release);
  });
  return Status::ok();
}

Status HostExpertStage::join() {
  Status copier = join_copier();
  Status share = join_share();
  return share.is_ok() ? copier : share;
}

Status HostExpertStage::join_share() {
  if (worker_ == nullptr) return Status::ok();
  worker_->wait();
  volatile uint32_t& timed_out = post_->timed_out;
  if (timed_out != 0) {
    timed_out = 0;
    return make_error(
        StatusCode::kInternal,
        "the GPU gave up waiting for the CPU's experts of a prefill layer; the forward's output is "
        "not valid");
  }
  return std::exchange(share_status_, Status::ok());
}

Status HostExpertStage::prefetch_used(const ExpertSplit& split) {
  const int b = prefetched_[0] == &split ? 0 : 1;
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(prefetch_free_[b], stream_));
  prefetched_[b] = nullptr;
  return Status::ok();
}

Result<HostExpertStage::Copied> HostExpertStage::wait_copies() {
  MOESERVE_RETURN_IF_ERROR(join_copier());  // it has recorded copies_done_
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, copies_done_, 0));
  return copies_view_;
}

Status HostExpertStage::copies_used() {
  MOESERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(copies_free_, stream_));
  return Status::ok();
}

}  // namespace moeserve::backend
