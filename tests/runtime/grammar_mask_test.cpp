// Vocabulary masks under a grammar (runtime/grammar/token_mask.h) and the
// grammar constraint the engine uses (runtime/grammar_constraint.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/utf8_encode.h"
#include "runtime/grammar/token_mask.h"
#include "runtime/grammar_constraint.h"
#include "runtime/grammar_test_util.h"

namespace moeserve::runtime::grammar {
namespace {

using testing::compile;

// What the mask must be: each token's bytes fed on their own.
std::vector<uint8_t> brute_force(const GrammarState& state, const std::vector<std::string>& vocab) {
  std::vector<uint8_t> out(vocab.size(), 0);
  for (size_t id = 0; id < vocab.size(); ++id) {
    GrammarState s = state;
    out[id] = !vocab[id].empty() && s.feed_all(vocab[id]) ? 1 : 0;
  }
  return out;
}

std::vector<uint8_t> to_bytes(const TokenBitmask& bits, size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = (bits[i >> 6] >> (i & 63)) & 1;
  return out;
}

TEST(GrammarMask, TrieHoldsEveryTokenOnceItsBytesEnd) {
  const std::vector<std::string> vocab = {"ab", "a", "", "abc", "b", "ab", "\xC3", "\xC3\xA9"};
  TokenTrie trie(vocab);
  EXPECT_EQ(trie.vocab_size(), vocab.size());
  EXPECT_EQ(trie.node_count(), 7u);  // root, a, ab, abc, b, C3, C3 A9
  auto g = compile(R"(root ::= "ab" "c"? | [b-é]+)");
  std::vector<uint8_t> allowed;
  allowed_tokens(GrammarState(g), trie, allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{1, 1, 0, 1, 1, 1, 1, 1}));
  GrammarState after_a(g);
  ASSERT_TRUE(after_a.feed('a'));
  allowed_tokens(after_a, trie, allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{0, 0, 0, 0, 1, 0, 0, 0}));  // only "b" continues "a"
}

// A random grammar over a small alphabet (left-recursive ones are skipped).
// Built by appending (operator+ on strings trips a gcc 12 -Wrestrict false
// positive).
std::string random_grammar(std::mt19937& rng) {
  const char* atoms[] = {"\"a\"", "\"b\"", "\"ab\"", "\"é\"", "\"cé\"", "[ab]",
                         "[^a]",  "[a-c]", ".",      "[é-ê]", "\"\""};
  const char* postfix[] = {"", "", "", "*", "+", "?", "{2}", "{0,2}", "{1,}"};
  const int rules = 1 + int(rng() % 4);
  const auto name = [](int k) {
    std::string n = k == 0 ? "root" : "r";
    if (k != 0) n += std::to_string(k);
    return n;
  };
  std::function<void(int, std::string&)> seq = [&](int depth, std::string& s) {
    for (int i = 0, n = int(rng() % 4); i < n; ++i) {
      const int pick = int(rng() % 10);
      if (pick < 6 || depth > 2) {
        s += atoms[rng() % std::size(atoms)];
      } else if (pick < 8) {
        s += name(int(rng() % rules));
      } else {
        s += "(";
        seq(depth + 1, s);
        s += " | ";
        seq(depth + 1, s);
        s += ")";
      }
      s += postfix[rng() % std::size(postfix)];
      s += " ";
    }
  };
  std::string text;
  for (int r = 0; r < rules; ++r) {
    text += name(r);
    text += " ::= ";
    seq(0, text);
    if (rng() % 2) {
      text += " | ";
      seq(0, text);
    }
    text += "\n";
  }
  return text;
}

