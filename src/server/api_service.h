// The OpenAI-compatible API, independent of the HTTP library: a request
// (method, path, headers that matter, body) goes in, a reply comes out —
// either a complete body or a GenerationSession to stream from. The HTTP
// front end (http_server.h) only moves bytes; tests drive this directly.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "chat/chat_template.h"
#include "runtime/batch_engine.h"
#include "runtime/grammar/token_mask.h"
#include "runtime/model.h"
#include "server/api/api_error.h"
#include "server/api/metrics.h"
#include "server/api/openai_request.h"
#include "server/chat_prompt.h"
#include "server/generation_session.h"

namespace moeserve::server {

struct ServiceConfig {
  std::string model_id;  // what /v1/models lists and requests may name
  std::string api_key;   // empty: no authentication
  std::string web_page;  // HTML served at "/"
  // Jinja chat template replacing the model file's (serve --chat-template); empty: the file's.
  std::string chat_template;
  // Control-token text inside chat messages: plain text (default) or parsed.
  SpecialTokensInContent special_tokens_in_content = SpecialTokensInContent::kText;
  // Fault injection for tests: returning true makes this request's handling
  // fail as if an allocation had (std::bad_alloc).
  std::function<bool(const std::string& path)> inject_allocation_failure;
  // More Prometheus text for /metrics (serve: the expert worker's series).
  std::function<std::string()> extra_metrics;
};

struct ApiRequest {
  std::string method;
  std::string path;
  std::string body;
  std::string authorization;  // the Authorization header ("Bearer " + x-api-key when only that was sent)
  // Plain (non-streamed) generations poll this while they wait; false means
  // the client hung up, and the request is cancelled so its slot frees.
  std::function<bool()> client_alive;
  std::string peer;  // the client's address (--max-running-per-client counts by it without a key)
};

struct ApiReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::shared_ptr<GenerationSession> stream;  // set: SSE; body unused
  std::function<void()> cancel;               // streams: call when the client goes away
};

class ApiService {
 public:
  ApiService(runtime::Model& model, runtime::BatchEngine& engine, ServiceConfig config);

  ApiReply handle(const ApiRequest& request);
  api::Metrics& metrics() { return *metrics_; }
  // Error reply for failures outside handle() (body too large, bad request line).
  static ApiReply error_reply(const api::ApiError& e);

 private:
  ApiReply route(const ApiRequest& r);
  ApiReply chat_completions(const ApiRequest& r);
  // Anthropic's Messages API (api/anthropic.h): the same chat path.
  ApiReply messages(const ApiRequest& r);
  ApiReply count_tokens(const ApiRequest& r);
  // OpenAI's Responses API (api/responses.h), stateless: the same chat path.
  ApiReply responses(const ApiRequest& r);
  // The chat template's prompt for a request, or the error to answer with.
  struct ChatPrompt {
    std::vector<int32_t> ids;
    bool starts_in_reasoning = false;  // the template opened the reasoning block itself
  };
  api::Parsed<ChatPrompt> render_chat(const api::ChatCompletionRequest& req) const;
  SessionConfig chat_session(const api::ChatCompletionRequest& req, const ChatPrompt& prompt) const;
  ApiReply completions(const ApiRequest& r);
  ApiReply tokenize(const std::string& body);
  ApiReply detokenize(const std::string& body);
  ApiReply models() const;
  ApiReply health() const;
  ApiReply metrics_text();
  std::optional<api::ApiError> check_model(const std::string& requested) const;
  // Submits the prompt and returns the reply (a stream, or the finished body).
  ApiReply run(std::vector<int32_t> prompt, const api::GenerationParams& params, SessionConfig config,
               const ApiRequest& request);

  runtime::Model& model_;
  runtime::BatchEngine& engine_;
  ServiceConfig config_;
  std::optional<chat::ChatTemplate> template_;
  std::string template_error_;
  std::shared_ptr<api::Metrics> metrics_;  // shared with engine callbacks, which may outlive this
  std::mutex scrape_mu_;
  runtime::EngineStats last_scrape_;
  std::atomic<uint64_t> seed_counter_{0};
  // Every token's bytes, for structured output (built on first use).
  std::mutex token_bytes_mu_;
  runtime::TokenBytes token_bytes_;
  runtime::TokenBytes token_bytes();
  std::vector<int32_t> end_token_ids() const;
  std::shared_ptr<runtime::TokenConstraint> tool_call_constraint(const api::ToolCallGrammar& g,
                                                                 bool starts_in_reasoning);
  struct MaskTables {
    runtime::TokenBytes bytes;
    std::shared_ptr<const runtime::grammar::TokenTrie> trie;
    std::shared_ptr<runtime::grammar::MaskCache> cache;
  };
  MaskTables mask_tables_;
  MaskTables mask_tables();
};

}  // namespace moeserve::server
