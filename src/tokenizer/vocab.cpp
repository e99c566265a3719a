// tokenizer.json / tokenizer_config.json loading.
#include "tokenizer/vocab.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "tokenizer/pretokenizer.h"

namespace moeserve::tok {
namespace {

using nlohmann::json;

Status format_error(std::string_view name, std::string_view what) {
  return make_error(StatusCode::kInvalidFormat, "{}: {}", name, what);
}
Status unsupported(std::string_view name, std::string_view what) {
  return make_error(StatusCode::kUnsupported, "{}: {}", name, what);
}

std::string short_dump(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 200) text = text.substr(0, 200) + "...";
  return text;
}

// Token ids must be dense enough that a vector indexed by id stays small:
// a hostile file must not make us allocate gigabytes for one huge id.
Status check_id(std::string_view name, const json& value, size_t entry_count, std::string_view what,
                int32_t& id) {
  if (!value.is_number_integer()) return format_error(name, fmt::format("{}: id is not an integer", what));
  const int64_t raw = value.get<int64_t>();
  const int64_t limit = 2 * static_cast<int64_t>(entry_count) + 1024;
  if (raw < 0 || raw >= limit) {
    return format_error(name, fmt::format("{}: id {} is out of range (0..{})", what, raw, limit - 1));
  }
  id = static_cast<int32_t>(raw);
  return Status::ok();
}

Status place_token(std::string_view name, VocabData& vocab, std::vector<bool>& assigned, int32_t id,
                   std::string text, TokenType type) {
  if (static_cast<size_t>(id) >= vocab.tokens.size()) {
    vocab.tokens.resize(id + 1);
    vocab.token_types.resize(id + 1, static_cast<int32_t>(TokenType::kUnused));
    assigned.resize(id + 1, false);
  }
  if (assigned[id] && vocab.tokens[id] != text) {
    return format_error(name, fmt::format("id {} is given to both '{}' and '{}'", id, vocab.tokens[id], text));
  }
  vocab.tokens[id] = std::move(text);
  vocab.token_types[id] = static_cast<int32_t>(type);
  assigned[id] = true;
  return Status::ok();
}

Status read_vocab(std::string_view name, const json& model, const json* added, VocabData& vocab) {
  const json* entries = model.contains("vocab") ? &model["vocab"] : nullptr;
  if (entries == nullptr || !entries->is_object()) return format_error(name, "model.vocab is missing or not an object");
  const size_t entry_count = entries->size() + (added ? added->size() : 0);
  std::vector<bool> assigned;
  for (const auto& [text, id_value] : entries->items()) {
    int32_t id = 0;
    MOESERVE_RETURN_IF_ERROR(check_id(name, id_value, entry_count, fmt::format("model.vocab['{}']", text), id));
    MOESERVE_RETURN_IF_ERROR(place_token(name, vocab, assigned, id, text, TokenType::kNormal));
  }
  if (added == nullptr) return Status::ok();
  if (!added->is_array()) return format_error(name, "added_tokens is not an array");
  for (size_t i = 0; i < added->size(); ++i) {
    const json& token = (*added)[i];
    const std::string what = fmt::format("added_tokens[{}]", i);
    if (!token.is_object() || !token.contains("content") || !token["content"].is_string() || !token.contains("id")) {
      return format_error(name, what + " needs a string 'content' and an 'id'");
    }
    int32_t id = 0;
    MOESERVE_RETURN_IF_ERROR(check_id(name, token["id"], entry_count, what, id));
    const bool special = token.contains("special") && token["special"].is_boolean() && token["special"].get<bool>();
    MOESERVE_RETURN_IF_ERROR(place_token(name, vocab, assigned, id, token["content"].get<std::string>(),
                                         special ? TokenType::kControl : TokenType::kUserDefined));
  }
  return Status::ok();
}

Status read_merges(std::string_view name, const json& model, VocabData& vocab) {
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return format_error(name, "model.merges is missing or not an array");
  }
  const json& merges = model["merges"];
  vocab.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& merge = merges[i];
    if (merge.is_string()) {
      auto pair = split_merge_string(merge.get<std::string>());
      if (!pair) return format_error(name, fmt::format("model.merges[{}] '{}' is not 'a b'", i, merge.get<std::string>()));
      vocab.merges.push_back(std::move(*pair));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      vocab.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return format_error(name, fmt::format("model.merges[{}] is neither \"a b\" nor [\"a\", \"b\"]: {}", i,
                                            short_dump(merge)));
    }
  }
  return Status::ok();
}

