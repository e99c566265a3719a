#include "server/api/request_fields.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "server/api/compiled_grammars.h"
#include "server/api/json_schema_grammar.h"

namespace moeserve::server::api::detail {

void fail(std::string message, std::string param) {
  throw RequestError{invalid_request(std::move(message), std::move(param))};
}

const ojson* find_field(const ojson& object, std::string_view name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

namespace {

std::string in_quotes(std::string_view name) {
  std::string out;  // (not "'" + std::string(name) + "'": GCC 12 warns falsely on that, -Wrestrict)
  out.reserve(name.size() + 2);
  out += '\'';
  out.append(name);
  out += '\'';
  return out;
}

std::string param_or(std::string param, std::string_view name) {
  return param.empty() ? std::string(name) : std::move(param);
}

}  // namespace

std::optional<bool> read_bool(const ojson& object, std::string_view name, std::string param) {
  const ojson* v = find_field(object, name);
  if (!v) return std::nullopt;
  param = param_or(std::move(param), name);
  if (!v->is_boolean()) fail(in_quotes(param) + " must be a boolean", param);
  return v->get<bool>();
}

std::optional<std::string> read_string(const ojson& object, std::string_view name, std::string param) {
  const ojson* v = find_field(object, name);
  if (!v) return std::nullopt;
  param = param_or(std::move(param), name);
  if (!v->is_string()) fail(in_quotes(param) + " must be a string", param);
  return v->get<std::string>();
}

std::optional<double> read_number(const ojson& object, std::string_view name,
                                  const std::function<bool(double)>& ok, std::string_view expected) {
  const ojson* v = find_field(object, name);
  if (!v) return std::nullopt;
  // JSON has no NaN, but a huge exponent parses to infinity: the range check rejects it.
  if (!v->is_number() || !std::isfinite(v->get<double>()) || !ok(v->get<double>())) {
    fail(in_quotes(name) + " must be " + std::string(expected), std::string(name));
  }
  return v->get<double>();
}

namespace {

// The integer value of `v` if it is an integer in [min, max].
std::optional<int64_t> integer_in(const ojson& v, int64_t min, int64_t max) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    int64_t i = static_cast<int64_t>(u);
    if (i < min || i > max) return std::nullopt;
    return i;
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < min || i > max) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

}  // namespace

std::optional<int64_t> read_integer(const ojson& object, std::string_view name, int64_t min, int64_t max,
                                    std::string_view expected) {
  const ojson* v = find_field(object, name);
  if (!v) return std::nullopt;
  std::optional<int64_t> i = integer_in(*v, min, max);
  if (!i) fail(in_quotes(name) + " must be " + std::string(expected), std::string(name));
  return i;
}

std::vector<int32_t> read_token_ids(const ojson& array, const std::string& param) {
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (const ojson& v : array) {
    std::optional<int64_t> id = integer_in(v, 0, std::numeric_limits<int32_t>::max());
    if (!id) fail(in_quotes(param) + " must contain only token ids (integers >= 0)", param);
    ids.push_back(static_cast<int32_t>(*id));
  }
  return ids;
}

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

void read_sampling(const ojson& body, runtime::SamplerOptions& s) {
  auto in = [](double lo, double hi) { return [lo, hi](double v) { return v >= lo && v <= hi; }; };
  if (auto v = read_number(body, "temperature", in(0, 2), "a number between 0 and 2")) {
    s.temperature = static_cast<float>(*v);
  }
  if (auto v = read_number(
          body, "top_p", [](double x) { return x > 0 && x <= 1; }, "a number greater than 0 and at most 1")) {
    s.top_p = static_cast<float>(*v);
  }
  if (auto v = read_number(body, "min_p", in(0, 1), "a number between 0 and 1"))
    s.min_p = static_cast<float>(*v);
  // top_k beyond int32 means "every token", the same as 0.
  if (auto v = read_integer(body, "top_k", 0, kInt64Max, "an integer >= 0")) {
    s.top_k = static_cast<int32_t>(std::min(*v, kInt32Max));
  }
  if (auto v = read_number(body, "presence_penalty", in(-2, 2), "a number between -2 and 2")) {
    s.presence_penalty = static_cast<float>(*v);
  }
  if (auto v = read_number(body, "frequency_penalty", in(-2, 2), "a number between -2 and 2")) {
    s.frequency_penalty = static_cast<float>(*v);
  }
  if (auto v = read_number(
          body, "repeat_penalty", [](double x) { return x > 0; }, "a number greater than 0")) {
    s.repeat_penalty = static_cast<float>(*v);
  }
  if (auto v = read_integer(body, "repeat_last_n", -1, kInt32Max, "an integer >= -1")) {
    s.repeat_last_n = static_cast<int32_t>(*v);
  }
}

// seed: any JSON integer (OpenAI allows negative ones); its bits seed the RNG.
void read_seed(const ojson& body, GenerationParams& p) {
  const ojson* v = find_field(body, "seed");
  if (!v) return;
  if (v->is_number_unsigned()) {
    p.sampling.seed = v->get<uint64_t>();
  } else if (v->is_number_integer()) {
    p.sampling.seed = static_cast<uint64_t>(v->get<int64_t>());
  } else {
    fail("'seed' must be an integer", "seed");
  }
  p.seed_given = true;
}

void read_stop(const ojson& body, GenerationParams& p) {
  const ojson* v = find_field(body, "stop");
  if (!v) return;
  const std::string expected = "'stop' must be a non-empty string or an array of up to " +
                               std::to_string(kMaxStopStrings) + " non-empty strings";
  if (v->is_string()) {
    if (v->get_ref<const std::string&>().empty()) fail(expected, "stop");
    p.stop.push_back(v->get<std::string>());
    return;
  }
  if (!v->is_array() || v->size() > kMaxStopStrings) fail(expected, "stop");
  for (const ojson& s : *v) {
    if (!s.is_string() || s.get_ref<const std::string&>().empty()) fail(expected, "stop");
    p.stop.push_back(s.get<std::string>());
  }
}

// Chat: logprobs is a bool and top_logprobs a separate count.
// Completions: logprobs is the count itself (0 = only the sampled token's).
void read_logprobs(const ojson& body, Endpoint endpoint, GenerationParams& p) {
  const std::string range = "an integer between 0 and " + std::to_string(kMaxTopLogprobs);
  if (endpoint == Endpoint::kChat) {
    p.logprobs = read_bool(body, "logprobs").value_or(false);
    if (auto n = read_integer(body, "top_logprobs", 0, kMaxTopLogprobs, range)) {
      if (*n > 0 && !p.logprobs) fail("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
      p.top_logprobs = static_cast<int>(*n);
    }
    return;
  }
  const ojson* v = find_field(body, "logprobs");
  if (!v) return;
  if (v->is_boolean()) {  // lenient: some clients send true/false
    p.logprobs = v->get<bool>();
    return;
  }
  auto n = read_integer(body, "logprobs", 0, kMaxTopLogprobs, range);
  p.logprobs = true;
  p.top_logprobs = static_cast<int>(*n);
}

}  // namespace

namespace {

std::shared_ptr<const runtime::grammar::Grammar> compile(const std::string& gbnf, const std::string& param) {
  auto g = compiled_grammar(gbnf);
  if (!g.is_ok()) fail(g.status().message(), param);
  return *g;
}

}  // namespace

// response_format: {"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": {...}}};
// a schema becomes the answer's grammar.
void read_response_format(const ojson& body, GenerationParams& p) {
  const ojson* f = find_field(body, "response_format");
  if (!f) return;
  if (!f->is_object()) fail("'response_format' must be an object", "response_format");
  const std::string type = read_string(*f, "type", "response_format.type").value_or("");
  if (type == "text") return;
  if (type == "json_object") {
    p.format = OutputFormat::kJsonObject;
    return;
  }
  if (type != "json_schema")
    fail("'response_format.type' must be text, json_object or json_schema", "response_format.type");
  const ojson* js = find_field(*f, "json_schema");
  if (!js || !js->is_object())
    fail("'response_format.json_schema' must be an object", "response_format.json_schema");
  const ojson* schema = find_field(*js, "schema");
  p.format = OutputFormat::kJsonValue;
  if (!schema) return;
  if (!schema->is_object() && !schema->is_boolean())
    fail("'response_format.json_schema.schema' must be an object", "response_format.json_schema.schema");
  Result<std::string> gbnf = json_schema_to_gbnf(*schema);
  if (!gbnf.is_ok()) {
    fail("response_format.json_schema.schema: " + gbnf.status().message(),
         "response_format.json_schema.schema");
  }
  p.grammar = compile(*gbnf, "response_format.json_schema.schema");
}

// grammar: GBNF text (llama-server's field); "" or null: none.
void read_grammar(const ojson& body, GenerationParams& p) {
  const ojson* g = find_field(body, "grammar");
  if (!g || g->is_null()) return;
  if (!g->is_string()) fail("'grammar' must be a string of GBNF rules with a 'root' rule", "grammar");
  if (g->get_ref<const std::string&>().empty()) return;
  if (p.format != OutputFormat::kText)
    fail("give either 'grammar' or a JSON 'response_format', not both", "grammar");
  p.grammar = compile(g->get<std::string>(), "grammar");
}

constexpr int64_t kPriorityLimit = 1000000;

// speculative: moeserve's extension (openai_request.h, SpeculativeParams).
void read_speculative(const ojson& body, GenerationParams& p) {
  const ojson* v = find_field(body, "speculative");
  if (!v) return;
  SpeculativeParams sp;
  auto mode_of = [](const std::string& text, const std::string& param) {
    Result<runtime::SpecMode> m = runtime::parse_spec_mode(text);
    if (!m.is_ok()) fail("'" + param + "': " + m.status().message(), param);
    return *m;
  };
  if (v->is_string()) {
    sp.mode = mode_of(v->get<std::string>(), "speculative");
  } else if (v->is_object()) {
    for (const auto& [key, value] : v->items()) {
      if (key != "mode" && key != "max" && key != "tree")
        fail("'speculative." + key + "' is not a field of 'speculative' (mode, max, tree)",
             "speculative." + key);
    }
    if (auto mode = read_string(*v, "mode", "speculative.mode")) sp.mode = mode_of(*mode, "speculative.mode");
    if (auto max = read_integer(*v, "max", 1, runtime::kSpecMaxDraftLimit,
                                "an integer 1.." + std::to_string(runtime::kSpecMaxDraftLimit)))
      sp.max_draft = int(*max);
    if (auto tree = read_integer(*v, "tree", 0, runtime::kSpecMaxDraftLimit,
                                 "an integer 0.." + std::to_string(runtime::kSpecMaxDraftLimit)))
      sp.tree_nodes = int(*tree);
  } else {
    fail("'speculative' must be an object {\"mode\": ..., \"max\": ..., \"tree\": ...} or a mode name",
         "speculative");
  }
  p.speculative = sp;
}

std::string required_string(const ojson& object, std::string_view name, const std::string& param) {
  std::optional<std::string> v = read_string(object, name, param);
  if (!v) fail("'" + param + "' is required", param);
  return std::move(*v);
}

ojson chat_function_tools(const ojson& tools, std::string_view schema_field, bool require_function_type) {
  if (!tools.is_array()) fail("'tools' must be an array", "tools");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string p = "tools[" + std::to_string(i) + "]";
    const ojson& t = tools[i];
    if (!t.is_object()) fail("'" + p + "' must be an object", p);
    if (require_function_type) {
      const std::string type = required_string(t, "type", p + ".type");
      if (type != "function") fail("only function tools are supported (got '" + type + "')", p + ".type");
    }
    ojson function = {{"name", required_string(t, "name", p + ".name")}};
    if (const ojson* d = find_field(t, "description")) function["description"] = *d;
    const ojson* schema = find_field(t, schema_field);
    function["parameters"] = schema ? *schema : ojson{{"type", "object"}};
    if (auto strict = read_bool(t, "strict", p + ".strict")) function["strict"] = *strict;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

GenerationParams read_generation_params(const ojson& body, Endpoint endpoint) {
  GenerationParams p;
  read_sampling(body, p.sampling);
  read_seed(body, p);
  if (const ojson* n = find_field(body, "n")) {
    if (!(n->is_number_integer() && n->get<int64_t>() == 1)) fail("only n=1 is supported", "n");
  }
  auto max_tokens = read_integer(body, "max_tokens", 1, kInt64Max, "an integer >= 1");
  auto max_completion = read_integer(body, "max_completion_tokens", 1, kInt64Max, "an integer >= 1");
  if (max_completion) {
    p.max_tokens = *max_completion;
  } else if (max_tokens) {
    p.max_tokens = *max_tokens;
  }
  p.ignore_eos = read_bool(body, "ignore_eos").value_or(false);
  read_stop(body, p);
  read_logprobs(body, endpoint, p);
  if (endpoint == Endpoint::kChat) read_response_format(body, p);
  read_grammar(body, p);
  read_speculative(body, p);
  if (auto priority = read_integer(body, "priority", -kPriorityLimit, kPriorityLimit,
                                   "an integer from -1000000 to 1000000 (lower is served first)"))
    p.priority = int(*priority);
  return p;
}

}  // namespace moeserve::server::api::detail
