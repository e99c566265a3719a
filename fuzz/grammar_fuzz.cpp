// libFuzzer target for the grammar engine (runtime/grammar): the input is
// GBNF text, a NUL byte, then bytes to feed. The text is compiled under small
// limits and must either compile or give a positioned kInvalidArgument. A
// compiled grammar is run over the bytes: feeding them one at a time and all
// at once must agree, and the mask of a small fixed vocabulary (pieces of
// UTF-8 characters included) must be exactly the tokens that feed on their
// own.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/matcher.h"
#include "runtime/grammar/token_mask.h"

using moeserve::StatusCode;
using moeserve::runtime::grammar::allowed_token_bits;
using moeserve::runtime::grammar::GrammarLimits;
using moeserve::runtime::grammar::GrammarState;
using moeserve::runtime::grammar::parse_gbnf;
using moeserve::runtime::grammar::TokenTrie;

namespace {

const std::vector<std::string>& vocab() {
  static const std::vector<std::string> v = {
      "a",        "b",        "ab",   "aaa",  "x",    "{",    "}",        "[",         "]",
      "\"",       ":",        ",",    " ",    "\n",   "\\",   "-",        ".",         "e",
      "0",        "12",       "true", "null", "\xC3", "\xA9", "\xC3\xA9", "\xC3\xA9!", "\xE4\xB8\xAD",
      "\xF0\x9F", "\x98\x80", "",     "{\"",  "\":",  "a b"};
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t split = in.find('\0');
  const std::string_view text = in.substr(0, split);
  std::string_view bytes = split == std::string_view::npos ? std::string_view() : in.substr(split + 1);
  if (bytes.size() > 256) bytes = bytes.substr(0, 256);  // keeps ambiguous grammars quick

  const GrammarLimits limits{
      .max_text_bytes = 4096, .max_rules = 256, .max_elements = 20000, .max_nesting = 32};
  auto g = parse_gbnf(text, limits);
  if (!g.is_ok()) {
    if (g.status().code() != StatusCode::kInvalidArgument) __builtin_trap();
    if (!g.status().message().starts_with("grammar line ")) __builtin_trap();
    return 0;
  }
  GrammarState one(g.value());
  size_t fed = 0;
  while (fed < bytes.size() && one.feed(uint8_t(bytes[fed]))) ++fed;
  GrammarState all(g.value());
  const bool whole = all.feed_all(bytes);
  if (whole != (fed == bytes.size())) __builtin_trap();
  if (whole && !(all == one)) __builtin_trap();
  if (!whole && !(all == GrammarState(g.value()))) __builtin_trap();  // all or nothing
  if (all == one && all.fingerprint() != one.fingerprint()) __builtin_trap();
  (void)one.complete();
  (void)one.can_continue();

  static const TokenTrie trie(vocab());
  const auto bits = allowed_token_bits(one, trie);
  for (size_t id = 0; id < vocab().size(); ++id) {
    GrammarState s = one;
    const bool want = !vocab()[id].empty() && s.feed_all(vocab()[id]);
    const bool got = (bits[id >> 6] >> (id & 63)) & 1;
    if (want != got) __builtin_trap();
  }
  return 0;
}