// For random grammars, states and vocabularies (with pieces of UTF-8
// characters), the trie walk gives exactly the tokens fed one by one, and so
// does the cache, and so does the walk when it may memoize only a few states.
TEST(GrammarMask, TrieWalkAgreesWithFeedingEveryToken) {
  std::mt19937 rng(3);
  const char alphabet[] = {'a', 'b', 'c', 'x', '\xC3', '\xA9', '\xAA'};
  MaskCache cache(64);
  int grammars = 0;
  int nonempty = 0;
  for (int round = 0; round < 300; ++round) {
    const std::string text = random_grammar(rng);
    auto parsed = parse_gbnf(text);
    if (!parsed) continue;  // left recursion, mostly
    ++grammars;
    std::vector<std::string> vocab;
    for (int i = 0; i < 200; ++i) {
      std::string t;
      for (size_t k = 0, n = 1 + rng() % 4; k < n; ++k) t += alphabet[rng() % std::size(alphabet)];
      vocab.push_back(rng() % 20 == 0 ? "" : t);
    }
    TokenTrie trie(vocab);
    GrammarState state(parsed.value());
    for (int step = 0; step < 6; ++step) {
      const std::vector<uint8_t> want = brute_force(state, vocab);
      std::vector<uint8_t> got;
      allowed_tokens(state, trie, got);
      ASSERT_EQ(got, want) << text << " step " << step;
      ASSERT_EQ(to_bytes(*cache.get(state, trie), vocab.size()), want) << text;
      ASSERT_EQ(to_bytes(*cache.get(state, trie), vocab.size()), want) << text;
      ASSERT_EQ(to_bytes(allowed_token_bits(state, trie, 2), vocab.size()), want) << text;
      nonempty += std::count(want.begin(), want.end(), 1) > 0;
      // Advance by one allowed byte, if any.
      const ByteSet next = state.next_bytes();
      std::vector<uint8_t> bytes;
      for (const char c : alphabet) {
        if (next.test(uint8_t(c))) bytes.push_back(uint8_t(c));
      }
      if (bytes.empty()) break;
      // (A very ambiguous grammar may pass the matcher's bounds: the byte is
      // then refused although a stack's top takes it.)
      if (!state.feed(bytes[rng() % bytes.size()])) break;
      if (state.stack_count() > 64) break;  // very ambiguous: slow to brute-force
    }
  }
  EXPECT_GT(grammars, 100);
  EXPECT_GT(nonempty, 300);
  EXPECT_GT(cache.stats().hits, 0u);
}

TEST(GrammarMask, CacheReusesMasksOfRepeatedStatesOnly) {
  auto g = compile(testing::kJsonGbnf);
  const std::vector<std::string> vocab = {"{", "\"", "a", "bc", "\":", " ", "1", "}", "\\", "\\n"};
  TokenTrie trie(vocab);
  MaskCache cache(2);
  GrammarState s(g);
  ASSERT_TRUE(s.feed_all("{\"a"));
  auto first = cache.get(s, trie);
  GrammarState t = s;
  ASSERT_TRUE(t.feed_all("bc"));  // still inside the same string: the same state
  auto second = cache.get(t, trie);
  EXPECT_EQ(first.get(), second.get());
  EXPECT_EQ(cache.stats().hits, 1u);
  // Another grammar with the same text is another key.
  GrammarState other(compile(testing::kJsonGbnf));
  ASSERT_TRUE(other.feed_all("{\"a"));
  EXPECT_NE(cache.get(other, trie).get(), first.get());
  // The LRU keeps two entries.
  GrammarState u(g);
  cache.get(u, trie);
  EXPECT_EQ(cache.stats().entries, 2u);
  EXPECT_EQ(to_bytes(*cache.get(s, trie), vocab.size()), brute_force(s, vocab));
}

