#include "tokenizer/vocab_gguf.h"

namespace moeserve::tok {
namespace {

// An optional token id: absent (or negative, which some converters write for
// "none") is nullopt; present with a non-integer type is an error.
Status read_optional_id(const GgufFile& gguf, std::string_view key, std::optional<int32_t>& out) {
  if (!gguf.has(key)) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(int64_t id, gguf.require_int(key));
  if (id < 0) return Status::ok();
  if (id > INT32_MAX) return make_error(StatusCode::kInvalidFormat, "{}: {} = {} is out of range", gguf.name(), key, id);
  out = static_cast<int32_t>(id);
  return Status::ok();
}

Status read_token_types(const GgufFile& gguf, VocabData& vocab) {
  constexpr std::string_view kKey = "tokenizer.ggml.token_type";
  if (!gguf.has(kKey)) return Status::ok();
  MOESERVE_ASSIGN_OR_RETURN(std::vector<int64_t> types, gguf.require_int_array(kKey));
  vocab.token_types.reserve(types.size());
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] < 0 || types[i] > static_cast<int64_t>(TokenType::kByte)) {
      return make_error(StatusCode::kInvalidFormat, "{}: {}[{}] = {} is not a token type (0..6)", gguf.name(), kKey,
                        i, types[i]);
    }
    vocab.token_types.push_back(static_cast<int32_t>(types[i]));
  }
  return Status::ok();
}

Status read_merges(const GgufFile& gguf, VocabData& vocab) {
  constexpr std::string_view kKey = "tokenizer.ggml.merges";
  MOESERVE_ASSIGN_OR_RETURN(const std::vector<std::string>* merges, gguf.require_string_array(kKey));
  vocab.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    auto pair = split_merge_string((*merges)[i]);
    if (!pair) {
      return make_error(StatusCode::kInvalidFormat, "{}: {}[{}] {} is not 'a b'", gguf.name(), kKey, i,
                        gguf_escape((*merges)[i]));
    }
    vocab.merges.push_back(std::move(*pair));
  }
  return Status::ok();
}

}  // namespace

Result<VocabData> vocab_from_gguf(const GgufFile& gguf) {
  VocabData vocab;
  vocab.source = gguf.name();
  MOESERVE_ASSIGN_OR_RETURN(std::string_view model, gguf.require_string("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return make_error(StatusCode::kUnsupported,
                      "{}: tokenizer.ggml.model '{}' is not supported (only 'gpt2', byte-level BPE)", gguf.name(),
                      model);
  }
  MOESERVE_ASSIGN_OR_RETURN(std::string_view pre, gguf.require_string("tokenizer.ggml.pre"));
  vocab.pre = std::string(pre);
  if (vocab.pre == "qwen2" || vocab.pre == "qwen35") vocab.normalization = Normalization::kNfc;

  MOESERVE_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens, gguf.require_string_array("tokenizer.ggml.tokens"));
  vocab.tokens = *tokens;
  MOESERVE_RETURN_IF_ERROR(read_token_types(gguf, vocab));
  MOESERVE_RETURN_IF_ERROR(read_merges(gguf, vocab));

  MOESERVE_RETURN_IF_ERROR(read_optional_id(gguf, "tokenizer.ggml.bos_token_id", vocab.bos_id));
  MOESERVE_RETURN_IF_ERROR(read_optional_id(gguf, "tokenizer.ggml.eos_token_id", vocab.eos_id));
  MOESERVE_RETURN_IF_ERROR(read_optional_id(gguf, "tokenizer.ggml.eot_token_id", vocab.eot_id));
  MOESERVE_RETURN_IF_ERROR(read_optional_id(gguf, "tokenizer.ggml.padding_token_id", vocab.pad_id));
  if (gguf.has("tokenizer.ggml.add_bos_token")) {
    MOESERVE_ASSIGN_OR_RETURN(vocab.add_bos, gguf.require_bool("tokenizer.ggml.add_bos_token"));
  }
  if (gguf.has("tokenizer.chat_template")) {
    MOESERVE_ASSIGN_OR_RETURN(std::string_view chat_template, gguf.require_string("tokenizer.chat_template"));
    vocab.chat_template = std::string(chat_template);
  }
  return vocab;
}

}  // namespace moeserve::tok
