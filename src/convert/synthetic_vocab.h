// The byte-level BPE vocabulary embedded in synthetic models (make-model).
//
// Layout of the vocabulary:
//   ids 0..255       the 256 byte symbols of the GPT-2 byte-level alphabet, in
//                    byte order (type normal, as in Hugging Face gpt2 vocabs);
//   then             one token per merge, learned at build time from a small
//                    embedded English/code text (synthetic_vocab_corpus()) with
//                    the qwen2 pre-tokenizer: repeatedly merge the most frequent
//                    adjacent pair (ties: the lexicographically smaller "a b"),
//                    until the merge budget is spent or no pair occurs twice;
//   then             "[PAD<id>]" placeholders (type unused) up to the size;
//   special tokens   <|endoftext|> (bos, pad), <|im_start|>, <|im_end|> (eos) as
//                    control tokens; <tool_call>, </tool_call>, <think>, </think>
//                    as user-defined tokens. With a vocabulary of at least
//                    151669 they sit at Qwen3's real ids (151643, 151644,
//                    151645, 151657, 151658, 151667, 151668); smaller
//                    vocabularies put them, in that order, in the last 7 ids.
// tokenizer.ggml.model "gpt2", pre "qwen2", add_bos false, and Qwen3's chat
// template (qwen3_chat_template.inc).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/status.h"
#include "format/gguf_writer.h"
#include "tokenizer/vocab.h"

namespace moeserve::convert {

struct SyntheticVocabOptions {
  int64_t vocab_size = 2048;
  // Upper bound on learned merges (the embedded text yields about 390).
  int64_t max_merges = 4000;
};

// Deterministic: the same options always give the same vocabulary.
// kInvalidArgument when vocab_size cannot hold the bytes and special tokens.
Result<tok::VocabData> make_synthetic_vocab(const SyntheticVocabOptions& options);

// Writes the tokenizer.* keys (tokens, token types, merges, model, pre, special
// ids, add_bos, chat template) of `vocab`.
void set_vocab_metadata(GgufWriter& writer, const tok::VocabData& vocab);

// Qwen3's chat template, verbatim (tests/reference/templates/qwen3.jinja).
std::string_view qwen3_chat_template();

// The text the merges are learned from.
std::string_view synthetic_vocab_corpus();

// Qwen3's ids of its special tokens (used when the vocabulary is large enough).
inline constexpr int32_t kQwenEndOfTextId = 151643;
inline constexpr int32_t kQwenImStartId = 151644;
inline constexpr int32_t kQwenImEndId = 151645;
inline constexpr int32_t kQwenToolCallId = 151657;
inline constexpr int32_t kQwenToolCallEndId = 151658;
inline constexpr int32_t kQwenThinkId = 151667;
inline constexpr int32_t kQwenThinkEndId = 151668;
inline constexpr int64_t kQwenRealVocabSize = 151669;  // ids in use in Qwen3's tokenizer.json

}  // namespace moeserve::convert
