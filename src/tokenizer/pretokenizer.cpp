#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>

namespace moeserve::tok {
namespace {

// Unicode White_Space, for use inside a character class.
constexpr const char* kWhiteSpace =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Builds the Qwen pattern with our explicit whitespace class. `letters` is the
// class of word characters and `punct_excluded` what a punctuation run may not
// contain besides whitespace.
std::string qwen_pattern(std::string_view letters, std::string_view punct_excluded) {
  const std::string ws = kWhiteSpace;
  std::string p;
  p += R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))";
  p += R"(|[^\r\n\p{L}\p{N}]?)" + std::string(letters) + "+";
  p += R"(|\p{N})";
  p += "| ?[^" + ws + std::string(punct_excluded) + R"(]+[\r\n]*)";
  p += "|[" + ws + R"(]*[\r\n]+)";
  p += "|[" + ws + "]+(?![^" + ws + "])";
  p += "|[" + ws + "]+";
  return p;
}

struct KnownPattern {
  const char* pre;
  std::array<const char*, 2> hf_spellings;  // tokenizer.json / llama.cpp forms
};

const std::array<KnownPattern, 2>& known_patterns() {
  static const std::array<KnownPattern, 2> patterns = {{
      {"qwen2",
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
        R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {"qwen35",
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
        R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
  }};
  return patterns;
}

std::optional<std::string> pattern_for_pre(std::string_view pre) {
  if (pre == "qwen2" || pre == "laguna") return qwen_pattern(R"(\p{L})", R"(\p{L}\p{N})");
  if (pre == "qwen35") return qwen_pattern(R"([\p{L}\p{M}])", R"(\p{L}\p{M}\p{N})");
  return std::nullopt;
}

// One JIT stack per thread: the default (32 KiB on the machine stack) is too
// small for long whitespace runs, and a shared one would need a lock.
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* stack) const { pcre2_jit_stack_free(stack); }
};
pcre2_jit_stack* thread_jit_stack() {
  thread_local std::unique_ptr<pcre2_jit_stack, JitStackDeleter> stack(
      pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr));
  return stack.get();
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* context) const { pcre2_match_context_free(context); }
};

}  // namespace

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::string pre, std::unique_ptr<Compiled> compiled)
    : pre_(std::move(pre)), compiled_(std::move(compiled)) {}

PreTokenizer::~PreTokenizer() = default;

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::create(std::string_view pre) {
  const std::optional<std::string> pattern = pattern_for_pre(pre);
  if (!pattern) {
    return make_error(StatusCode::kUnsupported,
                      "pre-tokenizer '{}' is not supported (supported: qwen2, qwen35, laguna)", pre);
  }
  auto compiled = std::make_unique<Compiled>();
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern->data()), pattern->size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error_code, &error_offset, nullptr);
  if (compiled->code == nullptr) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error_code, message.data(), message.size());
    return make_error(StatusCode::kInternal, "pre-tokenizer '{}': regex does not compile at offset {}: {}",
                      pre, error_offset, reinterpret_cast<const char*>(message.data()));
  }
  // JIT is an optimisation only: without it (not built in, or no executable
  // memory) the interpreter gives the same matches.
  compiled->jit = pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<PreTokenizer>(new PreTokenizer(std::string(pre), std::move(compiled)));
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  if (pre_ != "laguna") return split_regex(text, pieces);
  // Laguna (llama.cpp's LLAMA_VOCAB_PRE_TYPE_LAGUNA): runs of newlines and
  // runs of anything else first, then the Qwen2 pattern inside each run.
  size_t start = 0;
  while (start < text.size()) {
    const bool newline = text[start] == '\n';
    size_t end = start;
    while (end < text.size() && (text[end] == '\n') == newline) ++end;
    split_regex(text.substr(start, end - start), pieces);
    start = end;
  }
}

void PreTokenizer::split_regex(std::string_view text, std::vector<std::string_view>& pieces) const {
  if (text.empty()) return;
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
      pcre2_match_data_create_from_pattern(compiled_->code, nullptr));
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> context(pcre2_match_context_create(nullptr));
  if (!match || !context) {  // out of memory: keep going, unsplit
    pieces.push_back(text);
    return;
  }
  if (compiled_->jit) pcre2_jit_stack_assign(context.get(), nullptr, thread_jit_stack());

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    // The text was validated by the caller, hence NO_UTF_CHECK (which also
    // keeps each call O(piece) instead of O(text)).
    int rc = pcre2_match(compiled_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, match.get(),
                         context.get());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(compiled_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       match.get(), context.get());
    }
    if (rc < 0) {  // no match (cannot happen: the last alternatives cover everything) or a limit
      pieces.push_back(text.substr(offset));
      return;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t start = ovector[0], end = ovector[1];
    if (start > offset) pieces.push_back(text.substr(offset, start - offset));  // unmatched gap
    if (end <= start) {
      // An empty match would loop forever; step over one character instead.
      size_t next = start + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
      pieces.push_back(text.substr(start, next - start));
      offset = next;
      continue;
    }
    pieces.push_back(text.substr(start, end - start));
    offset = end;
  }
}

std::optional<std::string> pre_name_for_hf_regex(std::string_view regex) {
  for (const KnownPattern& known : known_patterns()) {
    for (const char* spelling : known.hf_spellings) {
      if (regex == spelling) return std::string(known.pre);
    }
  }
  return std::nullopt;
}

}  // namespace moeserve::tok
