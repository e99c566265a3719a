// What placing a mixture-of-experts model's experts needs to know of it,
// read from the GGUF tensor table and metadata alone (no weight is read):
// the bytes of one expert per layer, the bytes of everything else, the KV
// bytes per position, and a fingerprint that ties placement and statistics
// files to this exact file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "format/gguf.h"

namespace moeserve::moe {

struct MoeShape {
  std::string arch;
  std::string fingerprint;  // model_fingerprint()
  int64_t n_layer = 0, n_expert = 0, n_expert_used = 0;
  // [layer]: one expert's gate + up + down bytes (0: the layer has no experts).
  std::vector<uint64_t> expert_bytes;
  // Every other tensor: attention, norms, routers, embeddings, output head.
  uint64_t dense_bytes = 0;
  // f16 K and V of every layer for one position.
  uint64_t kv_bytes_per_position = 0;

  uint64_t all_expert_bytes() const;  // every expert of every layer
};

// The shape of a model with stacked experts (blk.N.ffn_{gate,up,down}_exps);
// kInvalidArgument naming the file when it has none or they disagree.
Result<MoeShape> moe_shape(const GgufFile& file);

// A 64-bit FNV-1a hash over the tensor table (each tensor's name, type,
// shape and data offset), as 16 hex digits: a file re-quantized, re-converted
// or of another model gets another one; copying or renaming the file keeps it.
std::string model_fingerprint(const GgufFile& file);

}  // namespace moeserve::moe
