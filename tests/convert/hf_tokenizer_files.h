// The byte-level BPE tokenizer files the convert tests put beside a
// checkpoint: tokenizer.json (bytes, one merge "a b", <|endoftext|> = 257 and
// <|im_end|> = 258 as special tokens, NFC, the given pre-tokenizer regex) and
// tokenizer_config.json.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"

namespace moeserve::convert::testing {

inline void write_byte_level_tokenizer(const std::filesystem::path& dir, const char* regex) {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[tok::ByteLevelAlphabet::get().symbol(uint8_t(b))] = b;
  vocab["ab"] = 256;
  json tokenizer = {
      {"added_tokens", json::array({json{{"id", 257}, {"content", "<|endoftext|>"}, {"special", true}},
                                    json{{"id", 258}, {"content", "<|im_end|>"}, {"special", true}}})},
      {"normalizer", json{{"type", "NFC"}}},
      {"pre_tokenizer",
       json{{"type", "Sequence"},
            {"pretokenizers",
             json::array({json{{"type", "Split"},
                               {"pattern", json{{"Regex", regex}}},
                               {"behavior", "Isolated"},
                               {"invert", false}},
                          json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"model", json{{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"a b"})}}}};
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": false, "chat_template": "{{ messages }}"})";
}

}  // namespace moeserve::convert::testing
