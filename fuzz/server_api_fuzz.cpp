// libFuzzer target for the server's protocol layer: the bytes go, as a
// request body, into every parse function, and as generated text into the
// output parser (in two pieces cut at a point chosen by the first byte, with
// options from the second), whose streamed result must equal the whole-text
// parse. Any crash, sanitizer report, leak or mismatch is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "moe/expert_stats.h"
#include "moe/placement.h"
#include "runtime/grammar/gbnf.h"
#include "runtime/json_prefix.h"
#include "server/api/anthropic.h"
#include "server/api/json_schema_grammar.h"
#include "server/api/openai_request.h"
#include "server/api/output_parser.h"
#include "server/api/response_format.h"
#include "server/api/responses.h"

namespace api = moeserve::server::api;

namespace {

void fuzz_requests(std::string_view body) {
  auto chat = api::parse_chat_completion_request(body);
  if (chat.ok()) {
    (void)chat.value->messages.dump();  // the normalized JSON must be serializable
  } else {
    (void)chat.error.to_json().dump();
  }
  auto completion = api::parse_completion_request(body);
  if (!completion.ok()) (void)completion.error.to_json().dump();
  (void)api::parse_tokenize_request(body);
  (void)api::parse_detokenize_request(body);
  // The translated APIs (Anthropic Messages, OpenAI Responses).
  auto messages = api::parse_messages_request(body);
  if (messages.ok()) (void)messages.value->chat.messages.dump();
  (void)api::parse_count_tokens_request(body);
  auto responses = api::parse_responses_request(body);
  if (responses.ok()) (void)responses.value->echo.dump();
  // The body as a JSON schema, and what it becomes as a grammar.
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(body, nullptr, false);
  if (!schema.is_discarded()) {
    auto gbnf = api::json_schema_to_gbnf(schema);
    // (a $ref cycle without a byte in between is left recursion: refused there, not here)
    if (gbnf.is_ok()) (void)moeserve::runtime::grammar::parse_gbnf(*gbnf);
  }
  // The structured-output recogniser on arbitrary bytes: a refused byte
  // leaves the state as it was, so feeding the rest must not crash.
  moeserve::runtime::JsonPrefix prefix(false);
  for (char c : body) (void)prefix.feed(uint8_t(c));
  (void)prefix.complete();
  // The expert placement and statistics files (hostile input refused, never a crash).
  static const moeserve::moe::MoeShape shape = [] {
    moeserve::moe::MoeShape s;
    s.arch = "qwen3moe", s.fingerprint = "00112233aabbccdd";
    s.n_layer = 3, s.n_expert = 8, s.n_expert_used = 2, s.expert_bytes = {100, 0, 200};
    return s;
  }();
  (void)moeserve::moe::parse_placement(body, "fuzz", shape);
  (void)moeserve::moe::parse_expert_stats(body, "fuzz", &shape);
}

api::OutputParserOptions parser_options(uint8_t bits) {
  api::OutputParserOptions o;
  o.parse_reasoning = bits & 1;
  o.parse_tool_calls = bits & 2;
  o.starts_in_reasoning = bits & 4;
  o.make_tool_call_id = api::counter_tool_call_ids();
  return o;
}

void fuzz_output_parser(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const size_t cut = data[0] % (size - 1);
  const uint8_t bits = data[1];
  std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  api::OutputDelta whole = api::OutputParser::parse(text, parser_options(bits));

  api::OutputParser parser(parser_options(bits));
  api::OutputDelta streamed = parser.push(text.substr(0, std::min(cut, text.size())));
  streamed.append(parser.push(text.substr(std::min(cut, text.size()))));
  streamed.append(parser.finish());
  if (streamed.content != whole.content || streamed.reasoning != whole.reasoning ||
      streamed.tool_calls.size() != whole.tool_calls.size()) {
    abort();
  }
  // Responses built from arbitrary model bytes must serialize (invalid UTF-8 is replaced).
  api::ChatChoiceResult choice{whole.content, whole.reasoning, whole.tool_calls, "stop", std::nullopt};
  (void)api::sse_data(api::chat_completion({"id", "m", 0}, choice, {}));
  (void)api::dump_json(api::anthropic_message({"id", "m", 0}, choice, {}, {}));
  (void)api::dump_json(api::response_object({"id", "m", 0}, {}, choice, {}, {}));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_requests(std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz_output_parser(data, size);
  return 0;
}
