// GGUF metadata -> VocabData (tokenizer.ggml.* keys; see
// model-and-format-specs.md §1 "Tokenizer keys").
#pragma once

#include "core/status.h"
#include "format/gguf.h"
#include "tokenizer/vocab.h"

namespace moeserve::tok {

// Requires tokenizer.ggml.model == "gpt2" (byte-level BPE) and a known
// tokenizer.ggml.pre. GGUF does not record the Hugging Face normalizer; for
// the Qwen pre-tokenizers (qwen2, qwen35) NFC is assumed, because their
// tokenizer.json declares it and that is what the models were trained with
// (llama.cpp skips it; the two differ only on text that is not already NFC).
Result<VocabData> vocab_from_gguf(const GgufFile& gguf);

}  // namespace moeserve::tok
