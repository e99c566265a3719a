// Regex pre-tokenizer: splits text into the pieces that BPE then works on
// independently (words with their leading space, single digits, punctuation
// runs, whitespace runs...).
//
// Supported kinds (the `tokenizer.ggml.pre` names):
//   qwen2  — Qwen2/Qwen3/Qwen3-MoE/Qwen3-Next
//   qwen35 — Qwen3.5: combining marks (\p{M}) stay with their letters
//   laguna — Laguna: newline runs split off first, then the qwen2 pattern
// Both patterns are compiled with PCRE2 in UTF + UCP mode (JIT when present).
// `\s` is spelled out as the Unicode White_Space property, which is what the
// Rust `tokenizers` crate (Oniguruma) matches; PCRE2's and JavaScript's own
// `\s` each differ from it by a character or two (U+0085, U+180E, U+FEFF).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::tok {

class PreTokenizer {
 public:
  // `pre` is a tokenizer.ggml.pre name; unknown names are kUnsupported.
  static Result<std::unique_ptr<PreTokenizer>> create(std::string_view pre);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the pieces of `valid_utf8` (in order, together covering all of it)
  // to `pieces`. Thread-safe. If the regex engine gives up (resource limits on
  // hostile input) the unmatched rest becomes one piece rather than failing.
  void split(std::string_view valid_utf8, std::vector<std::string_view>& pieces) const;

  const std::string& pre() const { return pre_; }

 private:
  struct Compiled;
  PreTokenizer(std::string pre, std::unique_ptr<Compiled> compiled);
  void split_regex(std::string_view valid_utf8, std::vector<std::string_view>& pieces) const;
  std::string pre_;
  std::unique_ptr<Compiled> compiled_;
};

// The tokenizer.json Split regex -> our pre name ("qwen2", "qwen35"), or
// nullopt for a pattern we do not know. Both the Hugging Face spelling
// (`(?i:'s|'t|...)`) and llama.cpp's (`(?:'[sS]|'[tT]|...)`) are recognised.
std::optional<std::string> pre_name_for_hf_regex(std::string_view regex);

}  // namespace moeserve::tok