TEST(GrammarConstraint, TokensFollowTheGrammarAndEndOnlyWhenComplete) {
  auto bytes = std::make_shared<std::vector<std::string>>(
      std::vector<std::string>{"{", "\"a\"", ":", " 1", "}", "x", "", "]", "<|end|>", "1}"});
  const int32_t kEnd = 8;
  auto trie = std::make_shared<const TokenTrie>(*bytes);
  auto cache = std::make_shared<MaskCache>();
  GrammarConstraint c(compile(testing::kJsonGbnf), bytes, {kEnd}, trie, cache);
  std::vector<uint8_t> mask;
  const auto check_mask = [&] {
    c.allowed_mask(12, mask);  // two ids past the table
    ASSERT_EQ(mask.size(), 12u);
    for (int32_t id = 0; id < 12; ++id) EXPECT_EQ(mask[size_t(id)] != 0, c.allows(id)) << id;
  };
  check_mask();
  EXPECT_TRUE(c.allows(0));
  EXPECT_FALSE(c.allows(5));
  EXPECT_FALSE(c.allows(6));  // no bytes
  EXPECT_FALSE(c.allows(kEnd));
  EXPECT_FALSE(c.allows(99));
  for (int32_t t : {0, 1, 2, 3}) {
    ASSERT_TRUE(c.allows(t)) << t;
    c.accept(t);
    check_mask();
  }
  EXPECT_FALSE(c.allows(kEnd));
  EXPECT_TRUE(c.allows(9));
  c.accept(4);
  check_mask();
  EXPECT_TRUE(c.allows(kEnd));
  EXPECT_EQ(mask[size_t(kEnd)], 1);
  EXPECT_FALSE(c.allows(3));
  // Without a trie the mask is the per-token loop, with the same answer.
  GrammarConstraint plain(compile(testing::kJsonGbnf), bytes, {kEnd}, nullptr, nullptr);
  plain.allowed_mask(12, mask);
  EXPECT_EQ(mask, (std::vector<uint8_t>{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
}

// A vocabulary shaped like a byte-level BPE one: every byte, ASCII words
// with and without a leading space, numbers, punctuation runs, JSON pieces,
// CJK / Cyrillic / accented pieces and pieces of multi-byte characters.
std::vector<std::string> synthetic_vocab(size_t n) {
  std::mt19937 rng(1);
  std::vector<std::string> vocab;
  std::unordered_set<std::string> seen;
  const auto cat = [](std::string a, const std::string& b) {
    a += b;  // appends (not operator+): gcc 12 -Wrestrict false positive
    return a;
  };
  const auto add = [&](std::string t) {
    if (!t.empty() && seen.insert(t).second) vocab.push_back(std::move(t));
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, char(b)));
  for (const char* p :
       {"{",      "}",      "[",     "]",    "\":",     "\",", "{\"",  "\"}",  "},",     "],",
        "\": \"", "\", \"", "\":\"", "\n",   "\n\n",    "  ",  "    ", "\n  ", "\n    ", "\t",
        " \"",    "\\n",    "\\\"",  "\\u",  "...",     "://", "==",   "!=",   "->",     "();",
        "});",    "\"\n",   "\":[",  "[{\"", "\"},{\"", ", ",  ". "}) {
    add(p);
  }
  for (int i = 0; i < 1000; ++i) add(std::to_string(i)), add(cat(" ", std::to_string(i)));
  const std::string cons = "bcdfghjklmnpqrstvwxz", vow = "aeiouy";
  const auto word = [&] {
    std::string w;
    for (size_t k = 0, syl = 1 + rng() % 4; k < syl; ++k) {
      w += cons[rng() % cons.size()];
      w += vow[rng() % vow.size()];
      if (rng() % 3 == 0) w += cons[rng() % cons.size()];
    }
    return w;
  };
  const auto utf8 = [](uint32_t cp) {
    std::string s;
    append_utf8(s, char32_t(cp));
    return s;
  };
  while (vocab.size() < n) {
    const int kind = int(rng() % 20);
    if (kind < 12) {
      std::string w = word();
      if (rng() % 3 == 0) w[0] = char(w[0] - 32);
      add(rng() % 2 ? cat(" ", w) : w);
      if (rng() % 8 == 0) add(cat("\"", w)), add(cat(w, "\":")), add(cat("_", w));
    } else if (kind < 15) {
      std::string s;
      for (size_t k = 0, m = 1 + rng() % 3; k < m; ++k) s += utf8(0x4E00 + rng() % 0x5200);
      add(s);
    } else if (kind < 17) {
      std::string s = rng() % 2 ? " " : "";
      for (size_t k = 0, m = 2 + rng() % 6; k < m; ++k) s += utf8(0x430 + rng() % 32);
      add(s);
    } else if (kind < 19) {
      add(cat(cat(word(), utf8(0xE0 + rng() % 32)), word()));
    } else {
      const std::string c = utf8(0x4E00 + rng() % 0x5200);
      add(rng() % 2 ? c.substr(0, 1 + rng() % 2) : c.substr(1 + rng() % 2));  // a piece of a character
    }
  }
  return vocab;
}

// Prints what masking a Qwen-sized vocabulary costs under the JSON grammar
// (timings are printed, never asserted: machines differ).
TEST(GrammarMask, TimingOnAQwenSizedVocabulary) {
  const std::vector<std::string> vocab = synthetic_vocab(151936);
  const auto t0 = std::chrono::steady_clock::now();
  TokenTrie trie(vocab);
  const auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  std::printf("[ timing   ] trie: %zu tokens, %zu nodes, built in %.1f ms\n", vocab.size(), trie.node_count(),
              ms(t0, std::chrono::steady_clock::now()));
  auto g = compile(testing::kJsonGbnf);
  MaskCache cache;
  const std::pair<const char*, std::string> states[] = {
      {"start", ""},
      {"key string", "{\"na"},
      {"after key", "{\"name\""},
      {"value", "{\"name\": "},
      {"value string", "{\"name\": \"Jo"},
      {"number", "{\"n\": [1, 23"},
      {"nested", "{\"a\": [{\"b\": {\"c\": [\"x"},
  };
  // Every 8th token is checked against feeding it (all of them would take
  // seconds, minutes under the sanitizers; the random test checks all).
  constexpr size_t kStride = 8;
  std::vector<std::string> sample;
  for (size_t id = 0; id < vocab.size(); id += kStride) sample.push_back(vocab[id]);
  for (const auto& [name, prefix] : states) {
    GrammarState s(g);
    ASSERT_TRUE(s.feed_all(prefix)) << prefix;
    // A miss: the best of a few walks (one walk alone is noisy).
    double miss_ms = 1e9;
    TokenBitmask bits;
    for (int rep = 0; rep < 5; ++rep) {
      const auto a = std::chrono::steady_clock::now();
      bits = allowed_token_bits(s, trie);
      miss_ms = std::min(miss_ms, ms(a, std::chrono::steady_clock::now()));
    }
    // A hit as GrammarConstraint::allowed_mask has it: the lookup, then the
    // bits spread into one byte per token.
    cache.get(s, trie);
    const auto b = std::chrono::steady_clock::now();
    auto hit = cache.get(s, trie);
    std::vector<uint8_t> allowed(vocab.size(), 0);
    for (size_t w = 0; w < hit->size(); ++w) {
      for (uint64_t word = (*hit)[w]; word != 0; word &= word - 1) {
        allowed[w * 64 + size_t(__builtin_ctzll(word))] = 1;
      }
    }
    const auto c = std::chrono::steady_clock::now();
    const std::vector<uint8_t> want = brute_force(s, sample);
    const auto d = std::chrono::steady_clock::now();
    for (size_t i = 0; i < sample.size(); ++i) {
      ASSERT_EQ(allowed[i * kStride], want[i]) << name << " token " << i * kStride;
    }
    EXPECT_EQ(to_bytes(bits, vocab.size()), allowed) << name;
    const size_t n_allowed = size_t(std::count(allowed.begin(), allowed.end(), 1));
    std::printf(
        "[ timing   ] %-12s %6zu allowed: miss %6.2f ms, hit %6.3f ms (feeding every token: ~%.0f ms)\n",
        name, n_allowed, miss_ms, ms(b, c), ms(c, d) * kStride);
  }
}

}  // namespace
}  // namespace moeserve::runtime::grammar
