// Tiny random Qwen3 / Qwen3-MoE GGUF files built in memory for tests (F32
// weights, the hand-made byte-level vocabulary of tests/tokenizer), plus the
// float values of every tensor for the naive reference implementation.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/gguf_writer.h"
#include "format/model_keys.h"
#include "tokenizer/tiny_vocab.h"

namespace moeserve::testing {

struct TinySpec {
  std::string arch = "qwen3moe";
  int64_t n_embd = 32, n_layer = 2, n_head = 4, n_head_kv = 2, head_dim = 16;
  int64_t n_ff = 48;                                  // qwen3
  int64_t n_expert = 8, n_expert_used = 3, n_ff_exp = 16;  // qwen3moe
  int64_t n_vocab = tok::testing::kTinyVocabSize;
  int64_t n_ctx_train = 256;
  double rope_base = 10000.0;
  float eps = 1e-6f;
  bool tied_output = false;
  uint32_t seed = 1;
  std::set<std::string> skip_tensors;                 // leave these out (error tests)
  std::map<std::string, std::vector<int64_t>> shape_override;
  std::set<std::string> skip_keys;                    // arch-relative key suffixes
};

struct TinyModel {
  TinySpec spec;
  std::vector<uint8_t> bytes;                          // the GGUF file
  std::map<std::string, std::vector<float>> tensors;   // name -> values (row-major, ne order)

  const std::vector<float>& t(const std::string& name) const { return tensors.at(name); }
  Result<GgufFile> parse() const { return GgufFile::parse_bytes(bytes, "tiny.gguf"); }
};

inline void add_vocab(GgufWriter& w) {
  tok::VocabData v = tok::testing::tiny_vocab();
  w.set_string(keys::kTokModel, "gpt2");
  w.set_string(keys::kTokPre, v.pre);
  w.set_string_array(keys::kTokTokens, v.tokens);
  w.set_i32_array(keys::kTokTypes, v.token_types);
  std::vector<std::string> merges;
  for (const auto& [a, b] : v.merges) merges.push_back(a + " " + b);
  w.set_string_array(keys::kTokMerges, merges);
  w.set_u32(keys::kTokBos, uint32_t(*v.bos_id));
  w.set_u32(keys::kTokEos, uint32_t(*v.eos_id));
  w.set_bool(keys::kTokAddBos, false);
}

inline TinyModel build_tiny_model(const TinySpec& s) {
  TinyModel m;
  m.spec = s;
  GgufWriter w;
  std::mt19937 rng(s.seed);
  const std::string& a = s.arch;
  w.set_string(keys::kArchitecture, a);
  auto key = [&](std::string_view suffix) { return keys::arch_key(a, suffix); };
  auto set_int = [&](std::string_view suffix, int64_t v) {
    if (!s.skip_keys.count(std::string(suffix))) w.set_u32(key(suffix), uint32_t(v));
  };
  set_int(keys::kContextLength, s.n_ctx_train);
  set_int(keys::kEmbeddingLength, s.n_embd);
  set_int(keys::kBlockCount, s.n_layer);
  set_int(keys::kHeadCount, s.n_head);
  set_int(keys::kHeadCountKv, s.n_head_kv);
  set_int(keys::kKeyLength, s.head_dim);
  set_int(keys::kValueLength, s.head_dim);
  if (!s.skip_keys.count(std::string(keys::kRmsEps))) w.set_f32(key(keys::kRmsEps), s.eps);
  w.set_f32(key(keys::kRopeFreqBase), float(s.rope_base));
  if (a == "qwen3moe") {
    set_int(keys::kExpertCount, s.n_expert);
    set_int(keys::kExpertUsedCount, s.n_expert_used);
    set_int(keys::kExpertFeedForwardLength, s.n_ff_exp);
  } else {
    set_int(keys::kFeedForwardLength, s.n_ff);
  }
  add_vocab(w);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale, float offset) {
    if (s.skip_tensors.count(name)) return;
    if (auto it = s.shape_override.find(name); it != s.shape_override.end()) shape = it->second;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = offset + scale * u(rng);
    Status st = w.add_tensor(name, DType::F32, shape,
                             std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4));
    (void)st;
    m.tensors[name] = std::move(v);
  };
  const int64_t H = s.n_embd, hd = s.head_dim, qd = s.n_head * hd, kvd = s.n_head_kv * hd;
  const float ws = 1.0f / std::sqrt(float(H));
  add(std::string(keys::kTokenEmbd), {H, s.n_vocab}, 1.0f, 0.0f);
  add(std::string(keys::kOutputNorm), {H}, 0.2f, 1.0f);
  if (!s.tied_output) add(std::string(keys::kOutput), {H, s.n_vocab}, ws, 0.0f);
  for (int il = 0; il < int(s.n_layer); ++il) {
    auto b = [&](std::string_view t) { return keys::blk(il, t); };
    add(b(keys::kAttnNorm), {H}, 0.2f, 1.0f);
    add(b(keys::kAttnQ), {H, qd}, ws, 0.0f);
    add(b(keys::kAttnK), {H, kvd}, ws, 0.0f);
    add(b(keys::kAttnV), {H, kvd}, ws, 0.0f);
    add(b(keys::kAttnOutput), {qd, H}, 1.0f / std::sqrt(float(qd)), 0.0f);
    add(b(keys::kAttnQNorm), {hd}, 0.2f, 1.0f);
    add(b(keys::kAttnKNorm), {hd}, 0.2f, 1.0f);
    add(b(keys::kFfnNorm), {H}, 0.2f, 1.0f);
    if (a == "qwen3moe") {
      add(b(keys::kFfnGateInp), {H, s.n_expert}, 2.0f * ws, 0.0f);
      add(b(keys::kFfnGateExps), {H, s.n_ff_exp, s.n_expert}, ws, 0.0f);
      add(b(keys::kFfnUpExps), {H, s.n_ff_exp, s.n_expert}, ws, 0.0f);
      add(b(keys::kFfnDownExps), {s.n_ff_exp, H, s.n_expert}, 1.0f / std::sqrt(float(s.n_ff_exp)), 0.0f);
    } else {
      add(b(keys::kFfnGate), {H, s.n_ff}, ws, 0.0f);
      add(b(keys::kFfnUp), {H, s.n_ff}, ws, 0.0f);
      add(b(keys::kFfnDown), {s.n_ff, H}, 1.0f / std::sqrt(float(s.n_ff)), 0.0f);
    }
  }
  auto buf = w.write_to_buffer();
  if (buf.is_ok()) m.bytes = std::move(buf.value());
  return m;
}

}  // namespace moeserve::testing
