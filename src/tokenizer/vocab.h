// VocabData: everything a byte-level BPE tokenizer needs, as plain data.
//
// Filled from a Hugging Face tokenizer.json (load_tokenizer_json) or from GGUF
// metadata (vocab_gguf.h); the Tokenizer validates it when it is built.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace moeserve::tok {

// tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // special tokens (<|im_start|>); skipped by decode(skip_special)
  kUserDefined = 4,  // added but not special (<think>); always split out, always decoded
  kUnused = 5,       // padding slots; never produced, decode to nothing
  kByte = 6,
};

enum class Normalization {
  kNone,
  kNfc,  // Unicode NFC on the text between added tokens (Qwen's tokenizer.json)
};

struct VocabData {
  std::vector<std::string> tokens;  // id -> text (byte-level form for normal tokens)
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<int32_t> token_types;  // TokenType per id; empty means all normal
  std::string pre;  // pre-tokenizer name: qwen2 | qwen35
  Normalization normalization = Normalization::kNone;
  bool ignore_merges = false;  // a piece that is itself a token is not merged
  std::optional<int32_t> bos_id, eos_id, eot_id, pad_id;
  bool add_bos = false;
  std::string chat_template;
  std::string source;  // where it came from, for error messages
};

// Reads a Hugging Face tokenizer.json (BPE model, byte-level, a Split regex we
// recognise) and, when present, the tokenizer_config.json next to it (bos/eos/
// pad tokens, add_bos_token, chat_template).
Result<VocabData> load_tokenizer_json(const std::string& path);

// The same from in-memory text; `config_json` may be empty. `name` is used in
// error messages.
Result<VocabData> parse_tokenizer_json(std::string_view tokenizer_json, std::string_view config_json,
                                       std::string_view name);

// "a b" (GGUF / old tokenizer.json merges) -> {"a", "b"}; split at the first
// space, since byte-level tokens never contain a raw space.
std::optional<std::pair<std::string, std::string>> split_merge_string(std::string_view merge);

}  // namespace moeserve::tok
