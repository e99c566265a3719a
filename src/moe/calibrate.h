// Routing statistics of a model on a set of prompts (`moeserve calibrate`):
// each prompt is prefilled, then decoded greedily for up to n_predict
// tokens (stopping at the end of a turn), and every MoE layer's expert
// selections are counted, prefill and decode tokens apart.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "moe/expert_stats.h"
#include "moe/moe_shape.h"
#include "runtime/model.h"

namespace moeserve::moe {

struct CalibrateOptions {
  int64_t n_predict = 32;  // greedy tokens decoded after each prompt
  int64_t n_batch = 512;   // prefill chunk
  int64_t ctx_size = 4096;
  std::function<void(size_t done, size_t total)> on_prompt;  // progress (optional)
};

// The prompts as token ids. `lines`: one prompt a line; a line that is a
// JSON object with "messages" (or a JSON array of messages) is a
// conversation rendered with the model's chat template, any other line is
// text. Empty lines are skipped; `source` names the input in errors.
Result<std::vector<std::vector<int32_t>>> calibration_prompts(const runtime::Model& model,
                                                              std::string_view lines,
                                                              std::string_view source);

// prefill_tokens = the prompts' tokens; decode_tokens = the decoded tokens
// fed back; per layer the counts sum to n_expert_used x those tokens.
Result<ExpertStats> calibrate(runtime::Model& model, const MoeShape& shape,
                              std::span<const std::vector<int32_t>> prompts, const CalibrateOptions& o);

}  // namespace moeserve::moe
