#include "convert/hf_tensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "convert/hf_dflash.h"
#include "convert/hf_internal.h"
#include "convert/hf_laguna.h"
#include "convert/hf_qwen35.h"
#include "core/half.h"
#include "format/model_keys.h"

namespace moeserve::convert {

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);  // source data may be unaligned
  return v;
}

// One element of a float source at element index i (data may be unaligned).
float load_element(const SafetensorsTensor& t, int64_t i) {
  switch (t.type) {
    case DType::F32: {
      float v;
      std::memcpy(&v, t.data + size_t(i) * 4, 4);
      return v;
    }
    case DType::F16:
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, t.data + size_t(i) * 2, 2);
      return t.type == DType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
    default:
      return 0.0f;  // the reader accepts only the three float types
  }
}

void load_contiguous(const SafetensorsTensor& t, int64_t first, int64_t n, float* out) {
  const uint8_t* src = t.data + size_t(first) * dtype_traits(t.type).block_bytes;
  switch (t.type) {  // one loop per type: this is the hot path of a conversion
    case DType::F32:
      std::memcpy(out, src, size_t(n) * 4);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_fp32(load_u16(src + 2 * i));
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_fp32(load_u16(src + 2 * i));
      break;
    default:
      for (int64_t i = 0; i < n; ++i) out[i] = load_element(t, first + i);
  }
}

std::vector<int64_t> reversed(std::vector<int64_t> shape) {
  std::reverse(shape.begin(), shape.end());
  return shape;
}

// Qwen3 / Qwen3-MoE: token_embd, output_norm, output, then per layer the
// attention, the norms and the dense FFN or the experts.
Status plan_qwen3(HfTensorPlanner& pl, const HfModelConfig& c) {
  MOESERVE_RETURN_IF_ERROR(pl.globals("model."));
  const int64_t H = c.hidden_size, D = c.head_dim;
  for (int layer = 0; layer < int(c.n_layer); ++layer) {
    const std::string p = fmt::format("model.layers.{}.", layer);
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "input_layernorm.weight", keys::blk(layer, keys::kAttnNorm), {H}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "self_attn.q_proj.weight", keys::blk(layer, keys::kAttnQ), {c.n_head * D, H}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "self_attn.k_proj.weight", keys::blk(layer, keys::kAttnK), {c.n_head_kv * D, H}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "self_attn.v_proj.weight", keys::blk(layer, keys::kAttnV), {c.n_head_kv * D, H}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "self_attn.o_proj.weight", keys::blk(layer, keys::kAttnOutput), {H, c.n_head * D}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "self_attn.q_norm.weight", keys::blk(layer, keys::kAttnQNorm), {D}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "self_attn.k_norm.weight", keys::blk(layer, keys::kAttnKNorm), {D}));
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "post_attention_layernorm.weight", keys::blk(layer, keys::kFfnNorm), {H}));
    if (!c.is_moe()) {
      const int64_t I = c.intermediate_size;
      MOESERVE_RETURN_IF_ERROR(pl.direct(p + "mlp.gate_proj.weight", keys::blk(layer, keys::kFfnGate), {I, H}));
      MOESERVE_RETURN_IF_ERROR(pl.direct(p + "mlp.up_proj.weight", keys::blk(layer, keys::kFfnUp), {I, H}));
      MOESERVE_RETURN_IF_ERROR(pl.direct(p + "mlp.down_proj.weight", keys::blk(layer, keys::kFfnDown), {H, I}));
      continue;
    }
    MOESERVE_RETURN_IF_ERROR(pl.direct(p + "mlp.gate.weight", keys::blk(layer, keys::kFfnGateInp), {c.n_expert, H}));
    MOESERVE_RETURN_IF_ERROR(pl.experts(layer, p + "mlp.experts.", c.n_expert, c.expert_ff));
  }
  return pl.check_all_used();
}

}  // namespace

Result<const SafetensorsTensor*> HfTensorPlanner::require(const std::string& hf_name, const std::vector<int64_t>& shape) {
  const SafetensorsTensor* t = m_.find(hf_name);
  if (t == nullptr) return make_error(StatusCode::kNotFound, "{}: tensor '{}' is missing", c_.source, hf_name);
  if (t->shape != shape) {
    return make_error(StatusCode::kInvalidFormat, "{}: tensor '{}' has shape {}, config.json implies [{}]", t->file, hf_name,
                      t->shape_string(), fmt::join(shape, ", "));
  }
  used_.insert(hf_name);
  return t;
}

