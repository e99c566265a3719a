// moeserve tokenize: text -> token ids (or ids -> text with --decode) using
// the tokenizer of a GGUF model or a Hugging Face tokenizer.json.
//
//   moeserve tokenize --tokenizer model.gguf "Hello world"      -> 9707 1879
//   moeserve tokenize --tokenizer tokenizer.json --json -        (text on stdin)
//   moeserve tokenize --tokenizer tokenizer.json --decode "9707 1879"
//   moeserve tokenize --tokenizer tokenizer.json --jsonl < lines.jsonl
//
// --jsonl is the batch mode the reference test uses: every non-empty stdin
// line is a JSON string, {"text": "..."} or {"hex": "<bytes as hex>"} (for
// input that is not valid UTF-8), and one JSON array of ids is printed per line.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_gguf.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {
namespace {

using nlohmann::json;

struct TokenizeArgs {
  std::string tokenizer_path;
  std::string text;
  bool json_output = false;
  bool no_special = false;
  bool add_bos = false;
  bool decode = false;
  bool skip_special = false;
  bool ids_and_pieces = false;
  bool jsonl = false;
};

bool has_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

Result<std::unique_ptr<tok::Tokenizer>> load_tokenizer(const std::string& path) {
  if (has_gguf_magic(path)) {
    MOESERVE_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::open(path));
    MOESERVE_ASSIGN_OR_RETURN(tok::VocabData vocab, tok::vocab_from_gguf(gguf));
    return tok::Tokenizer::create(std::move(vocab));
  }
  MOESERVE_ASSIGN_OR_RETURN(tok::VocabData vocab, tok::load_tokenizer_json(path));
  return tok::Tokenizer::create(std::move(vocab));
}

std::string read_all_stdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::string json_string(std::string_view bytes) {
  return json(std::string(bytes)).dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string ids_as_text(const std::vector<int32_t>& ids, bool as_json) {
  if (as_json) return json(ids).dump();
  return fmt::format("{}", fmt::join(ids, " "));
}

Result<std::string> hex_to_bytes(std::string_view hex) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return make_error(StatusCode::kInvalidArgument, "hex string has an odd length");
  std::string bytes;
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return make_error(StatusCode::kInvalidArgument, "'{}' is not hex", hex.substr(i, 2));
    bytes.push_back(static_cast<char>(hi * 16 + lo));
  }
  return bytes;
}

// One --jsonl input line -> the bytes to tokenize.
Result<std::string> jsonl_text(const std::string& line) {
  json value = json::parse(line, nullptr, false);
  if (value.is_discarded()) return make_error(StatusCode::kInvalidArgument, "not valid JSON");
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("text") && value["text"].is_string()) return value["text"].get<std::string>();
  if (value.is_object() && value.contains("hex") && value["hex"].is_string()) return hex_to_bytes(value["hex"].get<std::string>());
  return make_error(StatusCode::kInvalidArgument, "expected a JSON string, {{\"text\": ...}} or {{\"hex\": ...}}");
}

Status run_jsonl(const tok::Tokenizer& tokenizer, const tok::EncodeOptions& options) {
  std::string line;
  size_t line_number = 0;
  std::string out;
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    Result<std::string> text = jsonl_text(line);
    if (!text) return make_error(StatusCode::kInvalidArgument, "stdin line {}: {}", line_number, text.status().message());
    out += ids_as_text(tokenizer.encode(*text, options), true);
    out += '\n';
    if (out.size() > (1 << 16)) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return Status::ok();
}

// "1 2 3", "1,2,3" or "[1, 2, 3]" -> ids, each checked against the vocabulary.
Result<std::vector<int32_t>> parse_ids(std::string_view text, const tok::Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == ',' || c == '\t' || c == '\n' || c == '\r' || c == '[' || c == ']') {
      ++i;
      continue;
    }
    size_t end = i;
    if (text[end] == '-') ++end;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    const std::string_view number = text.substr(i, end - i);
    if (number.empty() || number == "-" || number.size() > 10) {
      return make_error(StatusCode::kInvalidArgument, "'{}' is not a token id", text.substr(i, std::max<size_t>(end - i, 1)));
    }
    const long long id = std::stoll(std::string(number));
    if (id < 0 || id >= tokenizer.vocab_size()) {
      return make_error(StatusCode::kOutOfRange, "token id {} is outside the vocabulary (size {})", id,
                        tokenizer.vocab_size());
    }
    ids.push_back(static_cast<int32_t>(id));
    i = end;
  }
  return ids;
}

Status run_tokenize(const TokenizeArgs& args) {
  MOESERVE_ASSIGN_OR_RETURN(std::unique_ptr<tok::Tokenizer> tokenizer, load_tokenizer(args.tokenizer_path));
  tok::EncodeOptions encode_options;
  encode_options.parse_special = !args.no_special;
  if (args.add_bos) encode_options.add_bos = true;
  if (args.jsonl) return run_jsonl(*tokenizer, encode_options);

  const std::string input = args.text == "-" ? read_all_stdin() : args.text;
  if (args.decode) {
    MOESERVE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_ids(input, *tokenizer));
    const std::string text = tokenizer->decode(ids, tok::DecodeOptions{args.skip_special});
    if (args.json_output) {
      fmt::print("{}\n", json_string(text));
    } else {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
    }
    return Status::ok();
  }
  const std::vector<int32_t> ids = tokenizer->encode(input, encode_options);
  if (args.ids_and_pieces) {
    for (int32_t id : ids) {
      fmt::print("{}\t{}\t{}\n", id, tokenizer->token_text(id), json_string(tokenizer->token_to_bytes(id)));
    }
    return Status::ok();
  }
  fmt::print("{}\n", ids_as_text(ids, args.json_output));
  return Status::ok();
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Text to token ids (or ids to text) with a model's tokenizer");
  cmd->add_option("--tokenizer", args->tokenizer_path, "A .gguf model or a Hugging Face tokenizer.json")->required();
  cmd->add_option("text", args->text, "Text to tokenize ('-' reads stdin); with --decode, token ids");
  cmd->add_flag("--json", args->json_output, "Print a JSON array (with --decode: a JSON string)");
  cmd->add_flag("--no-special", args->no_special, "Do not turn special-token text (<|im_start|>) into special tokens");
  cmd->add_flag("--add-bos", args->add_bos, "Prepend the BOS token (when the vocabulary has one)");
  cmd->add_flag("--decode", args->decode, "Read token ids, print the text they decode to");
  cmd->add_flag("--skip-special", args->skip_special, "With --decode: leave out special tokens");
  cmd->add_flag("--ids-and-pieces", args->ids_and_pieces, "One line per token: id, vocabulary text, bytes as JSON");
  cmd->add_flag("--jsonl", args->jsonl,
                "Batch mode: each stdin line is a JSON string, {\"text\":...} or {\"hex\":...}; "
                "prints one JSON array of ids per line");
  cmd->callback([args] {
    if (!args->jsonl && args->text.empty()) {
      fmt::print(stderr, "error: tokenize: give TEXT (or '-' for stdin), or use --jsonl\n");
      set_exit_code(1);
      return;
    }
    Status status = run_tokenize(*args);
    if (!status.is_ok()) {
      fmt::print(stderr, "error: {}\n", status.to_string());
      set_exit_code(1);
    }
  });
}

}  // namespace moeserve::tools