// Options of the BPE model that would change its output and that we do not
// implement are refused rather than silently ignored.
Status check_bpe_options(std::string_view name, const json& model, VocabData& vocab) {
  if (!model.contains("type") || !model["type"].is_string()) return format_error(name, "model.type is missing");
  if (model["type"] != "BPE") {
    return unsupported(name, fmt::format("model.type {} (only BPE is supported)", short_dump(model["type"])));
  }
  auto is_set = [&](const char* key) {
    if (!model.contains(key)) return false;
    const json& v = model[key];
    return !(v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.get<std::string>().empty()));
  };
  for (const char* key : {"dropout", "byte_fallback", "continuing_subword_prefix", "end_of_word_suffix"}) {
    if (is_set(key)) return unsupported(name, fmt::format("model.{} = {}", key, short_dump(model[key])));
  }
  vocab.ignore_merges = is_set("ignore_merges");
  return Status::ok();
}

Status read_normalizer(std::string_view name, const json& root, VocabData& vocab) {
  const json* n = root.contains("normalizer") ? &root["normalizer"] : nullptr;
  if (n == nullptr || n->is_null()) return Status::ok();
  auto is_nfc = [](const json& v) { return v.is_object() && v.contains("type") && v["type"] == "NFC"; };
  if (is_nfc(*n)) {
    vocab.normalization = Normalization::kNfc;
    return Status::ok();
  }
  if (n->is_object() && n->contains("type") && (*n)["type"] == "Sequence" && n->contains("normalizers") &&
      (*n)["normalizers"].is_array()) {
    for (const json& inner : (*n)["normalizers"]) {
      if (!is_nfc(inner)) return unsupported(name, "normalizer " + short_dump(inner) + " (only NFC is supported)");
      vocab.normalization = Normalization::kNfc;
    }
    return Status::ok();
  }
  return unsupported(name, "normalizer " + short_dump(*n) + " (only NFC is supported)");
}

// A Split(Regex, Isolated, not inverted) step's regex, or nullptr.
const json* isolated_split_regex(const json& step) {
  const bool ok = step.is_object() && step.value("type", json()) == "Split" &&
                  step.value("behavior", json()) == "Isolated" &&
                  step.value("invert", json(false)) == false && step.contains("pattern") &&
                  step["pattern"].is_object() && step["pattern"].contains("Regex") &&
                  step["pattern"]["Regex"].is_string();
  return ok ? &step["pattern"]["Regex"] : nullptr;
}

// The newline split Laguna's tokenizer applies before the Qwen2 pattern
// (llama.cpp's "laguna" pre-type: runs of newlines and runs of anything
// else), as a regex string with "\n" escapes or raw newline characters.
bool is_newline_run_split(std::string regex) {
  for (size_t at = regex.find('\n'); at != std::string::npos; at = regex.find('\n', at + 2))
    regex.replace(at, 1, "\\n");
  return regex == R"([^\n]+|[\n]+)" || regex == R"([^\n]+|\n+)" || regex == R"([\n]+|[^\n]+)" ||
         regex == R"(\n+|[^\n]+)";
}

// Accepts exactly: Sequence[Split(Regex, Isolated, not inverted), ByteLevel
// without its own regex] — the byte-level pre-tokenizers of the Qwen family —
// and Laguna's Sequence[Split(newline runs), Split(Qwen2 pattern), ByteLevel].
Status read_pre_tokenizer(std::string_view name, const json& root, VocabData& vocab) {
  const std::string expected =
      "pre_tokenizer must be Sequence[Split(Regex), ByteLevel(use_regex=false)] (or Laguna's newline split "
      "first)";
  if (!root.contains("pre_tokenizer") || !root["pre_tokenizer"].is_object()) {
    return format_error(name, "pre_tokenizer is missing; " + expected);
  }
  const json& pre = root["pre_tokenizer"];
  const json* steps = pre.contains("pretokenizers") ? &pre["pretokenizers"] : nullptr;
  if (pre.value("type", json()) != "Sequence" || steps == nullptr || !steps->is_array() ||
      (steps->size() != 2 && steps->size() != 3)) {
    return unsupported(name, expected + ", got " + short_dump(pre));
  }
  const bool newline_first = steps->size() == 3;
  const json* newline = newline_first ? isolated_split_regex((*steps)[0]) : nullptr;
  const json* split = isolated_split_regex((*steps)[newline_first ? 1 : 0]);
  const json& byte_level = steps->back();
  const bool byte_level_ok = byte_level.is_object() && byte_level.value("type", json()) == "ByteLevel" &&
                             byte_level.value("use_regex", json(true)) == false &&
                             byte_level.value("add_prefix_space", json(false)) == false;
  if (split == nullptr || (newline_first && newline == nullptr) || !byte_level_ok) {
    return unsupported(name, expected + ", got " + short_dump(pre));
  }
  const std::string regex = split->get<std::string>();
  std::optional<std::string> pre_name = pre_name_for_hf_regex(regex);
  if (!pre_name) {
    return unsupported(name, "unknown pre-tokenizer regex (known: the qwen2 and qwen35 patterns): " + regex);
  }
  if (newline_first) {
    if (!is_newline_run_split(newline->get<std::string>()) || *pre_name != "qwen2") {
      return unsupported(name,
                         "unknown pre-tokenizer sequence (known with three steps: Laguna's newline split, "
                         "then the qwen2 pattern): " +
                             short_dump(pre));
    }
    pre_name = "laguna";
  }
  vocab.pre = *pre_name;
  return Status::ok();
}