Status HfTensorPlanner::direct(const std::string& hf_name, std::string_view gguf_name, const std::vector<int64_t>& shape,
                               std::vector<int64_t> ne) {
  MOESERVE_ASSIGN_OR_RETURN(const SafetensorsTensor* t, require(hf_name, shape));
  out_.push_back(PlannedTensor{std::string(gguf_name), ne.empty() ? reversed(shape) : std::move(ne), SourceLayout::kDirect, {t}});
  return Status::ok();
}

Status HfTensorPlanner::globals(const std::string& prefix) {
  const int64_t H = c_.hidden_size;
  MOESERVE_RETURN_IF_ERROR(direct(prefix + "embed_tokens.weight", keys::kTokenEmbd, {c_.vocab_size, H}));
  MOESERVE_RETURN_IF_ERROR(direct(prefix + "norm.weight", keys::kOutputNorm, {H}));
  if (c_.hybrid) last().transform = ValueTransform::kPlusOne;  // zero-centred RMSNorm
  if (!c_.tie_word_embeddings) {
    MOESERVE_RETURN_IF_ERROR(direct("lm_head.weight", keys::kOutput, {c_.vocab_size, H}));
  } else if (m_.find("lm_head.weight") != nullptr) {
    // Some tied checkpoints still save the (identical) head; it is the
    // embedding by definition, so it is not written twice.
    used_.insert("lm_head.weight");
  }
  return Status::ok();
}

Status HfTensorPlanner::experts(int layer, const std::string& prefix, int64_t n_expert, int64_t expert_ff) {
  if (m_.find(prefix + "gate_up_proj") != nullptr || m_.find(prefix + "down_proj") != nullptr) {
    return plan_fused_experts(layer, prefix, n_expert, expert_ff);
  }
  return plan_per_expert(layer, prefix, n_expert, expert_ff);
}

Status HfTensorPlanner::plan_per_expert(int layer, const std::string& prefix, int64_t n_expert, int64_t expert_ff) {
  const int64_t H = c_.hidden_size, I = expert_ff, E = n_expert;
  struct Part {
    const char* hf;
    std::string_view gguf;
    std::vector<int64_t> shape;
  };
  const Part parts[] = {{"gate_proj", keys::kFfnGateExps, {I, H}},
                        {"up_proj", keys::kFfnUpExps, {I, H}},
                        {"down_proj", keys::kFfnDownExps, {H, I}}};
  for (const Part& part : parts) {
    PlannedTensor t{keys::blk(layer, part.gguf), {part.shape[1], part.shape[0], E}, SourceLayout::kStackedExperts, {}};
    for (int64_t e = 0; e < E; ++e) {
      MOESERVE_ASSIGN_OR_RETURN(const SafetensorsTensor* src,
                                require(fmt::format("{}{}.{}.weight", prefix, e, part.hf), part.shape));
      t.sources.push_back(src);
    }
    out_.push_back(std::move(t));
  }
  return Status::ok();
}

Status HfTensorPlanner::plan_fused_experts(int layer, const std::string& prefix, int64_t n_expert, int64_t expert_ff) {
  const int64_t H = c_.hidden_size, I = expert_ff, E = n_expert;
  const SafetensorsTensor* gate_up = m_.find(prefix + "gate_up_proj");
  const SafetensorsTensor* down = m_.find(prefix + "down_proj");
  if (gate_up == nullptr) return make_error(StatusCode::kNotFound, "{}: tensor '{}gate_up_proj' is missing", c_.source, prefix);
  if (down == nullptr) return make_error(StatusCode::kNotFound, "{}: tensor '{}down_proj' is missing", c_.source, prefix);
  const std::vector<int64_t> gu_plain{E, 2 * I, H}, gu_transposed{E, H, 2 * I};
  const std::vector<int64_t> down_plain{E, H, I}, down_transposed{E, I, H};
  if (gate_up->shape != gu_plain && gate_up->shape != gu_transposed) {
    return make_error(StatusCode::kInvalidFormat, "{}: tensor '{}' has shape {}, config.json implies [{}] (or [{}])", gate_up->file,
                      gate_up->name, gate_up->shape_string(), fmt::join(gu_plain, ", "), fmt::join(gu_transposed, ", "));
  }
  if (down->shape != down_plain && down->shape != down_transposed) {
    return make_error(StatusCode::kInvalidFormat, "{}: tensor '{}' has shape {}, config.json implies [{}] (or [{}])", down->file,
                      down->name, down->shape_string(), fmt::join(down_plain, ", "), fmt::join(down_transposed, ", "));
  }
  used_.insert(gate_up->name);
  used_.insert(down->name);
  const bool gu_is_transposed = gate_up->shape != gu_plain;
  for (int part = 0; part < 2; ++part) {
    PlannedTensor t{keys::blk(layer, part == 0 ? keys::kFfnGateExps : keys::kFfnUpExps), {H, I, E}, SourceLayout::kFusedGateUp,
                    {gate_up}};
    t.fused_part = part;
    t.transposed = gu_is_transposed;
    out_.push_back(std::move(t));
  }
  const bool down_is_transposed = down->shape != down_plain;
  out_.push_back(PlannedTensor{keys::blk(layer, keys::kFfnDownExps), {I, H, E},
                               down_is_transposed ? SourceLayout::kFusedDown : SourceLayout::kDirect, {down}});
  out_.back().transposed = down_is_transposed;
  return Status::ok();
}

