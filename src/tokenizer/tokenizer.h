// Byte-level BPE tokenizer (Qwen2 / Qwen3 / Qwen3.5 family).
//
// encode(text):
//   1. invalid UTF-8 becomes U+FFFD (WHATWG decoding: one per maximal
//      invalid subpart), so the result is what a JavaScript tokenizer gives for
//      the same bytes decoded by TextDecoder;
//   2. added tokens are split out, leftmost-longest (control tokens only when
//      parse_special; user-defined ones such as <think> always);
//   3. each remaining segment is NFC-normalised (when the vocab says so) and
//      pre-tokenized with the regex;
//   4. each piece's bytes are mapped to the byte-level alphabet and merged by
//      BPE rank.
// decode(ids) is the inverse byte mapping; its result may end in (or contain)
// incomplete UTF-8 when the ids split a character — IncrementalDecoder is the
// streaming form that only ever returns complete characters.
//
// A Tokenizer is immutable after create(); encode/decode may be called from
// many threads at once (the piece cache is sharded and lock-protected).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace moeserve::tok {

// A byte range [begin, end) of a text.
struct TextRange {
  size_t begin = 0, end = 0;
};

struct EncodeOptions {
  bool parse_special = true;    // split control tokens out of the text
  std::optional<bool> add_bos;  // nullopt: the vocab's add_bos
  // With parse_special: byte ranges (ascending, disjoint) in which a control
  // token's text is plain text (a chat prompt's user content, so that a user
  // cannot forge a turn). Offsets refer to `text`; if text is not valid
  // UTF-8 (sanitizing would move them), no control token is split out at all.
  std::span<const TextRange> literal_ranges;
};

struct DecodeOptions {
  bool skip_special = false;  // drop control tokens
};

class Tokenizer {
 public:
  // Validates the vocabulary: unique token texts, merges naming existing
  // tokens whose concatenation is a token, special ids in range, every
  // byte-level symbol present, a supported pre-tokenizer.
  static Result<std::unique_ptr<Tokenizer>> create(VocabData vocab);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Ids that are out of range are skipped.
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& options = {}) const;

  // The pieces the pre-tokenizer makes of `text` (after UTF-8 sanitizing and
  // normalization; no added-token splitting). For tests and diagnostics.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  bool is_valid_id(int32_t id) const { return id >= 0 && id < vocab_size(); }
  // The vocabulary text of a token ("Ġworld", "<|im_end|>"); empty if invalid.
  const std::string& token_text(int32_t id) const;
  // The bytes a token stands for (" world"); empty if invalid or unused.
  const std::string& token_to_bytes(int32_t id) const;
  TokenType token_type(int32_t id) const;
  bool is_control(int32_t id) const { return token_type(id) == TokenType::kControl; }
  // Exact lookup of a vocabulary text.
  std::optional<int32_t> find_token(std::string_view text) const;
  // The texts of the control tokens ("<|im_start|>", ...).
  const std::vector<std::string_view>& control_texts() const { return control_texts_; }

  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  std::optional<int32_t> eot_id() const { return eot_id_; }
  std::optional<int32_t> pad_id() const { return pad_id_; }
  bool add_bos() const { return add_bos_; }
  const std::string& chat_template() const { return chat_template_; }
  const std::string& pre() const { return pre_->pre(); }

 private:
  Tokenizer() = default;
  Status build(VocabData& vocab);
  Status build_merges(const VocabData& vocab);
  void index_added_tokens();

  struct Segment {
    std::string_view text;
    int32_t added_id;  // >= 0: the segment is this added token
  };
  void split_added_tokens(std::string_view text, bool parse_special, std::span<const TextRange> literal,
                          std::vector<Segment>& out) const;
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;
  std::vector<std::string> token_bytes_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string_view, int32_t> ids_;  // views into tokens_
  std::array<int32_t, 256> byte_ids_{};
  BpeMerger merger_;
  std::unique_ptr<PreTokenizer> pre_;
  Normalization normalization_ = Normalization::kNone;
  bool ignore_merges_ = false;

  // Added tokens grouped by first byte, longest first, for leftmost-longest
  // matching.
  std::array<std::vector<int32_t>, 256> added_by_first_byte_;
  std::vector<std::string_view> control_texts_;  // views into tokens_

  std::optional<int32_t> bos_id_, eos_id_, eot_id_, pad_id_;
  bool add_bos_ = false;
  std::string chat_template_;

  // Bounded cache of merged pieces (a shard is simply emptied when full).
  struct PieceHash {
    using is_transparent = void;  // look up by string_view without a copy
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct CacheShard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, PieceHash, std::equal_to<>> pieces;
  };
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheEntriesPerShard = 4096;
  static constexpr size_t kMaxCachedPieceBytes = 64;
  mutable std::array<CacheShard, kCacheShards> cache_;
};

// Turns a stream of ids into text, returning only complete UTF-8 characters.
// A byte sequence that can no longer become a valid character comes out as
// U+FFFD (never stalls); flush() turns a held incomplete tail into U+FFFD.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, DecodeOptions options = {})
      : tokenizer_(tokenizer), options_(options) {}
  std::string feed(int32_t id);
  std::string flush();
  bool has_pending() const { return utf8_.has_pending(); }

 private:
  const Tokenizer& tokenizer_;
  DecodeOptions options_;
  Utf8StreamDecoder utf8_;
};

}  // namespace moeserve::tok
