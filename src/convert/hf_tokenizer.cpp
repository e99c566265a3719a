#include "convert/hf_tokenizer.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "convert/hf_laguna.h"
#include "format/model_keys.h"

namespace moeserve::convert {

namespace {

using nlohmann::json;

// First non-negative id of `key` (an integer or a list of them), if any.
std::optional<int32_t> id_from_json(const json& root, const char* key, size_t n_tokens) {
  if (!root.is_object() || !root.contains(key)) return std::nullopt;
  const json& v = root[key];
  const json* first = v.is_array() && !v.empty() ? &v[0] : &v;
  if (!first->is_number_integer()) return std::nullopt;
  const int64_t id = first->get<int64_t>();
  if (id < 0 || uint64_t(id) >= n_tokens) return std::nullopt;
  return int32_t(id);
}

// A whole file, or nullopt when there is none (an unreadable one is an error).
Result<std::optional<std::string>> read_optional_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::optional<std::string>();
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) return make_error(StatusCode::kIoError, "{}: cannot read", path.string());
  return std::optional<std::string>(text.str());
}

// The chat template as checkpoints ship it: transformers v5 saves it in
// chat_template.jinja (older versions in chat_template.json, or inside
// tokenizer_config.json, which load_tokenizer_json already read); the
// separate files win, as transformers' loader has it.
Status read_chat_template(const std::filesystem::path& root, tok::VocabData& vocab) {
  MOESERVE_ASSIGN_OR_RETURN(std::optional<std::string> jinja,
                            read_optional_file(root / "chat_template.jinja"));
  if (jinja) {
    vocab.chat_template = std::move(*jinja);
    return Status::ok();
  }
  const std::filesystem::path json_path = root / "chat_template.json";
  MOESERVE_ASSIGN_OR_RETURN(std::optional<std::string> text, read_optional_file(json_path));
  if (!text) return Status::ok();
  const json doc = json::parse(*text, nullptr, false);
  const json* t = doc.is_object() && doc.contains("chat_template") ? &doc["chat_template"] : nullptr;
  if (t && t->is_string()) {
    vocab.chat_template = t->get<std::string>();
    return Status::ok();
  }
  if (t && t->is_array()) {  // [{"name": "default", "template": "..."}, ...]
    for (const json& named : *t) {
      if (named.is_object() && named.value("name", json()) == "default" && named.contains("template") &&
          named["template"].is_string()) {
        vocab.chat_template = named["template"].get<std::string>();
        return Status::ok();
      }
    }
  }
  return make_error(
      StatusCode::kInvalidFormat,
      "{}: expected {{\"chat_template\": \"...\"}} (or a list with a template named \"default\")",
      json_path.string());
}

}  // namespace

Result<tok::VocabData> load_hf_vocab(const std::string& dir, const HfModelConfig& config) {
  const std::filesystem::path root(dir);
  MOESERVE_ASSIGN_OR_RETURN(tok::VocabData vocab,
                            tok::load_tokenizer_json((root / "tokenizer.json").string()));
  MOESERVE_RETURN_IF_ERROR(read_chat_template(root, vocab));
  const size_t n = vocab.tokens.size();
  const std::filesystem::path gen_path = root / "generation_config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(gen_path, ec)) {
    std::ifstream in(gen_path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    json gen = json::parse(text.str(), nullptr, false);
    if (gen.is_discarded() || !gen.is_object()) {
      return make_error(StatusCode::kInvalidFormat, "{}: not a JSON object", gen_path.string());
    }
    if (!vocab.eos_id) vocab.eos_id = id_from_json(gen, "eos_token_id", n);
    if (!vocab.bos_id) vocab.bos_id = id_from_json(gen, "bos_token_id", n);
  }
  if (!vocab.eos_id && config.eos_token_id && *config.eos_token_id < int64_t(n))
    vocab.eos_id = int32_t(*config.eos_token_id);
  if (!vocab.bos_id && config.bos_token_id && *config.bos_token_id < int64_t(n))
    vocab.bos_id = int32_t(*config.bos_token_id);
  if (config.arch == "laguna") apply_laguna_vocab(config, vocab);
  return vocab;
}

Status write_vocab_keys(const tok::VocabData& vocab, int64_t n_vocab, GgufWriter& w) {
  const size_t n_tokens = vocab.tokens.size();
  if (int64_t(n_tokens) > n_vocab) {
    return make_error(StatusCode::kInvalidFormat,
                      "{}: {} tokens but the embedding has only {} rows (vocab_size)", vocab.source, n_tokens,
                      n_vocab);
  }
  std::vector<std::string> tokens = vocab.tokens;
  std::vector<int32_t> types = vocab.token_types;
  types.resize(n_tokens, int32_t(tok::TokenType::kNormal));  // empty means all normal
  for (int64_t id = int64_t(n_tokens); id < n_vocab; ++id) {
    tokens.push_back(fmt::format("[PAD{}]", id));
    types.push_back(int32_t(tok::TokenType::kUnused));
  }
  std::vector<std::string> merges;
  merges.reserve(vocab.merges.size());
  for (const auto& [a, b] : vocab.merges) merges.push_back(a + " " + b);

  w.set_string(keys::kTokModel, "gpt2");
  w.set_string(keys::kTokPre, vocab.pre);
  w.set_string_array(keys::kTokTokens, std::move(tokens));
  w.set_i32_array(keys::kTokTypes, std::move(types));
  w.set_string_array(keys::kTokMerges, std::move(merges));
  if (vocab.bos_id) w.set_u32(keys::kTokBos, uint32_t(*vocab.bos_id));
  if (vocab.eos_id) w.set_u32(keys::kTokEos, uint32_t(*vocab.eos_id));
  if (vocab.eot_id) w.set_u32(keys::kTokEot, uint32_t(*vocab.eot_id));
  if (vocab.pad_id) w.set_u32(keys::kTokPad, uint32_t(*vocab.pad_id));
  w.set_bool(keys::kTokAddBos, vocab.add_bos);
  if (!vocab.chat_template.empty()) w.set_string(keys::kChatTemplate, vocab.chat_template);
  return Status::ok();
}

}  // namespace moeserve::convert