// bos_token / eos_token / pad_token: a string, {"content": string} or null.
std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

Status read_config(std::string_view name, std::string_view config_text, VocabData& vocab) {
  json config = json::parse(config_text, nullptr, false);
  if (config.is_discarded() || !config.is_object()) return format_error(name, "tokenizer_config.json is not a JSON object");
  std::unordered_map<std::string_view, int32_t> ids;
  for (size_t id = 0; id < vocab.tokens.size(); ++id) ids.emplace(vocab.tokens[id], static_cast<int32_t>(id));
  auto resolve = [&](const char* key, std::optional<int32_t>& out) -> Status {
    std::optional<std::string> text = config_token(config, key);
    if (!text) return Status::ok();
    auto it = ids.find(*text);
    if (it == ids.end()) return format_error(name, fmt::format("tokenizer_config.json: {} '{}' is not in the vocabulary", key, *text));
    out = it->second;
    return Status::ok();
  };
  MOESERVE_RETURN_IF_ERROR(resolve("bos_token", vocab.bos_id));
  MOESERVE_RETURN_IF_ERROR(resolve("eos_token", vocab.eos_id));
  MOESERVE_RETURN_IF_ERROR(resolve("pad_token", vocab.pad_id));
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
    vocab.add_bos = config["add_bos_token"].get<bool>();
  }
  if (config.contains("chat_template")) {
    const json& t = config["chat_template"];
    if (t.is_string()) {
      vocab.chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // [{"name": "default", "template": "..."}, ...]
      for (const json& named : t) {
        if (named.is_object() && named.value("name", json()) == "default" && named.contains("template") &&
            named["template"].is_string()) {
          vocab.chat_template = named["template"].get<std::string>();
        }
      }
    }
  }
  return Status::ok();
}

Result<VocabData> parse_unchecked(std::string_view text, std::string_view config_text, std::string_view name) {
  json root = json::parse(text, nullptr, false);
  if (root.is_discarded()) return format_error(name, "not valid JSON");
  if (!root.is_object()) return format_error(name, "top level is not a JSON object");
  if (!root.contains("model") || !root["model"].is_object()) return format_error(name, "'model' is missing or not an object");
  VocabData vocab;
  vocab.source = std::string(name);
  const json& model = root["model"];
  MOESERVE_RETURN_IF_ERROR(check_bpe_options(name, model, vocab));
  const json* added = root.contains("added_tokens") && !root["added_tokens"].is_null() ? &root["added_tokens"] : nullptr;
  MOESERVE_RETURN_IF_ERROR(read_vocab(name, model, added, vocab));
  MOESERVE_RETURN_IF_ERROR(read_merges(name, model, vocab));
  MOESERVE_RETURN_IF_ERROR(read_normalizer(name, root, vocab));
  MOESERVE_RETURN_IF_ERROR(read_pre_tokenizer(name, root, vocab));
  if (!config_text.empty()) MOESERVE_RETURN_IF_ERROR(read_config(name, config_text, vocab));
  return vocab;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kIoError, "{}: cannot open", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return make_error(StatusCode::kIoError, "{}: read error", path);
  return text.str();
}

}  // namespace

std::optional<std::pair<std::string, std::string>> split_merge_string(std::string_view merge) {
  const size_t space = merge.find(' ');
  if (space == std::string_view::npos || space == 0 || space + 1 >= merge.size()) return std::nullopt;
  return std::pair<std::string, std::string>(merge.substr(0, space), merge.substr(space + 1));
}

Result<VocabData> parse_tokenizer_json(std::string_view tokenizer_json, std::string_view config_json,
                                       std::string_view name) {
  // The accessors above check types before reading, but a JSON library
  // exception must never escape as a crash on some shape we did not foresee.
  try {
    return parse_unchecked(tokenizer_json, config_json, name);
  } catch (const nlohmann::json::exception& e) {
    return format_error(name, std::string("unexpected JSON structure: ") + e.what());
  }
}

Result<VocabData> load_tokenizer_json(const std::string& path) {
  MOESERVE_ASSIGN_OR_RETURN(std::string text, read_file(path));
  std::string config_text;
  std::error_code ec;
  const std::filesystem::path config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::is_regular_file(config_path, ec)) {
    MOESERVE_ASSIGN_OR_RETURN(config_text, read_file(config_path.string()));
  }
  return parse_tokenizer_json(text, config_text, path);
}

}  // namespace moeserve::tok
