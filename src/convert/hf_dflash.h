// DFlash draft checkpoints (z-lab's DFlashDraftModel: config.json with
// block_size, dflash_config.{target_layer_ids, mask_token_id}, and
// fc / hidden_norm / norm / layers.N.* safetensors) -> a GGUF file of
// architecture "dflash" (models/dflash_weights.h lists its keys and
// tensors). The draft has no tokenizer: it uses its target's.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "format/gguf_writer.h"

namespace moeserve::convert {

struct HfModelConfig;
class HfTensorPlanner;

struct DflashGgufParams {
  int64_t block_size = 16;
  int64_t mask_token_id = 0;
  std::vector<int32_t> target_layers;
  int64_t target_layer_count = 0;  // num_target_layers (0: absent)
  int64_t sliding_window = 0;
  std::vector<int32_t> sliding, causal;  // per layer, 0/1
  double output_multiplier = 1.0, logit_softcap = 0.0;
};

// Fills c (arch "dflash") from a DFlashDraftModel config.json.
Status parse_dflash_config(const nlohmann::json& root, std::string_view name, HfModelConfig& c);
void write_dflash_hparams(const HfModelConfig& c, GgufWriter& w);
Status plan_dflash_tensors(HfTensorPlanner& pl);

}  // namespace moeserve::convert
