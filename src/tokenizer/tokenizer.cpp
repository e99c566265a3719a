#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/byte_level.h"
#include "tokenizer/nfc.h"

namespace moeserve::tok {
namespace {

bool is_added_type(TokenType type) { return type == TokenType::kControl || type == TokenType::kUserDefined; }

// Added tokens are stored and matched as their literal text; every other
// token is in the byte-level alphabet.
bool is_literal_type(TokenType type) { return is_added_type(type) || type == TokenType::kUnused; }

Status check_special_id(const VocabData& vocab, const char* what, const std::optional<int32_t>& id) {
  if (id && (*id < 0 || static_cast<size_t>(*id) >= vocab.tokens.size())) {
    return make_error(StatusCode::kInvalidFormat, "{}: {} id {} is outside the vocabulary (size {})",
                      vocab.source, what, *id, vocab.tokens.size());
  }
  return Status::ok();
}

}  // namespace

Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::create(VocabData vocab) {
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  MOESERVE_RETURN_IF_ERROR(tokenizer->build(vocab));
  return tokenizer;
}

Status Tokenizer::build(VocabData& vocab) {
  const std::string& src = vocab.source;
  if (vocab.tokens.empty()) return make_error(StatusCode::kInvalidFormat, "{}: the vocabulary is empty", src);
  if (vocab.tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return make_error(StatusCode::kOutOfRange, "{}: {} tokens is too many", src, vocab.tokens.size());
  }
  if (!vocab.token_types.empty() && vocab.token_types.size() != vocab.tokens.size()) {
    return make_error(StatusCode::kInvalidFormat, "{}: {} token types for {} tokens", src,
                      vocab.token_types.size(), vocab.tokens.size());
  }
  MOESERVE_RETURN_IF_ERROR(check_special_id(vocab, "bos", vocab.bos_id));
  MOESERVE_RETURN_IF_ERROR(check_special_id(vocab, "eos", vocab.eos_id));
  MOESERVE_RETURN_IF_ERROR(check_special_id(vocab, "eot", vocab.eot_id));
  MOESERVE_RETURN_IF_ERROR(check_special_id(vocab, "pad", vocab.pad_id));
  MOESERVE_ASSIGN_OR_RETURN(pre_, PreTokenizer::create(vocab.pre));

  tokens_ = std::move(vocab.tokens);
  const size_t n = tokens_.size();
  types_.resize(n, TokenType::kNormal);
  for (size_t id = 0; id < vocab.token_types.size(); ++id) {
    const int32_t t = vocab.token_types[id];
    if (t < 0 || t > static_cast<int32_t>(TokenType::kByte)) {
      return make_error(StatusCode::kInvalidFormat, "{}: token {} has unknown type {}", src, id, t);
    }
    types_[id] = static_cast<TokenType>(t);
  }

  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  ids_.reserve(n);
  token_bytes_.resize(n);
  for (size_t id = 0; id < n; ++id) {
    if (types_[id] == TokenType::kUnused) continue;  // padding slots may repeat or be empty
    auto [it, inserted] = ids_.emplace(tokens_[id], static_cast<int32_t>(id));
    if (!inserted) {
      return make_error(StatusCode::kInvalidFormat, "{}: token '{}' appears twice (ids {} and {})", src,
                        tokens_[id], it->second, id);
    }
    token_bytes_[id] = is_literal_type(types_[id]) ? tokens_[id] : alphabet.decode(tokens_[id]);
  }
  for (int byte = 0; byte < 256; ++byte) {
    auto it = ids_.find(alphabet.symbol(static_cast<uint8_t>(byte)));
    if (it == ids_.end() || is_literal_type(types_[it->second])) {
      return make_error(StatusCode::kInvalidFormat, "{}: no byte-level token '{}' for byte 0x{:02X}", src,
                        alphabet.symbol(static_cast<uint8_t>(byte)), byte);
    }
    byte_ids_[byte] = it->second;
  }
  MOESERVE_RETURN_IF_ERROR(build_merges(vocab));
  index_added_tokens();

  normalization_ = vocab.normalization;
  ignore_merges_ = vocab.ignore_merges;
  bos_id_ = vocab.bos_id;
  eos_id_ = vocab.eos_id;
  eot_id_ = vocab.eot_id;
  pad_id_ = vocab.pad_id;
  add_bos_ = vocab.add_bos;
  chat_template_ = std::move(vocab.chat_template);
  return Status::ok();
}

Status Tokenizer::build_merges(const VocabData& vocab) {
  std::string joined;
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const auto& [left, right] = vocab.merges[rank];
    auto l = ids_.find(left), r = ids_.find(right);
    if (l == ids_.end() || r == ids_.end()) {
      return make_error(StatusCode::kInvalidFormat,
                        "{}: merge {} '{} {}' names a token that is not in the vocabulary", vocab.source,
                        rank, left, right);
    }
    joined.assign(left).append(right);
    auto merged = ids_.find(joined);
    if (merged == ids_.end()) {
      return make_error(StatusCode::kInvalidFormat,
                        "{}: merge {} '{} {}' makes '{}', which is not in the vocabulary", vocab.source, rank,
                        left, right, joined);
    }
    if (rank > static_cast<size_t>(INT32_MAX))
      return make_error(StatusCode::kOutOfRange, "{}: too many merges", vocab.source);
    merger_.add_merge(l->second, r->second, merged->second, static_cast<int32_t>(rank));
  }
  return Status::ok();
}

