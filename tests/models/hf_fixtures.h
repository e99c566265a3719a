// Reads the Hugging Face reference fixtures of the tiny trained models
// (tests/data/models/fixtures_*.json; format in tests/data/models/README.md).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace moeserve::testing {

struct FixturePrompt {
  std::string name;
  std::string text;                             // the rendered prompt text
  std::vector<int32_t> ids;                     // prompt token ids
  std::vector<std::vector<int32_t>> top_ids;    // [position][20], logit-descending
  std::vector<std::vector<float>> top_logits;   // [position][20]
  std::vector<float> top1_margins;              // [position]
  std::vector<float> last_logits;               // all vocab logits of the last position
  std::vector<int32_t> greedy_ids;              // 64 tokens, EOS disabled
  std::vector<float> greedy_top1_margins;
};

struct Fixture {
  std::string model;
  std::vector<FixturePrompt> prompts;
};

// Standard base64 (RFC 4648, '=' padding); nullopt on a bad character.
inline std::optional<std::vector<uint8_t>> decode_base64(const std::string& s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    const int v = value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(uint8_t((acc >> bits) & 0xFF));
    }
  }
  return out;
}

// Throws (nlohmann::json exceptions) on a malformed file: a test fixture
// problem, reported by gtest as an uncaught exception naming the key.
inline std::optional<Fixture> load_fixture(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(in);
  Fixture f;
  f.model = j.at("model").get<std::string>();
  for (const auto& p : j.at("prompts")) {
    FixturePrompt fp;
    fp.name = p.at("name").get<std::string>();
    fp.text = p.at("text").get<std::string>();
    fp.ids = p.at("ids").get<std::vector<int32_t>>();
    fp.top_ids = p.at("top_ids").get<std::vector<std::vector<int32_t>>>();
    fp.top_logits = p.at("top_logits").get<std::vector<std::vector<float>>>();
    fp.top1_margins = p.at("top1_margins").get<std::vector<float>>();
    fp.greedy_ids = p.at("greedy_ids").get<std::vector<int32_t>>();
    fp.greedy_top1_margins = p.at("greedy_top1_margins").get<std::vector<float>>();
    const auto bytes = decode_base64(p.at("last_logits_f32_b64").get<std::string>());
    if (!bytes || bytes->size() % 4 != 0) return std::nullopt;
    fp.last_logits.resize(bytes->size() / 4);
    std::memcpy(fp.last_logits.data(), bytes->data(), bytes->size());  // little-endian host
    f.prompts.push_back(std::move(fp));
  }
  return f;
}

// "fixtures_qwen35moe.json" -> "qwen35moe" (test names).
inline std::string fixture_stem(const std::string& file) {
  std::string s = file;
  if (s.rfind("fixtures_", 0) == 0) s = s.substr(9);
  if (s.size() > 5 && s.substr(s.size() - 5) == ".json") s.resize(s.size() - 5);
  return s;
}

}  // namespace moeserve::testing
