#include "server/api_service.h"

#include <algorithm>
#include <new>
#include <random>

#include "runtime/grammar_constraint.h"
#include "runtime/tool_call_constraint.h"
#include "server/api/anthropic.h"
#include "server/api/openai_request.h"
#include "server/api/response_format.h"
#include "server/api/responses.h"
#include "server/expert_stats.h"
#include "server/spec_metrics.h"
#include "tokenizer/tokenizer.h"

namespace moeserve::server {
namespace {

ApiReply json_reply(int status, const api::json& body) {
  ApiReply r;
  r.status = status;
  r.body = api::dump_json(body);
  return r;
}

// Engine refusals as HTTP errors: a full queue is 429 (retry), shutting
// down is 503, anything else is the caller's fault.
api::ApiError submit_error(const Status& st) {
  switch (st.code()) {
    case StatusCode::kResourceExhausted:
      return api::too_many_requests(st.message());
    case StatusCode::kCancelled:
      return api::unavailable(st.message());
    case StatusCode::kOutOfRange:
      return api::invalid_request(st.message(), "messages", "context_length_exceeded");
    default:
      return api::invalid_request(st.message());
  }
}

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

bool anthropic_route(std::string_view path) {
  return path == "/v1/messages" || path == "/v1/messages/count_tokens";
}

}  // namespace

ApiService::ApiService(runtime::Model& model, runtime::BatchEngine& engine, ServiceConfig config)
    : model_(model), engine_(engine), config_(std::move(config)), metrics_(std::make_shared<api::Metrics>()) {
  const std::string& source =
      config_.chat_template.empty() ? model.tokenizer().chat_template() : config_.chat_template;
  if (source.empty()) {
    template_error_ = "the model file has no chat template (tokenizer.chat_template); use /v1/completions";
  } else {
    auto t = chat::ChatTemplate::parse(source);
    if (t.is_ok()) {
      template_ = std::move(t.value());
    } else {
      template_error_ = "the model's chat template does not parse: " + t.status().message();
    }
  }
  metrics_->set(api::Gauge::kSlotsTotal, double(engine.options().n_slots));
  metrics_->set(api::Gauge::kKvCacheCapacityTokens,
                double(engine.options().n_slots * engine.options().n_ctx));
}

ApiReply ApiService::error_reply(const api::ApiError& e) { return json_reply(e.status, e.to_json()); }

ApiReply ApiService::handle(const ApiRequest& r) {
  ApiReply reply;
  // An allocation failure while handling one request fails that request
  // (503) and nothing else: the server goes on.
  try {
    if (config_.inject_allocation_failure && config_.inject_allocation_failure(r.path))
      throw std::bad_alloc();
    reply = route(r);
  } catch (const std::bad_alloc&) {
    reply =
        error_reply(api::unavailable("the server ran out of memory handling this request; retry later or "
                                     "send a smaller request"));
  }
  // Label by route, never by the raw path: garbage paths must not grow the metrics.
  // Anthropic's clients read errors in Anthropic's shape.
  if (anthropic_route(r.path) && reply.status >= 400 && !reply.stream)
    reply.body = api::anthropic_error_body(reply.status, reply.body);
  static constexpr std::string_view kRoutes[] = {"/health",
                                                 "/v1/models",
                                                 "/metrics",
                                                 "/stats/experts",
                                                 "/",
                                                 "/v1/chat/completions",
                                                 "/v1/completions",
                                                 "/tokenize",
                                                 "/detokenize",
                                                 "/v1/messages",
                                                 "/v1/messages/count_tokens",
                                                 "/v1/responses"};
  const bool known = std::find(std::begin(kRoutes), std::end(kRoutes), r.path) != std::end(kRoutes);
  metrics_->record_request(known ? std::string_view(r.path) : std::string_view("other"), reply.status);
  return reply;
}

ApiReply ApiService::route(const ApiRequest& r) {
  const bool open_route = r.path == "/health" || r.path == "/" || r.path == "/index.html";
  if (!config_.api_key.empty() && !open_route && r.authorization != "Bearer " + config_.api_key) {
    return error_reply(api::unauthorized(
        r.authorization.empty() ? "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
                                : "incorrect API key provided"));
  }
  if (r.method == "GET") {
    if (r.path == "/health") return health();
    if (r.path == "/v1/models" || r.path == "/models") return models();
    if (r.path == "/metrics") return metrics_text();
    if (r.path == "/stats/experts") return json_reply(200, expert_stats_json(model_));
    if (r.path == "/" || r.path == "/index.html") {
      ApiReply page;
      page.content_type = "text/html; charset=utf-8";
      page.body = config_.web_page;
      return page;
    }
  } else if (r.method == "POST") {
    if (r.path == "/v1/chat/completions" || r.path == "/chat/completions") return chat_completions(r);
    if (r.path == "/v1/completions" || r.path == "/completions") return completions(r);
    if (r.path == "/v1/messages") return messages(r);
    if (r.path == "/v1/messages/count_tokens") return count_tokens(r);
    if (r.path == "/v1/responses" || r.path == "/responses") return responses(r);
    if (r.path == "/tokenize") return tokenize(r.body);
    if (r.path == "/detokenize") return detokenize(r.body);
  }
  return error_reply(api::not_found("no route for " + r.method + " " + r.path, "unknown_url"));
}

ApiReply ApiService::health() const { return json_reply(200, {{"status", "ok"}}); }

ApiReply ApiService::models() const {
  const api::ModelInfo info{config_.model_id, api::unix_time_now()};
  return json_reply(200, api::models_list(std::span(&info, 1)));
}

std::optional<api::ApiError> ApiService::check_model(const std::string& requested) const {
  if (requested.empty() || requested == config_.model_id) return std::nullopt;
  return api::not_found(
      "the model '" + requested + "' does not exist; this server serves '" + config_.model_id + "'",
      "model_not_found");
}

api::Parsed<ApiService::ChatPrompt> ApiService::render_chat(const api::ChatCompletionRequest& req) const {
  api::Parsed<ChatPrompt> out;
  if (!template_) {
    out.error = api::invalid_request(template_error_);
    return out;
  }
  chat::ChatRenderInput in;
  in.messages = req.messages;
  if (req.tools.is_array() && req.tool_choice != "none") {
    // `strict` is the server's business: the template sees the same tools
    // either way, so the prompt (and the prefix cache) does not change.
    in.tools = req.tools;
    for (auto& tool : in.tools) tool["function"].erase("strict");
  }
  // JSON output starts with the JSON itself: no reasoning block.
  in.enable_thinking = req.params.format == api::OutputFormat::kText ? req.enable_thinking : false;
  in.extra = req.template_kwargs;
  const tok::Tokenizer& t = model_.tokenizer();
  if (t.bos_id()) in.bos_token = t.token_text(*t.bos_id());
  if (t.eos_id()) in.eos_token = t.token_text(*t.eos_id());
  auto prompt = encode_chat_prompt(t, *template_, in, config_.special_tokens_in_content);
  if (!prompt.is_ok()) {
    out.error = api::invalid_request("the chat template rejected the messages: " + prompt.status().message(),
                                     "messages");
    return out;
  }
  const std::string& text = prompt->text;
  // Templates that open the reasoning block themselves (thinking forced on).
  out.value = ChatPrompt{std::move(prompt->ids), ends_with(text, "<think>\n") || ends_with(text, "<think>")};
  return out;
}

SessionConfig ApiService::chat_session(const api::ChatCompletionRequest& req,
                                       const ChatPrompt& prompt) const {
  SessionConfig c;
  c.endpoint = Endpoint::kChat;
  c.stream = req.stream;
  c.include_usage = req.include_usage;
  c.meta = {api::make_id("chatcmpl-"), config_.model_id, api::unix_time_now()};
  c.parser.parse_reasoning = true;
  c.parser.starts_in_reasoning = prompt.starts_in_reasoning;
  c.parser.parse_tool_calls = req.tools_enabled();
  c.top_logprobs = req.params.logprobs ? req.params.top_logprobs : -1;
  c.prompt_tokens = int64_t(prompt.ids.size());
  return c;
}

ApiReply ApiService::chat_completions(const ApiRequest& r) {
  auto parsed = api::parse_chat_completion_request(r.body);
  if (!parsed.ok()) return error_reply(parsed.error);
  const api::ChatCompletionRequest& req = *parsed.value;
  if (auto e = check_model(req.model)) return error_reply(*e);
  auto prompt = render_chat(req);
  if (!prompt.ok()) return error_reply(prompt.error);
  SessionConfig c = chat_session(req, *prompt.value);
  return run(std::move(prompt.value->ids), req.params, std::move(c), r);
}

// Anthropic's clients name their own models (claude-...): any name is
// served by the loaded model, which the reply names.
ApiReply ApiService::messages(const ApiRequest& r) {
  auto parsed = api::parse_messages_request(r.body);
  if (!parsed.ok()) return error_reply(parsed.error);
  const api::ChatCompletionRequest& req = parsed.value->chat;
  auto prompt = render_chat(req);
  if (!prompt.ok()) return error_reply(prompt.error);
  SessionConfig c = chat_session(req, *prompt.value);
  c.endpoint = Endpoint::kMessages;
  c.stream = parsed.value->stream;
  c.include_usage = false;
  c.meta.id = api::make_id("msg_");
  c.top_logprobs = -1;
  return run(std::move(prompt.value->ids), req.params, std::move(c), r);
}

ApiReply ApiService::responses(const ApiRequest& r) {
  auto parsed = api::parse_responses_request(r.body);
  if (!parsed.ok()) return error_reply(parsed.error);
  const api::ChatCompletionRequest& req = parsed.value->chat;
  if (auto e = check_model(req.model)) return error_reply(*e);
  auto prompt = render_chat(req);
  if (!prompt.ok()) return error_reply(prompt.error);
  SessionConfig c = chat_session(req, *prompt.value);
  c.endpoint = Endpoint::kResponses;
  c.stream = parsed.value->stream;
  c.include_usage = false;
  c.meta.id = api::make_id("resp_");
  c.top_logprobs = -1;
  c.response_echo = parsed.value->echo;
  return run(std::move(prompt.value->ids), req.params, std::move(c), r);
}

ApiReply ApiService::count_tokens(const ApiRequest& r) {
  auto parsed = api::parse_count_tokens_request(r.body);
  if (!parsed.ok()) return error_reply(parsed.error);
  auto prompt = render_chat(parsed.value->chat);
  if (!prompt.ok()) return error_reply(prompt.error);
  return json_reply(200, {{"input_tokens", prompt.value->ids.size()}});
}

ApiReply ApiService::completions(const ApiRequest& r) {
  auto parsed = api::parse_completion_request(r.body);
  if (!parsed.ok()) return error_reply(parsed.error);
  const api::CompletionRequest& req = *parsed.value;
  if (auto e = check_model(req.model)) return error_reply(*e);
  const tok::Tokenizer& t = model_.tokenizer();
  std::vector<int32_t> prompt = req.prompt_is_tokens ? req.prompt_tokens : t.encode(req.prompt_text);
  SessionConfig c;
  c.endpoint = Endpoint::kCompletion;
  c.stream = req.stream;
  c.include_usage = req.include_usage;
  c.meta = {api::make_id("cmpl-"), config_.model_id, api::unix_time_now()};
  c.top_logprobs = req.params.logprobs ? req.params.top_logprobs : -1;
  if (req.echo) {
    const int32_t n_vocab = int32_t(model_.info().n_vocab);
    for (int32_t id : prompt) {
      if (id < 0 || id >= n_vocab)
        return error_reply(api::invalid_request("token id out of range", "prompt"));
    }
    c.echo = req.prompt_is_tokens ? t.decode(prompt) : req.prompt_text;
  }
  return run(std::move(prompt), req.params, std::move(c), r);
}

// Who a request counts against for --max-running-per-client: its API key
// when it sent one (several users behind one address stay apart), else
// its address.
namespace {
std::string client_of(const ApiRequest& r) {
  return r.authorization.empty() ? fmt::format("addr:{}", r.peer) : fmt::format("key:{}", r.authorization);
}
}  // namespace

ApiReply ApiService::run(std::vector<int32_t> prompt, const api::GenerationParams& params,
                         SessionConfig config, const ApiRequest& request) {
  const std::function<bool()>& client_alive = request.client_alive;
  const int64_t n_ctx = engine_.n_ctx(), n_prompt = int64_t(prompt.size());
  if (n_prompt == 0) return error_reply(api::invalid_request("the prompt is empty", "prompt"));
  if (n_prompt >= n_ctx) {
    return error_reply(api::invalid_request(
        fmt::format("the prompt has {} tokens; this server's context holds {} (including the answer)",
                    n_prompt, n_ctx),
        "messages", "context_length_exceeded"));
  }
  int64_t max_tokens = params.max_tokens < 0 ? n_ctx - n_prompt : params.max_tokens;
  if (n_prompt + max_tokens > n_ctx) {
    return error_reply(api::invalid_request(
        fmt::format(
            "max_tokens is {} but only {} tokens of the {}-token context are left after the {}-token prompt",
            max_tokens, n_ctx - n_prompt, n_ctx, n_prompt),
        "max_tokens", "context_length_exceeded"));
  }
  runtime::EngineRequest er;
  if (params.speculative) {
    const runtime::SpecConfig spec = params.speculative->over(engine_.options().spec);
    const Status valid = runtime::validate_spec_config(spec, "speculative");
    if (!valid.is_ok()) return error_reply(api::invalid_request(valid.message(), "speculative"));
    const auto& make = engine_.options().make_drafter;
    if (spec.mode == runtime::SpecMode::kDflash && (!make || make(spec) == nullptr)) {
      return error_reply(api::invalid_request(
          "speculative.mode dflash needs a draft model, and this server was started without one "
          "(start it with --draft FILE, or ask for ngram or auto)",
          "speculative"));
    }
    er.spec = spec;
  }
  er.prompt = std::move(prompt);
  er.max_tokens = max_tokens;
  er.priority = params.priority;
  er.client = client_of(request);
  er.sampling = params.sampling;
  if (!params.seed_given) er.sampling.seed = std::random_device{}() ^ (seed_counter_.fetch_add(1) << 32);
  er.stop = params.stop;
  er.top_logprobs = config.top_logprobs;
  const bool answer_format = params.grammar || params.format != api::OutputFormat::kText;
  // A constrained answer ends where its grammar does: ignore_eos leaves it alone.
  er.stop_at_eos = !params.ignore_eos || answer_format || params.tool_calls.has_value();
  // A required call wins over an answer format (the answer is the call); an
  // optional one gives way to it (a JSON answer has no room for a call).
  if (params.tool_calls && (params.tool_calls->required || !answer_format)) {
    er.constraint = tool_call_constraint(*params.tool_calls, config.parser.starts_in_reasoning);
  } else if (answer_format) {
    std::vector<int32_t> end_ids = end_token_ids();
    if (params.grammar) {
      const MaskTables m = mask_tables();
      er.constraint = std::make_shared<runtime::GrammarConstraint>(params.grammar, m.bytes,
                                                                   std::move(end_ids), m.trie, m.cache);
    } else {
      er.constraint = std::make_shared<runtime::JsonConstraint>(
          token_bytes(), std::move(end_ids), params.format == api::OutputFormat::kJsonObject);
    }
  }
  const bool stream = config.stream;
  auto session = std::make_shared<GenerationSession>(std::move(config), model_.tokenizer());
  er.on_token = [session](const runtime::TokenEvent& ev) { return session->on_token(ev); };
  er.on_finish = [session, metrics = metrics_](const Status& st, const runtime::RequestStats& s) {
    metrics->add(api::Counter::kPromptTokens, s.prompt_tokens);
    metrics->add(api::Counter::kGeneratedTokens, s.completion_tokens);
    metrics->record_prefix_lookup(s.cached_tokens > 0, s.cached_tokens);
    session->on_finish(st, s);
  };
  auto id = engine_.submit(std::move(er));
  if (!id.is_ok()) return error_reply(submit_error(id.status()));
  if (stream) {
    ApiReply r;
    r.content_type = "text/event-stream";
    r.stream = session;
    r.cancel = [this, session, id = *id] {
      session->client_gone();
      engine_.cancel(id);
    };
    return r;
  }
  std::optional<SessionOutcome> done;
  while (!(done = session->wait_for(std::chrono::milliseconds(250)))) {
    if (client_alive && !client_alive()) {
      session->client_gone();
      engine_.cancel(*id);
      done = session->wait();
      break;
    }
  }
  const SessionOutcome out = *done;
  if (!out.status.is_ok()) {
    // Out of memory (or another exhausted resource), or a process that
    // computes part of the model gone (a layer shard; it is restarted), is
    // the server's state, not the request's fault: 503, retry later.
    const bool unavailable =
        out.status.code() == StatusCode::kResourceExhausted || out.status.code() == StatusCode::kUnavailable;
    return error_reply(unavailable ? api::unavailable(out.status.message())
                                   : api::server_error(out.status.message()));
  }
  return json_reply(200, session->response_json());
}

std::vector<int32_t> ApiService::end_token_ids() const {
  std::vector<int32_t> ids;
  const tok::Tokenizer& t = model_.tokenizer();
  if (t.eos_id()) ids.push_back(*t.eos_id());
  if (t.eot_id()) ids.push_back(*t.eot_id());
  return ids;
}

std::shared_ptr<runtime::TokenConstraint> ApiService::tool_call_constraint(const api::ToolCallGrammar& g,
                                                                           bool starts_in_reasoning) {
  const MaskTables m = mask_tables();
  runtime::ToolCallConstraintOptions o;
  o.grammar = g.grammar;
  o.required = g.required;
  o.call_open = api::kToolCallOpen;
  o.starts_in_reasoning = starts_in_reasoning;
  o.think_open_token = model_.tokenizer().find_token("<think>");
  o.bytes = m.bytes;
  o.end_ids = end_token_ids();
  o.trie = m.trie;
  o.cache = m.cache;
  return std::make_shared<runtime::ToolCallConstraint>(std::move(o));
}

runtime::TokenBytes ApiService::token_bytes() {
  std::lock_guard lock(token_bytes_mu_);
  if (!token_bytes_) token_bytes_ = runtime::token_byte_table(model_.tokenizer(), model_.info().n_vocab);
  return token_bytes_;
}

// The vocabulary as a trie and the masks computed so far, built on the
// first grammar request and shared by all.
ApiService::MaskTables ApiService::mask_tables() {
  runtime::TokenBytes bytes = token_bytes();
  std::lock_guard lock(token_bytes_mu_);
  if (!mask_tables_.trie) {
    mask_tables_.bytes = bytes;
    mask_tables_.trie = std::make_shared<const runtime::grammar::TokenTrie>(*bytes);
    mask_tables_.cache = std::make_shared<runtime::grammar::MaskCache>();
  }
  return mask_tables_;
}

ApiReply ApiService::tokenize(const std::string& body) {
  auto parsed = api::parse_tokenize_request(body);
  if (!parsed.ok()) return error_reply(parsed.error);
  const tok::Tokenizer& t = model_.tokenizer();
  tok::EncodeOptions o;
  if (!parsed.value->add_special) o.add_bos = false;
  const std::vector<int32_t> ids = t.encode(parsed.value->content, o);
  api::json tokens = api::json::array();
  for (int32_t id : ids) {
    if (parsed.value->with_pieces) {
      tokens.push_back({{"id", id}, {"piece", t.decode(std::span<const int32_t>(&id, 1))}});
    } else {
      tokens.push_back(id);
    }
  }
  return json_reply(200, {{"tokens", tokens}});
}

ApiReply ApiService::detokenize(const std::string& body) {
  auto parsed = api::parse_detokenize_request(body);
  if (!parsed.ok()) return error_reply(parsed.error);
  const int32_t n_vocab = int32_t(model_.info().n_vocab);
  for (int32_t id : parsed.value->tokens) {
    if (id < 0 || id >= n_vocab) {
      return error_reply(api::invalid_request(
          fmt::format("token id {} is outside the vocabulary (0..{})", id, n_vocab - 1), "tokens"));
    }
  }
  return json_reply(200, {{"content", model_.tokenizer().decode(parsed.value->tokens)}});
}

ApiReply ApiService::metrics_text() {
  const runtime::EngineStats s = engine_.stats();
  {
    std::lock_guard lock(scrape_mu_);
    metrics_->record_prefill(s.prefill_tokens - last_scrape_.prefill_tokens,
                             s.prefill_seconds - last_scrape_.prefill_seconds);
    metrics_->record_decode(s.decode_tokens - last_scrape_.decode_tokens,
                            s.decode_seconds - last_scrape_.decode_seconds);
    metrics_->add(api::Counter::kPrefixCacheDiskHits, s.prefix.disk_hits - last_scrape_.prefix.disk_hits);
    metrics_->add(api::Counter::kKvPreemptions, s.preemptions - last_scrape_.preemptions);
    metrics_->add(api::Counter::kKvHostRestoredBlocks, s.kv_host.restored - last_scrape_.kv_host.restored);
    metrics_->add(api::Counter::kKvDiskRestoredBlocks, s.kv_disk.loaded - last_scrape_.kv_disk.loaded);
    last_scrape_ = s;
  }
  metrics_->set(api::Gauge::kQueueDepth, double(s.queue_depth));
  metrics_->set(api::Gauge::kActiveSlots, double(s.active_slots));
  metrics_->set(api::Gauge::kKvCacheUsedTokens, double(s.kv_used_tokens));
  metrics_->set(api::Gauge::kKvBlocksTotal, double(s.kv_pool_blocks));
  metrics_->set(api::Gauge::kKvBlocksFree, double(s.kv_free_blocks));
  metrics_->set(api::Gauge::kKvSwappedSequences, double(s.swapped_sequences));
  metrics_->set(api::Gauge::kKvHostBlocks, double(s.kv_host.blocks));
  metrics_->set(api::Gauge::kKvHostBytes, double(s.kv_host.bytes));
  metrics_->set(api::Gauge::kKvDiskBlocks, double(s.kv_disk.files));
  metrics_->set(api::Gauge::kKvDiskBytes, double(s.kv_disk.bytes));
  metrics_->set(api::Gauge::kPrefixCacheBytes, double(s.prefix.bytes));
  metrics_->set(api::Gauge::kPrefixCacheEntries, double(s.prefix.entries));
  metrics_->set(api::Gauge::kPrefixCacheDiskBytes, double(s.prefix.disk_bytes));
  metrics_->set(api::Gauge::kPrefixCacheDiskEntries, double(s.prefix.disk_entries));
  ApiReply r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = metrics_->render_prometheus() + expert_stats_prometheus(model_) + speculative_prometheus(s);
  if (config_.extra_metrics) r.body += config_.extra_metrics();
  return r;
}

}  // namespace moeserve::server