Status HfTensorPlanner::check_all_used(const std::function<bool(const std::string&)>& skip) const {
  std::vector<std::string> unused;
  for (const SafetensorsTensor* t : m_.all_tensors()) {
    if (used_.count(t->name) || t->name.ends_with("rotary_emb.inv_freq")) continue;
    if (skip && skip(t->name)) continue;
    unused.push_back(t->name);
  }
  if (unused.empty()) return Status::ok();
  const size_t shown = std::min<size_t>(unused.size(), 5);
  return make_error(StatusCode::kUnsupported, "{}: {} tensor(s) not used by the {} conversion: {}{}", c_.source, unused.size(),
                    c_.arch, fmt::join(unused.begin(), unused.begin() + long(shown), ", "), unused.size() > shown ? ", ..." : "");
}

int64_t PlannedTensor::n_rows() const {
  int64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
  return rows;
}

void PlannedTensor::read_rows(int64_t begin, int64_t end, float* out) const {
  const int64_t row_len = ne[0];
  const int64_t rows_per_slab = ne.size() > 1 ? ne[1] : 1;
  for (int64_t r = begin; r < end; ++r, out += row_len) {
    const int64_t slab = r / rows_per_slab, row = r % rows_per_slab;
    switch (layout) {
      case SourceLayout::kDirect: {
        const int64_t src_row = row_map.empty() ? r : row_map[size_t(r)];
        if (col_map.empty()) {
          load_contiguous(*sources[0], src_row * row_len, row_len, out);
        } else {
          thread_local std::vector<float> row;
          row.resize(size_t(row_len));
          load_contiguous(*sources[0], src_row * row_len, row_len, row.data());
          for (int64_t i = 0; i < row_len; ++i) out[i] = row[size_t(col_map[size_t(i)])];
        }
        break;
      }
      case SourceLayout::kStackedExperts:
        load_contiguous(*sources[size_t(slab)], row * row_len, row_len, out);
        break;
      case SourceLayout::kFusedGateUp: {
        // Output row = (expert slab, intermediate index row) over H inputs.
        const int64_t I = rows_per_slab, H = row_len, col = fused_part * I + row;
        if (!transposed) {
          load_contiguous(*sources[0], (slab * 2 * I + col) * H, H, out);
        } else {  // [E, H, 2I]: element h of this row is at (slab, h, col)
          for (int64_t h = 0; h < H; ++h) out[h] = load_element(*sources[0], (slab * H + h) * 2 * I + col);
        }
        break;
      }
      case SourceLayout::kFusedDown: {
        // Stored [E, I, H]; output row (slab, h) gathers the I inputs.
        const int64_t H = rows_per_slab, I = row_len;
        for (int64_t i = 0; i < I; ++i) out[i] = load_element(*sources[0], (slab * I + i) * H + row);
        break;
      }
    }
    switch (transform) {
      case ValueTransform::kNone:
        break;
      case ValueTransform::kPlusOne:
        for (int64_t i = 0; i < row_len; ++i) out[i] += 1.0f;
        break;
      case ValueTransform::kNegExp:
        for (int64_t i = 0; i < row_len; ++i) out[i] = -std::exp(out[i]);
        break;
    }
  }
}

Result<std::vector<PlannedTensor>> plan_hf_tensors(const HfModelConfig& config, const SafetensorsModel& model,
                                                   std::vector<std::string>* notes) {
  HfTensorPlanner planner(config, model);
  MOESERVE_RETURN_IF_ERROR(config.arch == "dflash"   ? plan_dflash_tensors(planner)
                           : config.arch == "laguna" ? plan_laguna_tensors(planner)
                           : config.hybrid         ? plan_qwen35_tensors(planner)
                                                   : plan_qwen3(planner, config));
  if (notes != nullptr) notes->insert(notes->end(), planner.notes().begin(), planner.notes().end());
  return planner.take();
}

}  // namespace moeserve::convert
