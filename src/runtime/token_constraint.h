// Constrained decoding (structured output): a TokenConstraint says which
// tokens may come next. The engine samples as usual and asks the constraint
// about the sampled token; only when it is refused are all refused tokens
// masked and the token sampled again (llama.cpp's order: the common case
// costs one check, not a pass over the vocabulary).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/json_prefix.h"

namespace moeserve::tok {
class Tokenizer;
}

namespace moeserve::runtime {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Whether `token` may come next; for an end-of-sequence token, whether the
  // output may end here.
  virtual bool allows(int32_t token) const = 0;
  // The token was emitted (after allows() said yes).
  virtual void accept(int32_t token) = 0;
  // allowed[id] = allows(id) for every id below n_vocab (`allowed` is
  // resized): what the engine masks the logits with when the sampled token
  // was refused. This default asks allows() once per id; a constraint that
  // can do better (a grammar walking a token trie) overrides it.
  virtual void allowed_mask(int64_t n_vocab, std::vector<uint8_t>& allowed) const;
};

// Every token's bytes (what decoding it alone gives), indexed by id; control
// tokens give their text, ids past the vocabulary nothing. Built once a model.
using TokenBytes = std::shared_ptr<const std::vector<std::string>>;
TokenBytes token_byte_table(const tok::Tokenizer& tokenizer, int64_t n_vocab);

// The output must be one JSON text (response_format json_object: an object):
// each token's bytes must keep it a JSON prefix, end-of-sequence tokens are
// allowed once it is complete, and then nothing else is.
class JsonConstraint final : public TokenConstraint {
 public:
  JsonConstraint(TokenBytes bytes, std::vector<int32_t> end_ids, bool object_only);
  bool allows(int32_t token) const override;
  void accept(int32_t token) override;

 private:
  bool is_end(int32_t token) const;

  TokenBytes bytes_;
  std::vector<int32_t> end_ids_;
  JsonPrefix state_;
};

}  // namespace moeserve::runtime
