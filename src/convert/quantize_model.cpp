#include "convert/quantize_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
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

}  // namespace

Status fill_rows_parallel(const RowFillJob& job, std::span<uint8_t> out, ThreadPool& pool, Progress* progress) {
  const size_t out_row_bytes = dtype_row_bytes(job.out_type, job.row_len);
  if (out.size() != out_row_bytes * size_t(job.n_rows)) {
    return make_error(StatusCode::kInternal, "fill_rows_parallel: {} bytes for {} rows of {}", out.size(), job.n_rows,
                      out_row_bytes);
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
    quantize_rows(job.out_type, buf.data(), out.data() + size_t(begin) * out_row_bytes, end - begin, job.row_len);
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
  uint64_t total_out = 0;
  for (size_t i = 0; i < in.tensors().size(); ++i) {
    const GgufTensorInfo& t = in.tensors()[i];
    std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
    const DType out_type = choose_tensor_type(options.file_type, {.name = t.name,
                                                                  .ne = shape,
                                                                  .n_layer = n_layer,
                                                                  .n_expert = n_expert,
                                                                  .output_is_tied = tied,
                                                                  .n_gqa = n_gqa,
                                                                  .attn_v_index = attention.attn_v_index(i),
                                                                  .n_attention_wv = attention.n_attention_wv()});
    const size_t out_bytes = dtype_row_bytes(out_type, t.ne[0]) * size_t(t.n_rows());
    total_out += out_bytes;
    summary.n_tensors += 1;
    summary.bytes_before += t.nbytes;
    summary.bytes_after += out_bytes;
    TypeTally& tally = summary.by_type[std::string(dtype_name(out_type))];
    tally.tensors += 1;
    tally.bytes += out_bytes;
    out_types.push_back(out_type);
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
    std::vector<int64_t> shape(t->ne, t->ne + t->n_dims);
    GgufTensorFill fill = [t, out_type, &pool, progress](std::span<uint8_t> out) -> Status {
      if (out_type == t->type) {
        std::memcpy(out.data(), t->data, t->nbytes);
        progress->add_units(t->nbytes);
      } else {
        const size_t in_row_bytes = t->row_bytes();
        RowFillJob job{out_type, t->n_rows(), t->ne[0], [t, in_row_bytes](int64_t begin, int64_t end, float* dst) {
                         for (int64_t r = begin; r < end; ++r) {
                           dequantize_row(t->type, t->data + size_t(r) * in_row_bytes, dst + (r - begin) * t->ne[0], t->ne[0]);
                         }
                       }};
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
  out += fmt::format("  {} tensors: {} -> {} ({:.1f}%)\n", s.n_tensors, mib(s.bytes_before), mib(s.bytes_after), ratio * 100.0);
  return out;
}

}  // namespace moeserve::convert
