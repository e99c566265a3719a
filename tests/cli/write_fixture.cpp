// Writes a small but complete qwen3moe-style GGUF (hyperparameters,
// tokenizer, tensors of several types) for the CLI tests.
//   gguf_cli_fixture OUT.gguf
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "format/gguf_writer.h"

namespace {

using moeserve::DType;
using moeserve::GgufWriter;
using moeserve::Status;

void set_metadata(GgufWriter& w) {
  w.set_string("general.architecture", "qwen3moe");
  w.set_string("general.name", "cli-fixture");
  w.set_u32("general.file_type", 15);
  w.set_u32("general.quantization_version", 2);
  w.set_u32("qwen3moe.block_count", 1);
  w.set_u32("qwen3moe.embedding_length", 256);
  w.set_u32("qwen3moe.expert_count", 4);
  w.set_u32("qwen3moe.expert_used_count", 2);
  w.set_f32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6f);
  w.set_f32("qwen3moe.rope.freq_base", 1e6f);
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "qwen2");
  w.set_string_array("tokenizer.ggml.tokens",
                      {"a", "b", "Ġthe", "", "\xe4\xb8\x96", "<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 3, 3, 3});
  w.set_string_array("tokenizer.ggml.merges", {"Ġ t", "Ġt he"});
  w.set_u32("tokenizer.ggml.bos_token_id", 5);
  w.set_u32("tokenizer.ggml.eos_token_id", 7);
  w.set_u32("tokenizer.ggml.padding_token_id", 5);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_string("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m.role }}\n{% endfor %}");
}

Status add_tensors(GgufWriter& w) {
  auto zeros = [](size_t n) { return std::vector<uint8_t>(n, 0); };
  MOESERVE_RETURN_IF_ERROR(w.add_tensor("token_embd.weight", DType::Q8_0, {256, 8}, zeros(8 * 8 * 34)));
  MOESERVE_RETURN_IF_ERROR(w.add_tensor("blk.0.attn_norm.weight", DType::F32, {256}, zeros(256 * 4)));
  MOESERVE_RETURN_IF_ERROR(w.add_tensor("blk.0.ffn_gate_inp.weight", DType::F16, {256, 4}, zeros(256 * 4 * 2)));
  MOESERVE_RETURN_IF_ERROR(
      w.add_tensor("blk.0.ffn_gate_exps.weight", DType::Q4_K, {256, 8, 4}, zeros(8 * 4 * 144)));
  return w.add_tensor("output.weight", DType::Q6_K, {256, 8}, zeros(8 * 210));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.gguf\n", argv[0]);
    return 2;
  }
  GgufWriter w;
  set_metadata(w);
  Status st = add_tensors(w);
  if (st) st = w.write(argv[1]);
  if (!st) {
    fmt::print(stderr, "error: {}\n", st.to_string());
    return 1;
  }
  return 0;
}
