#include "convert/hf_convert.h"

#include <fmt/format.h>

#include <filesystem>
#include <memory>

#include "convert/hf_config.h"
#include "convert/hf_tensors.h"
#include "convert/hf_tokenizer.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "format/gguf_writer.h"
#include "format/model_keys.h"
#include "format/safetensors.h"

namespace moeserve::convert {

namespace {

// State the deferred fills share; kept alive by the fills themselves.
struct ConvertJob {
  SafetensorsModel model;
  std::vector<PlannedTensor> plan;
  std::vector<DType> out_types;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Progress> progress;
};

std::string model_name(const std::string& dir) {
  std::filesystem::path p(dir);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

}  // namespace

Result<ConvertSummary> convert_hf_model(const ConvertOptions& options) {
  MOESERVE_ASSIGN_OR_RETURN(HfModelConfig config, load_hf_config(options.hf_dir));
  auto job = std::make_shared<ConvertJob>();
  MOESERVE_ASSIGN_OR_RETURN(job->model, SafetensorsModel::open_dir(options.hf_dir));
  std::vector<std::string> notes = config.notes;
  MOESERVE_ASSIGN_OR_RETURN(job->plan, plan_hf_tensors(config, job->model, &notes));
  // A DFlash draft has no tokenizer of its own: it uses its target's.
  const bool draft = config.arch == "dflash";
  tok::VocabData vocab;
  if (!draft) {
    MOESERVE_ASSIGN_OR_RETURN(vocab, load_hf_vocab(options.hf_dir, config));
  }

  GgufWriter writer;
  write_hf_hparams(config, writer);
  writer.set_string(keys::kName, model_name(options.hf_dir));
  writer.set_u32(keys::kFileType, uint32_t(options.file_type));
  if (file_type_is_quantized(options.file_type)) writer.set_u32(keys::kQuantizationVersion, 2);
  if (!draft) MOESERVE_RETURN_IF_ERROR(write_vocab_keys(vocab, config.vocab_size, writer));

  ConvertSummary summary;
  summary.arch = config.arch;
  summary.notes = std::move(notes);
  for (const std::string& note : summary.notes) MOESERVE_LOG_INFO("convert: {}", note);
  summary.n_tokens = draft ? 0 : size_t(config.vocab_size);
  std::vector<std::string_view> names;
  for (const PlannedTensor& t : job->plan) names.push_back(t.name);
  const AttentionTensorIndex attention(names);
  for (size_t i = 0; i < job->plan.size(); ++i) {
    const PlannedTensor& t = job->plan[i];
    const int n_gqa = config.n_head > 0 && config.n_head_kv > 0 ? int(config.n_head / config.n_head_kv) : 0;
    const DType type = choose_tensor_type(options.file_type, {.name = t.name,
                                                              .ne = t.ne,
                                                              .n_layer = int(config.n_layer),
                                                              .n_expert = int(config.n_expert),
                                                              .output_is_tied = config.tie_word_embeddings,
                                                              .n_gqa = n_gqa,
                                                              .attn_v_index = attention.attn_v_index(i),
                                                              .n_attention_wv = attention.n_attention_wv()});
    const uint64_t bytes = dtype_row_bytes(type, t.ne[0]) * uint64_t(t.n_rows());
    job->out_types.push_back(type);
    summary.n_tensors += 1;
    summary.bytes_after += bytes;
    TypeTally& tally = summary.by_type[std::string(dtype_name(type))];
    tally.tensors += 1;
    tally.bytes += bytes;
  }
  job->pool = std::make_unique<ThreadPool>(options.threads);
  job->progress = std::make_unique<Progress>(ProgressOptions{.label = "convert",
                                                             .total_units = summary.bytes_after,
                                                             .total_items = job->plan.size(),
                                                             .item_name = "tensors",
                                                             .units_are_bytes = true,
                                                             .mode = options.progress});
  for (size_t i = 0; i < job->plan.size(); ++i) {
    const PlannedTensor& t = job->plan[i];
    GgufTensorFill fill = [job, i](std::span<uint8_t> out) -> Status {
      const PlannedTensor& planned = job->plan[i];
      RowFillJob rows{job->out_types[i], planned.n_rows(), planned.ne[0],
                      [&planned](int64_t begin, int64_t end, float* dst) { planned.read_rows(begin, end, dst); }};
      MOESERVE_RETURN_IF_ERROR(fill_rows_parallel(rows, out, *job->pool, job->progress.get()));
      job->progress->add_items(1);
      return Status::ok();
    };
    MOESERVE_RETURN_IF_ERROR(writer.add_tensor_deferred(t.name, job->out_types[i], t.ne, std::move(fill)));
  }
  MOESERVE_RETURN_IF_ERROR(writer.write(options.output_path));
  job->progress->finish();
  return summary;
}

}  // namespace moeserve::convert
