#include "convert/quantize_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/model_keys.h"
#include "tensor/quantize.h"

namespace moeserve::convert {

namespace {

// Elements converted per task: big enough to amortise dispatch, small enough
// for the f32 scratch to stay in cache and the progress bar to move.
constexpr int64_t kElementsPerTask = 1 << 16;

std::string mib(uint64_t bytes) { return fmt::format("{:.2f} MiB", double(bytes) / (1024.0 * 1024.0)); }

// Rows [begin, end) of the job from f32 `src` into `dst`, each with its
// matrix's importance when the job has one.
void quantize_chunk(const RowFillJob& job, const float* src, uint8_t* dst, int64_t begin, int64_t end) {
  if (job.importance == nullptr) {
    quantize_rows(job.out_type, src, dst, end - begin, job.row_len);
    return;
  }
  const size_t row_bytes = dtype_row_bytes(job.out_type, job.row_len);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t m = r / job.rows_per_matrix;
    const float* x = src + (r - begin) * job.row_len;
    uint8_t* out = dst + size_t(r - begin) * row_bytes;
    if (job.importance->present[size_t(m)] != 0) {
      quantize_rows_weighted(job.out_type, x, out, 1, job.row_len,
                             job.importance->values.data() + m * job.row_len);
    } else {
      quantize_rows(job.out_type, x, out, 1, job.row_len);
    }
  }
}

// Matrices a tensor stacks (experts: ne[2]), each of ne[1] rows.
int64_t tensor_matrices(const GgufTensorInfo& t) { return t.ne[2] * t.ne[3]; }

// Whether tensor t, written as out_type, is quantized with the imatrix:
// false when it has no entry (counted as missing), an error when the entry
// does not fit the tensor.
Result<bool> uses_imatrix(const QuantizeOptions& o, const GgufTensorInfo& t, DType out_type,
                          QuantizeSummary* s) {
  if (o.imatrix == nullptr || out_type == t.type || !dtype_has_weighted_quantizer(out_type)) return false;
  // The embedding's rows are looked up, never multiplied: no imatrix has
  // it, so its absence is no news.
  if (t.name == keys::kTokenEmbd && !o.imatrix->entries.contains(t.name)) return false;
  auto imp = tensor_importance(*o.imatrix, t.name, t.ne[0], tensor_matrices(t));
  if (imp.is_ok()) {
    s->imatrix_used += 1;
    return true;
  }
  if (imp.status().code() != StatusCode::kNotFound) {
    return make_error(imp.status().code(), "--imatrix {}: {}", o.imatrix_name, imp.status().message());
  }
  if (s->imatrix_missing++ == 0) s->first_missing = t.name;
  return false;
}

}  // namespace

Status fill_rows_parallel(const RowFillJob& job, std::span<uint8_t> out, ThreadPool& pool,
                          Progress* progress) {
  const size_t out_row_bytes = dtype_row_bytes(job.out_type, job.row_len);
  if (out.size() != out_row_bytes * size_t(job.n_rows)) {
    return make_error(StatusCode::kInternal, "fill_rows_parallel: {} bytes for {} rows of {}", out.size(),
                      job.n_rows, out_row_bytes);
  }
  const int64_t rows_per_task = std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, job.row_len));
  const int64_t n_tasks = (job.n_rows + rows_per_task - 1) / rows_per_task;
  std::vector<std::vector<float>> scratch(size_t(pool.size()));
  pool.run(n_tasks, [&](int64_t task, int thread) {
    const int64_t begin = task * rows_per_task;
    const int64_t end = std::min(job.n_rows, begin + rows_per_task);
    std::vector<float>& buf = scratch[size_t(thread)];
    buf.resize(size_t((end - begin) * job.row_len));
    job.read_rows(begin, end, buf.data());
    quantize_chunk(job, buf.data(), out.data() + size_t(begin) * out_row_bytes, begin, end);
    if (progress) progress->add_units(uint64_t(end - begin) * out_row_bytes);
  });
  return Status::ok();
}

