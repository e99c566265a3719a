// Writes the GGUF fuzz seed corpus with GgufWriter (no binary files in git).
//   fuzz_gguf_seeds DIR
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "format/gguf_writer.h"

namespace {

using namespace moeserve;

// Deterministic filler so seeds differ from all-zero data.
std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = uint8_t(i * 31 + 7);
  return out;
}

Status add(GgufWriter& w, const char* name, DType type, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return w.add_tensor(name, type, shape, pattern(dtype_row_bytes(type, n)));
}

void every_value_type(GgufWriter& w) {
  w.set_u8("t.u8", 200);
  w.set_i8("t.i8", -5);
  w.set_u16("t.u16", 60000);
  w.set_i16("t.i16", -3000);
  w.set_u32("t.u32", 7);
  w.set_i32("t.i32", -7);
  w.set_f32("t.f32", 0.5f);
  w.set_bool("t.bool", true);
  w.set_string("t.string", "h\xc3\xa9llo");
  w.set_u64("t.u64", 1ull << 40);
  w.set_i64("t.i64", -(1ll << 40));
  w.set_f64("t.f64", 2.5);
  w.set("a.u8", GgufValue::array(std::vector<uint8_t>{1, 2}));
  w.set("a.i16", GgufValue::array(std::vector<int16_t>{-1, 1}));
  w.set_u32_array("a.u32", {1, 2, 3});
  w.set_i32_array("a.i32", {11, 11, 10, 0});
  w.set_f32_array("a.f32", {1.0f, -1.0f});
  w.set_bool_array("a.bool", {true, false});
  w.set_i64_array("a.i64", {5});
  w.set("a.f64", GgufValue::array(std::vector<double>{0.25}));
  w.set_string_array("a.string", {"", "x", "Ġa b"});
}

Status all_types_seed(GgufWriter& w) {
  w.set_string("general.architecture", "qwen3moe");
  every_value_type(w);
  MOESERVE_RETURN_IF_ERROR(add(w, "f32", DType::F32, {4, 2}));
  MOESERVE_RETURN_IF_ERROR(add(w, "f16", DType::F16, {8}));
  MOESERVE_RETURN_IF_ERROR(add(w, "bf16", DType::BF16, {2, 2, 2, 2}));
  MOESERVE_RETURN_IF_ERROR(add(w, "q8_0", DType::Q8_0, {32, 2}));
  MOESERVE_RETURN_IF_ERROR(add(w, "q4_0", DType::Q4_0, {32}));
  MOESERVE_RETURN_IF_ERROR(add(w, "q4_K", DType::Q4_K, {256}));
  MOESERVE_RETURN_IF_ERROR(add(w, "q5_K", DType::Q5_K, {256}));
  return add(w, "q6_K", DType::Q6_K, {256});
}

Status model_like_seed(GgufWriter& w) {
  w.set_string("general.architecture", "qwen35moe");
  w.set_u32("general.alignment", 64);
  w.set_u32("qwen35moe.block_count", 2);
  w.set_u32("qwen35moe.expert_count", 4);
  w.set_f32("qwen35moe.rope.freq_base", 1e7f);
  w.set_i32_array("qwen35moe.rope.dimension_sections", {11, 11, 10, 0});
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string_array("tokenizer.ggml.tokens", {"a", "b", "<|im_end|>"});
  w.set_string_array("tokenizer.ggml.merges", {"a b"});
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_string("tokenizer.chat_template", "{{ messages }}");
  MOESERVE_RETURN_IF_ERROR(add(w, "token_embd.weight", DType::Q8_0, {64, 3}));
  return add(w, "blk.0.ffn_gate_exps.weight", DType::Q4_K, {256, 1, 4});
}

Status v2_seed(GgufWriter& w) {
  w.set_version(2);
  w.set_string("general.architecture", "qwen3");
  return add(w, "x", DType::F32, {3});
}

Status empty_seed(GgufWriter&) { return Status::ok(); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const struct {
    const char* name;
    Status (*build)(GgufWriter&);
  } seeds[] = {{"all_types", all_types_seed}, {"model_like", model_like_seed}, {"v2", v2_seed}, {"empty", empty_seed}};
  for (const auto& seed : seeds) {
    GgufWriter w;
    Status st = seed.build(w);
    const std::string path = fmt::format("{}/{}.gguf", argv[1], seed.name);
    if (st) st = w.write(path);
    if (!st) {
      fmt::print(stderr, "error: {}: {}\n", seed.name, st.to_string());
      return 1;
    }
  }
  return 0;
}