void Tokenizer::index_added_tokens() {
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (is_added_type(types_[id]) && !tokens_[id].empty()) {
      added_by_first_byte_[static_cast<uint8_t>(tokens_[id][0])].push_back(static_cast<int32_t>(id));
    }
    if (types_[id] == TokenType::kControl && !tokens_[id].empty()) control_texts_.push_back(tokens_[id]);
  }
  for (auto& candidates : added_by_first_byte_) {
    std::stable_sort(candidates.begin(), candidates.end(),
                     [&](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
  }
}

void Tokenizer::split_added_tokens(std::string_view text, bool parse_special,
                                   std::span<const TextRange> literal, std::vector<Segment>& out) const {
  size_t segment_start = 0;
  size_t i = 0;
  size_t next_literal = 0;  // the first range that does not end before i
  while (i < text.size()) {
    while (next_literal < literal.size() && literal[next_literal].end <= i) ++next_literal;
    const bool in_literal = next_literal < literal.size() && literal[next_literal].begin <= i;
    const bool control_ok = parse_special && !in_literal;
    int32_t found = -1;
    for (int32_t id : added_by_first_byte_[static_cast<uint8_t>(text[i])]) {
      if (!control_ok && types_[id] == TokenType::kControl) continue;
      if (text.compare(i, tokens_[id].size(), tokens_[id]) == 0) {
        found = id;  // candidates are longest first
        break;
      }
    }
    if (found < 0) {
      ++i;
      continue;
    }
    if (i > segment_start) out.push_back(Segment{text.substr(segment_start, i - segment_start), -1});
    out.push_back(Segment{text.substr(i, tokens_[found].size()), found});
    i += tokens_[found].size();
    segment_start = i;
  }
  if (segment_start < text.size()) out.push_back(Segment{text.substr(segment_start), -1});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  if (options.add_bos.value_or(add_bos_) && bos_id_) ids.push_back(*bos_id_);
  const std::string valid = sanitize_utf8(text);
  std::vector<Segment> segments;
  // Sanitizing moved the literal ranges' offsets: keep every control token
  // as text rather than risk splitting one out of a literal range.
  const bool moved = !options.literal_ranges.empty() && valid != text;
  split_added_tokens(valid, options.parse_special && !moved, options.literal_ranges, segments);
  for (const Segment& segment : segments) {
    if (segment.added_id >= 0) {
      ids.push_back(segment.added_id);
    } else {
      encode_segment(segment.text, ids);
    }
  }
  return ids;
}

void Tokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  std::string normalized;
  if (normalization_ == Normalization::kNfc) {
    normalized = nfc_normalize(text);
    text = normalized;
  }
  std::vector<std::string_view> pieces;
  pre_->split(text, pieces);
  for (std::string_view piece : pieces) encode_piece(piece, out);
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (auto id = find_token(ByteLevelAlphabet::get().encode(piece)); id && !is_literal_type(types_[*id])) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  CacheShard* shard = nullptr;
  if (cacheable) {
    shard = &cache_[std::hash<std::string_view>{}(piece) % kCacheShards];
    std::lock_guard<std::mutex> lock(shard->mutex);
    if (auto it = shard->pieces.find(piece); it != shard->pieces.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  for (char c : piece) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
  merger_.merge(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mutex);
    if (shard->pieces.size() >= kCacheEntriesPerShard) shard->pieces.clear();
    shard->pieces.emplace(piece, std::move(symbols));
  }
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::string valid = sanitize_utf8(text);
  if (normalization_ == Normalization::kNfc) valid = nfc_normalize(valid);
  std::vector<std::string_view> pieces;
  pre_->split(valid, pieces);
  return {pieces.begin(), pieces.end()};
}

std::string Tokenizer::decode(std::span<const int32_t> ids, const DecodeOptions& options) const {
  std::string out;
  for (int32_t id : ids) {
    if (!is_valid_id(id)) continue;
    if (options.skip_special && types_[id] == TokenType::kControl) continue;
    out += token_bytes_[id];
  }
  return out;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  static const std::string kEmpty;
  return is_valid_id(id) ? tokens_[id] : kEmpty;
}

const std::string& Tokenizer::token_to_bytes(int32_t id) const {
  static const std::string kEmpty;
  return is_valid_id(id) ? token_bytes_[id] : kEmpty;
}

TokenType Tokenizer::token_type(int32_t id) const {
  return is_valid_id(id) ? types_[id] : TokenType::kUndefined;
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  auto it = ids_.find(text);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::string IncrementalDecoder::feed(int32_t id) {
  std::string out;
  if (!tokenizer_.is_valid_id(id)) return out;
  if (options_.skip_special && tokenizer_.is_control(id)) return out;
  utf8_.push(tokenizer_.token_to_bytes(id), out);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out;
  utf8_.finish(out);
  return out;
}

}  // namespace moeserve::tok