Result<QuantizeSummary> quantize_model(const QuantizeOptions& options) {
  MOESERVE_ASSIGN_OR_RETURN(GgufFile in, GgufFile::open(options.input_path));
  const std::string arch(in.architecture());
  const int n_layer = int(in.get_int(keys::arch_key(arch, keys::kBlockCount)).value_or(0));
  const int n_expert = int(in.get_int(keys::arch_key(arch, keys::kExpertCount)).value_or(0));
  const bool tied = in.find_tensor(keys::kOutput) == nullptr;
  // The head count may be per layer (an array); the first layer's stands for all.
  const int64_t n_head = in.get_int(keys::arch_key(arch, keys::kHeadCount)).value_or(0);
  const int64_t n_head_kv = in.get_int(keys::arch_key(arch, keys::kHeadCountKv)).value_or(0);
  const int n_gqa = n_head > 0 && n_head_kv > 0 ? int(n_head / n_head_kv) : 0;
  std::vector<std::string_view> names;
  for (const GgufTensorInfo& t : in.tensors()) names.push_back(t.name);
  const AttentionTensorIndex attention(names);

  GgufWriter writer;
  for (const GgufKV& kv : in.kvs()) {
    if (kv.key == keys::kFileType || kv.key == keys::kQuantizationVersion) continue;
    writer.set(kv.key, kv.value);
  }
  writer.set_u32(keys::kFileType, uint32_t(options.file_type));
  if (file_type_is_quantized(options.file_type)) writer.set_u32(keys::kQuantizationVersion, 2);

  QuantizeSummary summary;
  ThreadPool pool(options.threads);
  std::vector<DType> out_types;
  std::vector<uint8_t> weighted;  // per tensor: quantized with the imatrix
  uint64_t total_out = 0;
  for (size_t i = 0; i < in.tensors().size(); ++i) {
    const GgufTensorInfo& t = in.tensors()[i];
    std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    const DType out_type =
        choose_tensor_type(options.file_type, {.name = t.name,
                                               .ne = shape,
                                               .n_layer = n_layer,
                                               .n_expert = n_expert,
                                               .output_is_tied = tied,
                                               .n_gqa = n_gqa,
                                               .attn_v_index = attention.attn_v_index(i),
                                               .n_attention_wv = attention.n_attention_wv(),
                                               .has_imatrix = options.imatrix != nullptr});
    const size_t out_bytes = dtype_row_bytes(out_type, t.ne[0]) * size_t(t.n_rows());
    total_out += out_bytes;
    summary.n_tensors += 1;
    summary.bytes_before += t.nbytes;
    summary.bytes_after += out_bytes;
    TypeTally& tally = summary.by_type[std::string(dtype_name(out_type))];
    tally.tensors += 1;
    tally.bytes += out_bytes;
    out_types.push_back(out_type);
    MOESERVE_ASSIGN_OR_RETURN(const bool with_imatrix, uses_imatrix(options, t, out_type, &summary));
    weighted.push_back(with_imatrix ? 1 : 0);
  }
  auto progress = std::make_shared<Progress>(ProgressOptions{.label = "quantize",
                                                             .total_units = total_out,
                                                             .total_items = in.tensors().size(),
                                                             .item_name = "tensors",
                                                             .units_are_bytes = true,
                                                             .mode = options.progress});
  for (size_t i = 0; i < in.tensors().size(); ++i) {
    const GgufTensorInfo* t = &in.tensors()[i];
    const DType out_type = out_types[i];
    const Imatrix* imatrix = weighted[i] != 0 ? options.imatrix : nullptr;
    std::vector<int64_t> shape(t->ne, t->ne + t->n_dims);
    GgufTensorFill fill = [t, out_type, imatrix, &pool, progress](std::span<uint8_t> out) -> Status {
      if (out_type == t->type) {
        std::memcpy(out.data(), t->data, t->nbytes);
        progress->add_units(t->nbytes);
      } else {
        const size_t in_row_bytes = t->row_bytes();
        RowFillJob job{out_type, t->n_rows(), t->ne[0],
                       [t, in_row_bytes](int64_t begin, int64_t end, float* dst) {
                         for (int64_t r = begin; r < end; ++r) {
                           dequantize_row(t->type, t->data + size_t(r) * in_row_bytes,
                                          dst + (r - begin) * t->ne[0], t->ne[0]);
                         }
                       }};
        // Computed here, not up front: one tensor's worth is alive at a time.
        std::optional<TensorImportance> importance;
        if (imatrix != nullptr) {
          MOESERVE_ASSIGN_OR_RETURN(importance,
                                    tensor_importance(*imatrix, t->name, t->ne[0], tensor_matrices(*t)));
          job.importance = &*importance;
          job.rows_per_matrix = t->ne[1];
        }
        MOESERVE_RETURN_IF_ERROR(fill_rows_parallel(job, out, pool, progress.get()));
      }
      progress->add_items(1);
      return Status::ok();
    };
    MOESERVE_RETURN_IF_ERROR(writer.add_tensor_deferred(t->name, out_type, shape, std::move(fill)));
  }
  MOESERVE_RETURN_IF_ERROR(writer.write(options.output_path));
  progress->finish();
  return summary;
}

std::string format_quantize_summary(const QuantizeSummary& s) {
  std::string out;
  for (const auto& [type, tally] : s.by_type) {
    out += fmt::format("  {:<6} {:5} tensors  {:>12}\n", type, tally.tensors, mib(tally.bytes));
  }
  const double ratio = s.bytes_before > 0 ? double(s.bytes_after) / double(s.bytes_before) : 0.0;
  out += fmt::format("  {} tensors: {} -> {} ({:.1f}%)\n", s.n_tensors, mib(s.bytes_before),
                     mib(s.bytes_after), ratio * 100.0);
  return out;
}

}  // namespace moeserve::convert
