// OpenAI's Responses API (POST /v1/responses), stateless, as a translation
// onto the chat request the engine already serves (like anthropic.h): the
// body is rewritten into a chat completion body and parsed by
// parse_chat_completion_request, so the APIs share one validation, template,
// sampler and engine path. Replies are built here: the `response` object and
// the streamed events (response.created ... response.completed), with
// reasoning, message and function_call output items.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "server/api/api_error.h"
#include "server/api/json_body.h"
#include "server/api/openai_request.h"
#include "server/api/output_parser.h"
#include "server/api/response_format.h"

namespace moeserve::server::api {

struct ResponsesRequest {
  ChatCompletionRequest chat;  // the translated request (chat.stream is false; see stream)
  bool stream = false;
  // Request fields the response object repeats (instructions, tools,
  // tool_choice, max_output_tokens, temperature, top_p, reasoning).
  json echo = json::object();
};

// POST /v1/responses. `instructions` becomes the system message; `input` is
// a string (one user message) or items: messages (role user / system /
// developer / assistant; content a string or input_text / output_text
// parts), function_call (-> an assistant tool call) and
// function_call_output (-> a tool message); reasoning items are skipped.
// Function tools map to chat tools, tool_choice likewise; max_output_tokens
// -> max_tokens; reasoning.effort none / minimal -> thinking off, low /
// medium / high -> on. Refused with a 400 that says why:
// previous_response_id and item references (nothing is stored), non-function
// tools, images, and text.format other than text (structured output is not
// implemented yet).
Parsed<ResponsesRequest> parse_responses_request(std::string_view body);

// What the output ended with: completed, or incomplete at max_output_tokens.
struct ResponseEnd {
  bool incomplete = false;
};

// The `response` object of a finished (non-streamed) request.
json response_object(const ResponseMeta& meta, const json& echo, const ChatChoiceResult& choice,
                     const ResponseEnd& end, const Usage& usage);

// The streamed events of one response (each "event: <type>\ndata: <json>",
// with a sequence_number): output items opened, filled and closed as the
// parsed output arrives; the final event carries the whole response.
class ResponsesStream {
 public:
  ResponsesStream(ResponseMeta meta, json echo) : meta_(std::move(meta)), echo_(std::move(echo)) {}
  std::string start();
  std::string delta(const OutputDelta& delta);
  std::string finish(const ResponseEnd& end, const Usage& usage);
  std::string error(const ApiError& e);

 private:
  enum class Item { kNone, kReasoning, kMessage };
  std::string event(json data);
  std::string open(Item kind);
  std::string close();
  json base(const std::string& status) const;

  ResponseMeta meta_;
  json echo_;
  json output_ = json::array();  // finished items
  Item open_ = Item::kNone;
  std::string open_id_, open_text_;
  int64_t sequence_ = 0;
};

}  // namespace moeserve::server::api
