#include "convert/synthetic_vocab.h"

#include <fmt/format.h>

#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "format/model_keys.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"

namespace moeserve::convert {
namespace {

struct SpecialToken {
  std::string_view text;
  tok::TokenType type;
  int32_t qwen_id;  // the id in Qwen3's own vocabulary
};

// In the order they take the last ids of a small vocabulary.
constexpr SpecialToken kSpecialTokens[] = {
    {"<|endoftext|>", tok::TokenType::kControl, kQwenEndOfTextId},
    {"<|im_start|>", tok::TokenType::kControl, kQwenImStartId},
    {"<|im_end|>", tok::TokenType::kControl, kQwenImEndId},
    {"<tool_call>", tok::TokenType::kUserDefined, kQwenToolCallId},
    {"</tool_call>", tok::TokenType::kUserDefined, kQwenToolCallEndId},
    {"<think>", tok::TokenType::kUserDefined, kQwenThinkId},
    {"</think>", tok::TokenType::kUserDefined, kQwenThinkEndId},
};
constexpr int64_t kSpecialCount = std::size(kSpecialTokens);

// A pre-tokenized word of the corpus as a sequence of token ids.
struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

struct BpeState {
  std::vector<std::string> tokens;  // id -> byte-level text
  std::unordered_map<std::string, int32_t> ids;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<Word> words;
};

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

Status load_words(BpeState& st) {
  MOESERVE_ASSIGN_OR_RETURN(auto pre, tok::PreTokenizer::create("qwen2"));
  std::vector<std::string_view> pieces;
  pre->split(synthetic_vocab_corpus(), pieces);
  std::map<std::string_view, int64_t> counts;  // sorted: a deterministic word order
  for (std::string_view p : pieces) ++counts[p];
  for (const auto& [piece, count] : counts) {
    Word w;
    w.count = count;
    for (char c : piece) w.symbols.push_back(int32_t(uint8_t(c)));  // byte b has id b
    st.words.push_back(std::move(w));
  }
  return Status::ok();
}

// The most frequent adjacent pair (ties: smaller "a b" text); count 0 if none.
std::pair<uint64_t, int64_t> best_pair(const BpeState& st) {
  std::unordered_map<uint64_t, int64_t> counts;
  for (const Word& w : st.words) {
    for (size_t i = 0; i + 1 < w.symbols.size(); ++i) counts[pair_key(w.symbols[i], w.symbols[i + 1])] += w.count;
  }
  uint64_t best = 0;
  int64_t best_count = 0;
  auto text = [&](uint64_t key) { return st.tokens[key >> 32] + " " + st.tokens[uint32_t(key)]; };
  for (const auto& [key, count] : counts) {
    if (count > best_count || (count == best_count && text(key) < text(best))) {
      best = key;
      best_count = count;
    }
  }
  return {best, best_count};
}

void apply_merge(BpeState& st, int32_t a, int32_t b, int32_t merged) {
  for (Word& w : st.words) {
    size_t out = 0;
    for (size_t i = 0; i < w.symbols.size(); ++i) {
      if (i + 1 < w.symbols.size() && w.symbols[i] == a && w.symbols[i + 1] == b) {
        w.symbols[out++] = merged;
        ++i;
      } else {
        w.symbols[out++] = w.symbols[i];
      }
    }
    w.symbols.resize(out);
  }
}

// Learns up to `budget` merges; new tokens are appended to st.tokens.
void learn_merges(BpeState& st, int64_t budget) {
  while (int64_t(st.merges.size()) < budget) {
    const auto [key, count] = best_pair(st);
    if (count < 2) break;  // a pair seen once teaches nothing
    const int32_t a = int32_t(key >> 32), b = int32_t(uint32_t(key));
    std::string text = st.tokens[a] + st.tokens[b];
    auto [it, inserted] = st.ids.emplace(text, int32_t(st.tokens.size()));
    if (inserted) st.tokens.push_back(text);
    st.merges.emplace_back(st.tokens[a], st.tokens[b]);
    apply_merge(st, a, b, it->second);
  }
}

}  // namespace

Result<tok::VocabData> make_synthetic_vocab(const SyntheticVocabOptions& options) {
  const int64_t min_size = 256 + kSpecialCount;
  if (options.vocab_size < min_size || options.vocab_size > INT32_MAX) {
    return make_error(StatusCode::kInvalidArgument, "synthetic vocabulary: size {} is out of range (at least {})",
                      options.vocab_size, min_size);
  }
  const bool qwen_ids = options.vocab_size >= kQwenRealVocabSize;
  const int64_t special_start = qwen_ids ? kQwenEndOfTextId : options.vocab_size - kSpecialCount;

  BpeState st;
  const tok::ByteLevelAlphabet& alphabet = tok::ByteLevelAlphabet::get();
  for (int b = 0; b < 256; ++b) {
    st.tokens.push_back(alphabet.symbol(uint8_t(b)));
    st.ids.emplace(st.tokens.back(), b);
  }
  MOESERVE_RETURN_IF_ERROR(load_words(st));
  // Merged tokens must stay below the first special id.
  learn_merges(st, std::min(options.max_merges, special_start - 256));

  tok::VocabData v;
  v.tokens = std::move(st.tokens);
  v.merges = std::move(st.merges);
  v.token_types.assign(v.tokens.size(), int32_t(tok::TokenType::kNormal));
  v.tokens.reserve(size_t(options.vocab_size));
  while (int64_t(v.tokens.size()) < options.vocab_size) {
    v.tokens.push_back(fmt::format("[PAD{}]", v.tokens.size()));
    v.token_types.push_back(int32_t(tok::TokenType::kUnused));
  }
  for (int64_t i = 0; i < kSpecialCount; ++i) {
    const size_t id = size_t(qwen_ids ? kSpecialTokens[i].qwen_id : special_start + i);
    v.tokens[id] = std::string(kSpecialTokens[i].text);
    v.token_types[id] = int32_t(kSpecialTokens[i].type);
  }
  const int32_t end_of_text = int32_t(special_start), im_end = int32_t(special_start + 2);
  v.pre = "qwen2";
  v.normalization = tok::Normalization::kNfc;
  v.bos_id = end_of_text;
  v.pad_id = end_of_text;
  v.eos_id = im_end;
  v.add_bos = false;
  v.chat_template = std::string(qwen3_chat_template());
  v.source = fmt::format("synthetic vocabulary ({} tokens)", options.vocab_size);
  return v;
}

void set_vocab_metadata(GgufWriter& writer, const tok::VocabData& vocab) {
  writer.set_string(keys::kTokModel, "gpt2");
  writer.set_string(keys::kTokPre, vocab.pre);
  writer.set_string_array(keys::kTokTokens, vocab.tokens);
  std::vector<int32_t> types = vocab.token_types;
  if (types.empty()) types.assign(vocab.tokens.size(), int32_t(tok::TokenType::kNormal));
  writer.set_i32_array(keys::kTokTypes, std::move(types));
  std::vector<std::string> merges;
  merges.reserve(vocab.merges.size());
  for (const auto& [a, b] : vocab.merges) merges.push_back(a + " " + b);
  writer.set_string_array(keys::kTokMerges, std::move(merges));
  if (vocab.bos_id) writer.set_u32(keys::kTokBos, uint32_t(*vocab.bos_id));
  if (vocab.eos_id) writer.set_u32(keys::kTokEos, uint32_t(*vocab.eos_id));
  if (vocab.eot_id) writer.set_u32(keys::kTokEot, uint32_t(*vocab.eot_id));
  if (vocab.pad_id) writer.set_u32(keys::kTokPad, uint32_t(*vocab.pad_id));
  writer.set_bool(keys::kTokAddBos, vocab.add_bos);
  if (!vocab.chat_template.empty()) writer.set_string(keys::kChatTemplate, vocab.chat_template);
}

std::string_view qwen3_chat_template() {
  static constexpr std::string_view kTemplate =
#include "convert/qwen3_chat_template.inc"
      ;
  return kTemplate;
}

}  // namespace moeserve::convert
