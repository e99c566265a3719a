#include "moe/calibrate.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "runtime/chat_prompt.h"
#include "runtime/generator.h"

namespace moeserve::moe {

namespace {

// A prompt line that is JSON: {"messages": [...]} or [...].
Result<std::string> render_line(const runtime::Model& model, std::string_view line, std::string_view source,
                                size_t line_no) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(line.begin(), line.end(), nullptr, false);
  if (doc.is_discarded() || !(doc.is_object() || doc.is_array())) return std::string(line);  // plain text
  const nlohmann::ordered_json* messages = doc.is_array() ? &doc : nullptr;
  if (doc.is_object() && doc.contains("messages")) messages = &doc["messages"];
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}:{}: a JSON line must be {{\"messages\": [...]}} or an array of messages", source,
                      line_no);
  }
  Result<std::string> text = runtime::render_chat_prompt(model, *messages);
  if (!text.is_ok()) {
    return make_error(text.status().code(), "{}:{}: {}", source, line_no, text.status().message());
  }
  return text;
}

}  // namespace

Result<std::vector<std::vector<int32_t>>> calibration_prompts(const runtime::Model& model,
                                                              std::string_view lines,
                                                              std::string_view source) {
  std::vector<std::vector<int32_t>> out;
  size_t line_no = 0;
  while (!lines.empty()) {
    const size_t nl = lines.find('\n');
    std::string_view line = lines.substr(0, nl);
    lines = nl == std::string_view::npos ? std::string_view() : lines.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    MOESERVE_ASSIGN_OR_RETURN(std::string text, render_line(model, line, source, line_no));
    std::vector<int32_t> ids = model.tokenizer().encode(text);
    if (!ids.empty()) out.push_back(std::move(ids));
  }
  if (out.empty()) return make_error(StatusCode::kInvalidArgument, "{}: no prompts (one a line)", source);
  return out;
}

Result<ExpertStats> calibrate(runtime::Model& model, const MoeShape& shape,
                              std::span<const std::vector<int32_t>> prompts, const CalibrateOptions& o) {
  if (model.info().n_expert != shape.n_expert || model.info().n_layer != shape.n_layer) {
    return make_error(StatusCode::kInvalidArgument, "calibrate: the model and its shape disagree");
  }
  ExpertStats stats = ExpertStats::zeros_for(shape);
  const size_t L = size_t(shape.n_layer), E = size_t(shape.n_expert);
  std::vector<int64_t> prefill(L * E, 0), decode(L * E, 0);
  runtime::Generator gen(model, o.ctx_size);
  MOESERVE_RETURN_IF_ERROR(gen.status());
  const tok::Tokenizer& t = model.tokenizer();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t>& p = prompts[i];
    if (int64_t(p.size()) + 1 > o.ctx_size) {
      return make_error(StatusCode::kOutOfRange,
                        "calibrate: prompt {} has {} tokens, more than --ctx-size {} allows", i + 1, p.size(),
                        o.ctx_size);
    }
    gen.sequence().clear();
    gen.set_expert_counts(prefill);
    int32_t next = 0;
    MOESERVE_RETURN_IF_ERROR(gen.prefill_greedy(p, o.n_batch, &next));
    stats.prefill_tokens += int64_t(p.size());
    gen.set_expert_counts(decode);
    for (int64_t n = 0; n < o.n_predict && gen.sequence().remaining() > 0; ++n) {
      if (next == t.eos_id() || next == t.eot_id()) break;
      MOESERVE_RETURN_IF_ERROR(gen.decode_greedy(next, &next));
      stats.decode_tokens += 1;
    }
    gen.set_expert_counts({});
    if (o.on_prompt) o.on_prompt(i + 1, prompts.size());
  }
  for (size_t l = 0; l < L; ++l) {
    stats.prefill[l].assign(prefill.begin() + std::ptrdiff_t(l * E),
                            prefill.begin() + std::ptrdiff_t((l + 1) * E));
    stats.decode[l].assign(decode.begin() + std::ptrdiff_t(l * E),
                           decode.begin() + std::ptrdiff_t((l + 1) * E));
  }
  return stats;
}

}  // namespace moeserve::moe
