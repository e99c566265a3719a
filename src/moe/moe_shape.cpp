#include "moe/moe_shape.h"

#include <fmt/format.h>

#include "format/model_keys.h"

namespace moeserve::moe {
namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

void fnv(uint64_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
}
void fnv_u64(uint64_t& h, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = uint8_t(v >> (8 * i));  // little-endian, whatever the host
  fnv(h, b, 8);
}

Status bad(const GgufFile& f, const std::string& why) {
  return make_error(StatusCode::kInvalidArgument, "{}: {}", f.name(), why);
}

}  // namespace

uint64_t MoeShape::all_expert_bytes() const {
  uint64_t total = 0;
  for (uint64_t b : expert_bytes) total += b * uint64_t(n_expert);
  return total;
}

std::string model_fingerprint(const GgufFile& file) {
  uint64_t h = kFnvOffset;
  for (const GgufTensorInfo& t : file.tensors()) {
    fnv_u64(h, t.name.size());
    fnv(h, t.name.data(), t.name.size());
    fnv_u64(h, uint64_t(t.type));
    for (int64_t d : t.ne) fnv_u64(h, uint64_t(d));
    fnv_u64(h, t.offset);
  }
  return fmt::format("{:016x}", h);
}

Result<MoeShape> moe_shape(const GgufFile& file) {
  MoeShape s;
  s.arch = std::string(file.architecture());
  s.fingerprint = model_fingerprint(file);
  MOESERVE_ASSIGN_OR_RETURN(s.n_layer, file.require_int(file.arch_key(keys::kBlockCount)));
  if (s.n_layer < 1 || s.n_layer > 100000)
    return bad(file, fmt::format("block_count {} is out of range", s.n_layer));
  s.expert_bytes.assign(size_t(s.n_layer), 0);
  uint64_t expert_total = 0;
  for (int64_t l = 0; l < s.n_layer; ++l) {
    uint64_t one = 0;
    for (std::string_view name : {keys::kFfnGateExps, keys::kFfnUpExps, keys::kFfnDownExps}) {
      const GgufTensorInfo* t = file.find_tensor(keys::blk(int(l), name));
      if (t == nullptr) continue;
      const int64_t e = t->ne[2];
      if (s.n_expert == 0) s.n_expert = e;
      if (e != s.n_expert || e < 1 || t->nbytes % uint64_t(e) != 0) {
        return bad(file, fmt::format("{} stacks {} experts, other layers {}", t->name, e, s.n_expert));
      }
      one += t->nbytes / uint64_t(e);
      expert_total += t->nbytes;
    }
    s.expert_bytes[size_t(l)] = one;
  }
  if (s.n_expert == 0)
    return bad(file, "the model has no stacked experts (blk.N.ffn_*_exps): nothing to place");
  MOESERVE_ASSIGN_OR_RETURN(s.n_expert_used, file.require_int(file.arch_key(keys::kExpertUsedCount)));
  if (s.n_expert_used < 1 || s.n_expert_used > s.n_expert) {
    return bad(file, fmt::format("expert_used_count {} is outside 1..{}", s.n_expert_used, s.n_expert));
  }
  uint64_t all = 0;
  for (const GgufTensorInfo& t : file.tensors()) all += t.nbytes;
  s.dense_bytes = all - expert_total;
  // K and V rows of head_count_kv x key_length f16 values a layer.
  const int64_t n_embd = file.get_int(file.arch_key(keys::kEmbeddingLength)).value_or(0);
  const int64_t n_head = file.get_int(file.arch_key(keys::kHeadCount)).value_or(0);
  const int64_t n_kv = file.get_int(file.arch_key(keys::kHeadCountKv)).value_or(n_head);
  const int64_t head_dim =
      file.get_int(file.arch_key(keys::kKeyLength)).value_or(n_head > 0 ? n_embd / n_head : 0);
  if (n_kv < 0 || head_dim < 0 || n_kv > (1 << 20) || head_dim > (1 << 20)) {
    return bad(file,
               fmt::format("attention.head_count_kv {} / key_length {} are out of range", n_kv, head_dim));
  }
  // Only attention layers keep K/V rows: a hybrid's linear-attention
  // (Gated DeltaNet) layers have no attn_k and keep a fixed-size state. A
  // file without any attn_k (other names): every layer, to be safe.
  int64_t kv_layers = 0;
  for (int64_t l = 0; l < s.n_layer; ++l)
    kv_layers += file.find_tensor(fmt::format("blk.{}.attn_k.weight", l)) != nullptr ? 1 : 0;
  if (kv_layers == 0) kv_layers = s.n_layer;
  s.kv_bytes_per_position = uint64_t(kv_layers) * 2 * uint64_t(n_kv) * uint64_t(head_dim) * 2;
  return s;
}

}  // namespace moeserve::moe
