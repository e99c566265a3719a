// Loading errors name the key or tensor and say what is wrong.
#include <gtest/gtest.h>

#include "models/qwen3_hparams.h"
#include "models/qwen3_weights.h"
#include "models/tiny_qwen3.h"

namespace moeserve::models {
namespace {

using testing::build_tiny_model;
using testing::TinySpec;

Status load(const TinySpec& s) {
  const testing::TinyModel tm = build_tiny_model(s);
  auto file = tm.parse();
  if (!file.is_ok()) return file.status();
  auto hp = load_qwen3_hparams(file.value());
  if (!hp.is_ok()) return hp.status();
  return load_qwen3_weights(file.value(), hp.value()).status();
}

TEST(Qwen3Load, TinyModelsLoad) {
  EXPECT_TRUE(load({}).is_ok()) << load({}).to_string();
  TinySpec dense;
  dense.arch = "qwen3";
  EXPECT_TRUE(load(dense).is_ok()) << load(dense).to_string();
}

TEST(Qwen3Load, MissingTensorIsNamed) {
  TinySpec s;
  s.skip_tensors = {"blk.1.ffn_up_exps.weight"};
  const Status st = load(s);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("blk.1.ffn_up_exps.weight"), std::string::npos) << st.message();
}

TEST(Qwen3Load, WrongShapeSaysExpectedAndActual) {
  TinySpec s;
  s.shape_override["blk.0.attn_k.weight"] = {32, 16};
  const Status st = load(s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidFormat);
  EXPECT_NE(st.message().find("blk.0.attn_k.weight"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("[32, 16]"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("[32, 32]"), std::string::npos) << st.message();
}

TEST(Qwen3Load, MissingKeyIsNamed) {
  TinySpec s;
  s.skip_keys = {"expert_count"};
  const Status st = load(s);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("qwen3moe.expert_count"), std::string::npos) << st.message();
}

TEST(Qwen3Load, InconsistentKeys) {
  TinySpec s;
  s.n_head_kv = 3;
  EXPECT_NE(load(s).message().find("head_count_kv"), std::string::npos) << load(s).message();
  TinySpec e;
  e.n_expert_used = 9;
  EXPECT_NE(load(e).message().find("expert_used_count 9 > expert_count 8"), std::string::npos) << load(e).message();
}

TEST(Qwen3Load, UnsupportedArchitectureListsSupported) {
  TinySpec s;
  s.arch = "llama";
  const Status st = load(s);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("'llama'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("qwen3moe, qwen3"), std::string::npos) << st.message();
}

TEST(Qwen3Load, DefaultsForOptionalKeys) {
  TinySpec s;
  s.head_dim = 8;  // == n_embd / n_head, so the default is right
  s.skip_keys = {"attention.key_length", "attention.value_length"};
  const testing::TinyModel tm = build_tiny_model(s);
  auto file = tm.parse();
  ASSERT_TRUE(file.is_ok());
  auto hp = load_qwen3_hparams(file.value());
  ASSERT_TRUE(hp.is_ok()) << hp.status().to_string();
  EXPECT_EQ(hp->head_dim, 8);
  EXPECT_EQ(hp->n_rot, 8);
}

}  // namespace
}  // namespace moeserve::models
