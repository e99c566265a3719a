// A hand-made byte-level vocabulary for unit tests: the 256 byte symbols
// (ids 0..255, in byte order), a few merges chosen to expose merge-order
// bugs, and added tokens that overlap each other.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/vocab.h"

namespace moeserve::tok::testing {

// Ids of the non-byte tokens, in the order tiny_vocab() appends them.
enum TinyId : int32_t {
  kBC = 256,     // "bc"
  kAB,           // "ab"
  kABC,          // "abc" (only via "a"+"bc")
  kAA,           // "aa"
  kSpaceA,       // "Ġa"
  kSpaceABC,     // "Ġabc"
  kImStart,      // <|im_start|> control
  kImEnd,        // <|im_end|> control
  kIm,           // <|im user-defined (a prefix of the two above)
  kThink,        // <think> user-defined
  kEndOfText,    // <|endoftext|> control, the bos
  kUnusedSlot,   // an unused padding slot
  kTinyVocabSize,
};

inline VocabData tiny_vocab() {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  VocabData v;
  v.source = "tiny";
  v.pre = "qwen2";
  v.normalization = Normalization::kNfc;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(alphabet.symbol(static_cast<uint8_t>(b)));
    v.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  auto add = [&](std::string text, TokenType type) {
    v.tokens.push_back(std::move(text));
    v.token_types.push_back(static_cast<int32_t>(type));
  };
  add("bc", TokenType::kNormal);
  add("ab", TokenType::kNormal);
  add("abc", TokenType::kNormal);
  add("aa", TokenType::kNormal);
  add("\xC4\xA0" "a", TokenType::kNormal);  // "Ġa"
  add("\xC4\xA0" "abc", TokenType::kNormal);
  add("<|im_start|>", TokenType::kControl);
  add("<|im_end|>", TokenType::kControl);
  add("<|im", TokenType::kUserDefined);
  add("<think>", TokenType::kUserDefined);
  add("<|endoftext|>", TokenType::kControl);
  add("[PAD]", TokenType::kUnused);
  // Rank order matters: "b c" before "a b", so "abc" becomes a+bc -> abc;
  // a left-to-right merger would make ab+c and get stuck (no "ab c").
  v.merges = {{"b", "c"}, {"a", "b"}, {"a", "bc"}, {"a", "a"}, {"\xC4\xA0", "a"}, {"\xC4\xA0" "a", "bc"}};
  v.bos_id = kEndOfText;
  v.eos_id = kImEnd;
  return v;
}

}  // namespace moeserve::tok::testing
