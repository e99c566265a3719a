// moeserve quantize: re-type every tensor of a GGUF file by a file type's
// rule (convert/quant_mix.h), copying all metadata. Any source type we can
// read (float or quantized) is dequantized to f32 row by row and quantized to
// the target; a tensor whose type does not change is copied byte for byte.
// Rows are converted in parallel on a ThreadPool at write time
// (GgufWriter::add_tensor_deferred), so memory use stays small.
// With an importance matrix (format/imatrix.h), the types that have a
// weighted quantizer (tensor/quantize.h) weight each column's error by its
// importance, per expert for stacked expert tensors; a tensor the imatrix
// has no data for is quantized without (counted in the summary).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>

#include "convert/quant_mix.h"
#include "core/progress.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "format/imatrix.h"
#include "tensor/dtype.h"

namespace moeserve::convert {

struct QuantizeOptions {
  std::string input_path;
  std::string output_path;
  FileType file_type = FileType::kQ4_K_M;
  int threads = 0;  // <= 0: one per physical core
  ProgressOptions::Mode progress = ProgressOptions::Mode::kAuto;
  // Null: no importance weighting. Must outlive the call.
  const Imatrix* imatrix = nullptr;
  std::string imatrix_name{};  // for errors (the file's path)
};

struct TypeTally {
  size_t tensors = 0;
  uint64_t bytes = 0;
};

struct QuantizeSummary {
  size_t n_tensors = 0;
  uint64_t bytes_before = 0;  // tensor data only
  uint64_t bytes_after = 0;
  std::map<std::string, TypeTally> by_type;  // output type name -> tally
  // With an imatrix: tensors quantized with it, and those of a weighted
  // type it had no entry for (quantized without; the first one's name).
  size_t imatrix_used = 0;
  size_t imatrix_missing = 0;
  std::string first_missing;
};

Result<QuantizeSummary> quantize_model(const QuantizeOptions& options);
// "q4_K: 120 tensors, 300.1 MiB\n..." plus the size before/after line.
std::string format_quantize_summary(const QuantizeSummary& summary);

// ---- shared with convert -----------------------------------------------------

// Writes rows [row_begin, row_end) of a tensor as f32 into `out`
// ((row_end - row_begin) * row_len floats).
using RowReaderF32 = std::function<void(int64_t row_begin, int64_t row_end, float* out)>;

struct RowFillJob {
  DType out_type = DType::F32;
  int64_t n_rows = 0;
  int64_t row_len = 0;  // elements per row (ne[0])
  RowReaderF32 read_rows;
  // Optional: per-column importance of each matrix (rows_per_matrix rows
  // each; tensor_importance()); matrices without data are quantized plain.
  const TensorImportance* importance = nullptr;
  int64_t rows_per_matrix = 0;
};

// Fills `out` (n_rows rows of out_type) from read_rows, in parallel chunks on
// `pool`; adds each chunk's output bytes to `progress` (may be null).
Status fill_rows_parallel(const RowFillJob& job, std::span<uint8_t> out, ThreadPool& pool, Progress* progress);

}  // namespace moeserve::convert
