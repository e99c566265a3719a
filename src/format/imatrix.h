// Importance matrices (imatrix files), as llama.cpp's `llama-imatrix` writes
// them and its `llama-quantize --imatrix` reads them.
//
// For each weight matrix that multiplies activations, per input column j:
// the sum over the calibration rows x that went into the matrix of x_j^2,
// and how many rows there were; for a stack of expert matrices, per expert
// (only the rows routed to it). The quantizer weights column j's error by
// the mean, sum / count (tensor/quantize.h, quantize_rows_weighted).
//
// Two files carry it:
//  - GGUF (llama.cpp's current format): general.type = "imatrix", keys
//    imatrix.datasets (string array), imatrix.chunk_count and
//    imatrix.chunk_size (u32); per weight `<name>.in_sum2` (f32, ne [n_cols,
//    n_mat]) and `<name>.counts` (f32, ne [1, n_mat]); `<name>.in_sum` (the
//    plain sums, newer llama.cpp) is accepted and ignored.
//  - the legacy `.dat`: i32 n_entries, then per entry i32 name length, the
//    name, i32 ncall, i32 nval, nval f32; then optionally i32 chunk count,
//    i32 length and the dataset name. The values are mean(x^2) * ncall (one
//    count for all experts), so the mean is value / ncall.
// Both parsers treat the bytes as hostile: every length and count is checked
// against what is left, values must be finite and non-negative, and errors
// name the file and the entry.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"

namespace moeserve {

struct ImatrixEntry {
  int64_t n_cols = 0;          // values per matrix (the weight's ne[0])
  int64_t n_mat = 1;           // matrices: experts of a stacked tensor, 1 for a dense one
  std::vector<float> in_sum2;  // [n_mat][n_cols]: sums of x_j^2
  std::vector<float> counts;   // [n_mat]: rows summed
};

struct Imatrix {
  std::map<std::string, ImatrixEntry, std::less<>> entries;  // by weight name ("blk.0.attn_q.weight")
  std::vector<std::string> datasets;                         // the calibration text files
  uint32_t chunk_count = 0;                                  // chunks evaluated
  uint32_t chunk_size = 0;                                   // tokens per chunk
};

// ---- writing (GGUF) ----------------------------------------------------------
Result<std::vector<uint8_t>> imatrix_to_gguf(const Imatrix& m);
// Via path.tmp + rename, as GgufWriter::write.
Status write_imatrix(const Imatrix& m, const std::string& path);

// ---- reading -----------------------------------------------------------------
// `name` appears in error messages (the path).
Result<Imatrix> parse_imatrix_gguf(const GgufFile& file);
Result<Imatrix> parse_imatrix_legacy(std::span<const uint8_t> bytes, std::string_view name);
// GGUF when the bytes start with "GGUF", else the legacy format.
Result<Imatrix> parse_imatrix(std::span<const uint8_t> bytes, std::string name);
Result<Imatrix> read_imatrix(const std::string& path);

// ---- use -----------------------------------------------------------------------
// A weight's importance per column, for a tensor of n_mat matrices of n_cols
// columns: values [n_mat][n_cols] = in_sum2 / count; present[m] = 0 where
// matrix m got no rows (count 0: its values are 0, quantize it without).
struct TensorImportance {
  std::vector<float> values;
  std::vector<uint8_t> present;
};
// kNotFound when the imatrix has no entry `name`; kInvalidArgument when its
// shape does not match (an imatrix made for another model). A legacy entry
// holds all experts' values in one flat row: it matches when its length is
// n_mat * n_cols.
Result<TensorImportance> tensor_importance(const Imatrix& m, std::string_view name, int64_t n_cols,
                                           int64_t n_mat);

}  // namespace moeserve
