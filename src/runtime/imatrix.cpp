#include "runtime/imatrix.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backend/activation_observer.h"
#include "runtime/generator.h"

namespace moeserve::runtime {
namespace {

// One weight's sums while the chunks run (double: millions of rows).
struct WeightSums {
  std::string name;
  int64_t n_cols = 0, n_mat = 1;
  std::vector<double> sum2;     // [n_mat][n_cols]
  std::vector<int64_t> counts;  // [n_mat]
};

class ImatrixCollector final : public backend::ActivationObserver {
 public:
  // Every layer weight of the file that a product could use, by its bytes.
  explicit ImatrixCollector(const GgufFile& file) {
    for (const GgufTensorInfo& t : file.tensors()) {
      if (!t.name.starts_with("blk.") || !t.name.ends_with(".weight") || t.n_dims < 2) continue;
      WeightSums& w = by_data_[t.data];
      w.name = t.name;
      w.n_cols = t.ne[0];
      w.n_mat = t.n_dims >= 3 ? t.ne[2] : 1;
      w.sum2.assign(size_t(w.n_cols * w.n_mat), 0.0);
      w.counts.assign(size_t(w.n_mat), 0);
    }
  }

  void observe(const WeightView& view, int64_t matrix, const float* x, int64_t n_rows) override {
    const auto it = by_data_.find(view.data);
    if (it == by_data_.end()) return;  // not a layer weight (the output head, a copy)
    WeightSums& w = it->second;
    if (view.n_cols != w.n_cols || matrix < 0 || matrix >= w.n_mat) return;
    std::lock_guard lock(mutex_);
    double* sum2 = w.sum2.data() + matrix * w.n_cols;
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* row = x + r * w.n_cols;
      for (int64_t j = 0; j < w.n_cols; ++j) sum2[j] += double(row[j]) * row[j];
    }
    w.counts[size_t(matrix)] += n_rows;
  }

  // The weights that saw any rows, as imatrix entries.
  void add_entries(Imatrix* m) const {
    for (const auto& [data, w] : by_data_) {
      if (std::all_of(w.counts.begin(), w.counts.end(), [](int64_t c) { return c == 0; })) continue;
      ImatrixEntry e{.n_cols = w.n_cols,
                     .n_mat = w.n_mat,
                     .in_sum2 = std::vector<float>(w.sum2.begin(), w.sum2.end()),
                     .counts = std::vector<float>(w.counts.begin(), w.counts.end())};
      m->entries.emplace(w.name, std::move(e));
    }
  }

 private:
  std::unordered_map<const uint8_t*, WeightSums> by_data_;
  std::mutex mutex_;
};

// Installs the observer for the ops made while it lives.
class ObserverScope {
 public:
  ObserverScope(backend::CpuDevice& cpu, backend::ActivationObserver* o) : cpu_(cpu) {
    cpu_.set_activation_observer(o);
  }
  ~ObserverScope() { cpu_.set_activation_observer(nullptr); }
  ObserverScope(const ObserverScope&) = delete;
  ObserverScope& operator=(const ObserverScope&) = delete;

 private:
  backend::CpuDevice& cpu_;
};

Status check_model(Model& model) {
  for (backend::Device* d : model.devices()) {
    if (d->kind() != backend::DeviceKind::kCpu) {
      return make_error(StatusCode::kUnsupported,
                        "imatrix runs on the CPU only (the model is on {}): use --device cpu", d->name());
    }
  }
  if (model.packed().tensors > 0) {
    return make_error(
        StatusCode::kUnsupported,
        "imatrix needs the weights in place: load the model without packing (pack_weights off)");
  }
  return Status::ok();
}

}  // namespace

Result<Imatrix> collect_imatrix(Model& model, std::span<const int32_t> tokens, const ImatrixOptions& o,
                                const ImatrixProgress& progress) {
  MOESERVE_RETURN_IF_ERROR(check_model(model));
  const int64_t n_ctx = o.n_ctx;
  if (n_ctx < 2)
    return make_error(StatusCode::kInvalidArgument, "imatrix: a context of {} tokens is too small", n_ctx);
  if (int64_t(tokens.size()) < n_ctx) {
    return make_error(
        StatusCode::kInvalidArgument,
        "the text has {} tokens; imatrix with a context of {} needs at least {} (use a longer text or "
        "a smaller --ctx-size)",
        tokens.size(), n_ctx, n_ctx);
  }
  int64_t n_chunks = int64_t(tokens.size()) / n_ctx;
  if (o.max_chunks > 0) n_chunks = std::min(n_chunks, o.max_chunks);
  ImatrixCollector collector(model.file());
  const ObserverScope scope(model.cpu_device(), &collector);
  Generator gen(model, n_ctx);  // its workspace's ops see the collector
  MOESERVE_RETURN_IF_ERROR(gen.status());
  const std::optional<int32_t> bos =
      model.tokenizer().add_bos() ? model.tokenizer().bos_id() : std::optional<int32_t>();
  std::vector<int32_t> chunk(size_t(n_ctx), 0);
  for (int64_t c = 0; c < n_chunks; ++c) {
    const std::span<const int32_t> orig = tokens.subspan(size_t(c * n_ctx), size_t(n_ctx));
    std::copy(orig.begin(), orig.end(), chunk.begin());
    if (bos) chunk[0] = *bos;
    gen.sequence().clear();
    MOESERVE_RETURN_IF_ERROR(gen.prefill(chunk, std::max<int64_t>(o.n_batch, 1), {}));
    if (progress) progress(c, n_chunks);
  }
  Imatrix m;
  collector.add_entries(&m);
  m.chunk_count = uint32_t(n_chunks);
  m.chunk_size = uint32_t(n_ctx);
  if (!o.dataset.empty()) m.datasets.push_back(o.dataset);
  return m;
}

}  // namespace moeserve::runtime
