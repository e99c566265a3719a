// tokenizer.json (+ tokenizer_config.json, generation_config.json) -> GGUF
// tokenizer.* keys, as llama.cpp's converter writes them for Qwen.
#pragma once
#include <cstdint>
#include <string>

#include "convert/hf_config.h"
#include "core/status.h"
#include "format/gguf_writer.h"
#include "tokenizer/vocab.h"

namespace moeserve::convert {

// Reads DIR/tokenizer.json (and its tokenizer_config.json). When the
// tokenizer config names no eos, the first eos_token_id of
// generation_config.json (else config.json) is used; likewise for bos.
Result<tok::VocabData> load_hf_vocab(const std::string& dir, const HfModelConfig& config);

// Writes tokenizer.ggml.{model=gpt2, pre, tokens, token_type, merges ("a b"),
// bos/eos/padding ids, add_bos_token} and tokenizer.chat_template. The token
// list is padded to `n_vocab` (the embedding's rows; Qwen pads 151669 tokens
// to 151936) with "[PAD{id}]" tokens of type unused (5), so ids line up with
// embedding rows. More tokens than rows is an error.
Status write_vocab_keys(const tok::VocabData& vocab, int64_t n_vocab, GgufWriter& writer);

}  // namespace moeserve::convert
