#include "server/api/json_schema_grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string_view>
#include <vector>

namespace moeserve::server::api {
namespace {

using ojson = nlohmann::ordered_json;

// The building blocks, added to a grammar when used. Whitespace between
// tokens is short; numbers have at most 16 digits a part.
const std::map<std::string, std::string, std::less<>> kPrimitives = {
    {"ws", R"([ \t\n]{0,8})"},
    {"char", R"([^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))"},
    {"string", R"("\"" char* "\"")"},
    {"integer", R"("-"? ("0" | [1-9] [0-9]{0,15}))"},
    {"number", R"(integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?)"},
    {"boolean", R"("true" | "false")"},
    {"null", R"("null")"},
    {"value", R"(object | array | string | number | boolean | null)"},
    {"object", R"("{" ws (string ws ":" ws value ws ("," ws string ws ":" ws value ws)*)? "}")"},
    {"array", R"("[" ws (value ws ("," ws value ws)*)? "]")"},
    // RFC 3339 full-date as validators check it (Ajv's "date"): each month's
    // days, and Feb 29 only in leap years (divisible by 4, centuries by 400).
    {"date",
     R"g([0-9]{4} "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])))g"
     R"g( | [0-9]{4} "-" ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30"))g"
     R"g( | [0-9]{4} "-02-" ("0" [1-9] | "1" [0-9] | "2" [0-8]))g"
     R"g( | ([0-9]{2} ("0" [48] | [2468] [048] | [13579] [26]) | ("0" [48] | [2468] [048] | [13579] [26] | "00") "00") "-02-29")g"},
    {"time",
     R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))"},
    {"hex", R"([0-9a-fA-F])"},
};
// What each building block uses.
const std::map<std::string, std::vector<std::string>, std::less<>> kUses = {
    {"string", {"char"}},
    {"number", {"integer"}},
    {"value", {"object", "array", "string", "number", "boolean", "null"}},
    {"object", {"ws", "string", "value"}},
    {"array", {"ws", "value"}},
};

const std::set<std::string, std::less<>> kAnnotations = {"title",    "description", "default",  "examples",
                                                         "$schema",  "$id",         "$comment", "deprecated",
                                                         "readOnly", "writeOnly"};

}  // namespace

// Bytes as a GBNF string literal.
std::string gbnf_literal(std::string_view bytes) {
  std::string out = "\"";
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

namespace {

std::string literal(std::string_view bytes) { return gbnf_literal(bytes); }

struct SchemaError {
  std::string message;
};

// Schemas into rules of one grammar: the rules each schema needs are named
// after where they come from and never collide (a rule name is taken once),
// and the building blocks are written once for all of them.
class Converter {
 public:
  Converter(const std::set<std::string>& reserved, const SchemaGrammarLimits& limits)
      : limits_(limits), taken_(reserved) {}

  // The schema becomes the rule `name` (which the caller has reserved).
  void add(const ojson& schema, const std::string& name, const std::string& path) {
    root_ = &schema;
    root_path_ = path;
    refs_.clear();
    taken_.insert(name);
    const std::string body = expression(schema, path, name, 0);
    rules_.insert(rules_.begin(), {name, body});
  }

  std::string gbnf() const {
    std::string out;
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    for (const std::string& p : used_) out += p + " ::= " + std::string(kPrimitives.find(p)->second) + "\n";
    return out;
  }

 private:
  [[noreturn]] static void fail(std::string message) { throw SchemaError{std::move(message)}; }

  void use(const std::string& primitive) {
    if (!used_.insert(primitive).second) return;
    if (auto u = kUses.find(primitive); u != kUses.end()) {
      for (const std::string& p : u->second) use(p);
    }
  }

  // A new rule named after `hint`, unique; returns its name.
  std::string add_rule(const std::string& hint, std::string body) {
    std::string base;
    for (const char c : hint) base += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
    if (base.empty() || kPrimitives.contains(base) || !std::isalpha(static_cast<unsigned char>(base[0])))
      base = "r-" + base;
    std::string name = base;
    for (int i = 2; taken_.contains(name); ++i) name = base + "-" + std::to_string(i);
    taken_.insert(name);
    if (rules_.size() >= limits_.max_rules)
      fail(fmt::format("the schema needs more than {} grammar rules", limits_.max_rules));
    rules_.emplace_back(name, std::move(body));
    return name;
  }
  void set_rule(const std::string& name, std::string body) {
    for (auto& [n, b] : rules_) {
      if (n == name) b = std::move(body);
    }
  }

  int64_t bound(const ojson& s, const char* key, const std::string& path, int64_t fallback) {
    auto it = s.find(key);
    if (it == s.end()) return fallback;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > limits_.max_repeat) {
      fail(fmt::format("'{}' at {} must be an integer 0..{}", key, path, limits_.max_repeat));
    }
    return it->get<int64_t>();
  }

  // "{m,n}" ("{m,}" when unbounded), or "" for {1,1}.
  static std::string repeat(int64_t min, int64_t max) {
    if (max < 0) return min == 0 ? "*" : min == 1 ? "+" : fmt::format("{{{},}}", min);
    if (min == max) return min == 1 ? "" : fmt::format("{{{}}}", min);
    return fmt::format("{{{},{}}}", min, max);
  }

  void check_keywords(const ojson& s, const std::string& path,
                      std::initializer_list<std::string_view> allowed) {
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (kAnnotations.contains(k) || std::find(allowed.begin(), allowed.end(), k) != allowed.end()) continue;
      fail(fmt::format("unsupported keyword '{}' at {}", k, path));
    }
  }

  // A GBNF expression for the schema at `path` (a rule name or a group).
  std::string expression(const ojson& s, const std::string& path, const std::string& hint, int depth) {
    if (depth > limits_.max_depth)
      fail(fmt::format("the schema nests deeper than {} at {}", limits_.max_depth, path));
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(fmt::format("the schema at {} is false: no value matches it", path));
      use("value");
      return "value";
    }
    if (!s.is_object()) fail(fmt::format("the schema at {} must be an object or a boolean", path));
    if (s.contains("$ref")) return reference(s, path);
    if (s.contains("anyOf") || s.contains("oneOf")) return alternatives(s, path, hint, depth);
    if (s.contains("allOf")) {
      check_keywords(s, path, {"allOf", "$defs", "definitions"});
      const ojson& all = s["allOf"];
      if (!all.is_array() || all.size() != 1)
        fail(fmt::format("'allOf' at {}: only a list of one schema is supported", path));
      return expression(all[0], path + ".allOf[0]", hint, depth + 1);
    }
    if (s.contains("const")) {
      check_keywords(s, path, {"const", "type", "$defs", "definitions"});
      return literal(s["const"].dump(-1, ' ', false, ojson::error_handler_t::replace));
    }
    if (s.contains("enum")) return enumeration(s, path);
    auto type = s.find("type");
    if (type == s.end()) {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        return object(s, path, hint, depth);
      if (s.contains("items") || s.contains("minItems") || s.contains("maxItems"))
        return array(s, path, hint, depth);
      check_keywords(s, path, {"$defs", "definitions"});
      use("value");
      return "value";
    }
    if (type->is_array()) return type_list(s, path, hint, depth);
    if (!type->is_string()) fail(fmt::format("'type' at {} must be a string or a list of strings", path));
    return typed(s, type->get<std::string>(), path, hint, depth);
  }

  std::string typed(const ojson& s, const std::string& type, const std::string& path, const std::string& hint,
                    int depth) {
    if (type == "object") return object(s, path, hint, depth);
    if (type == "array") return array(s, path, hint, depth);
    if (type == "string") return string(s, path, hint);
    if (type == "number" || type == "integer" || type == "boolean" || type == "null") {
      check_keywords(s, path, {"type", "$defs", "definitions"});
      use(type);
      return type;
    }
    fail(fmt::format("'type' at {} is '{}': not a JSON Schema type", path, type));
  }

  // {"type": ["string", "null"], "maxLength": 3}: each type with the
  // keywords that apply to it (the others belong to its siblings).
  std::string type_list(const ojson& s, const std::string& path, const std::string& hint, int depth) {
    static const std::map<std::string, std::set<std::string>, std::less<>> kOwn = {
        {"string", {"minLength", "maxLength", "format"}},
        {"array", {"items", "minItems", "maxItems"}},
        {"object", {"properties", "required", "additionalProperties"}},
    };
    std::vector<std::string> alts;
    for (const ojson& t : s["type"]) {
      if (!t.is_string()) fail(fmt::format("'type' at {} must list strings", path));
      const std::string name = t.get<std::string>();
      ojson one = ojson::object();
      for (auto it = s.begin(); it != s.end(); ++it) {
        bool other_types = false;
        for (const auto& [type, keys] : kOwn)
          other_types = other_types || (type != name && keys.contains(it.key()));
        if (!other_types) one[it.key()] = it.value();
      }
      one["type"] = t;
      alts.push_back(typed(one, t.get<std::string>(), path, hint, depth + 1));
    }
    if (alts.empty()) fail(fmt::format("'type' at {} lists no type", path));
    return group(alts);
  }

  static std::string group(const std::vector<std::string>& alts) {
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + ")";
  }

  std::string enumeration(const ojson& s, const std::string& path) {
    check_keywords(s, path, {"enum", "type", "$defs", "definitions"});
    const ojson& values = s["enum"];
    if (!values.is_array() || values.empty())
      fail(fmt::format("'enum' at {} must be a non-empty list", path));
    std::vector<std::string> alts;
    for (const ojson& v : values)
      alts.push_back(literal(v.dump(-1, ' ', false, ojson::error_handler_t::replace)));
    return group(alts);
  }

  std::string alternatives(const ojson& s, const std::string& path, const std::string& hint, int depth) {
    const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
    check_keywords(s, path, {key, "$defs", "definitions"});
    const ojson& list = s[key];
    if (!list.is_array() || list.empty()) fail(fmt::format("'{}' at {} must be a non-empty list", key, path));
    std::vector<std::string> alts;
    for (size_t i = 0; i < list.size(); ++i)
      alts.push_back(expression(list[i], fmt::format("{}.{}[{}]", path, key, i), hint, depth + 1));
    return group(alts);
  }

  // #/$defs/Name or #/definitions/Name: a rule of its own (so it may recur).
  std::string reference(const ojson& s, const std::string& path) {
    // ({"$ref": "#/$defs/X", "$defs": {...}} at the root is how generators
    // such as zod-to-json-schema name their top type.)
    check_keywords(s, path, {"$ref", "$defs", "definitions"});
    if (!s["$ref"].is_string()) fail(fmt::format("'$ref' at {} must be a string", path));
    const std::string ref = s["$ref"].get<std::string>();
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    std::string section, name;
    for (const std::string_view s : {std::string_view("$defs"), std::string_view("definitions")}) {
      const std::string prefix = "#/" + std::string(s) + "/";
      if (ref.rfind(prefix, 0) == 0) section = s, name = ref.substr(prefix.size());
    }
    const ojson* target = nullptr;
    const ojson& root = *root_;
    if (!section.empty() && root.is_object() && root.contains(section) && root[section].is_object() &&
        root[section].contains(name)) {
      target = &root[section][name];
    }
    if (target == nullptr) {
      fail(fmt::format(
          "'$ref' at {} is '{}': only #/$defs/NAME and #/definitions/NAME of this schema are supported", path,
          ref));
    }
    const std::string rule = add_rule("ref-" + name, "");
    refs_.emplace(ref, rule);
    set_rule(rule, expression(*target, root_path_ + "." + section + "." + name, rule, 0));
    return rule;
  }

  std::string string(const ojson& s, const std::string& path, const std::string& hint) {
    check_keywords(s, path, {"type", "minLength", "maxLength", "format", "$defs", "definitions"});
    if (auto f = s.find("format"); f != s.end()) {
      const std::string format = f->is_string() ? f->get<std::string>() : "";
      if (format == "date" || format == "time") {
        use(format);
        return "\"\\\"\" " + format + " \"\\\"\"";
      }
      if (format == "date-time") {
        use("date"), use("time");
        return "\"\\\"\" date \"T\" time \"\\\"\"";
      }
      if (format == "uuid") {
        use("hex");
        return R"("\"" hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12} "\"")";
      }
      fail(fmt::format("unsupported string format '{}' at {} (date, time, date-time and uuid are)", f->dump(),
                       path));
    }
    const int64_t min = bound(s, "minLength", path, 0), max = bound(s, "maxLength", path, -1);
    if (max >= 0 && min > max) fail(fmt::format("minLength > maxLength at {}", path));
    use("string");
    if (min == 0 && max < 0) return "string";
    return add_rule(hint + "-string",
                    "\"\\\"\" char" + (min == 1 && max == 1 ? "" : repeat(min, max)) + " \"\\\"\"");
  }

  std::string array(const ojson& s, const std::string& path, const std::string& hint, int depth) {
    check_keywords(s, path, {"type", "items", "minItems", "maxItems", "$defs", "definitions"});
    const int64_t min = bound(s, "minItems", path, 0), max = bound(s, "maxItems", path, -1);
    if (max >= 0 && min > max) fail(fmt::format("minItems > maxItems at {}", path));
    use("ws");
    if (max == 0) return R"("[" ws "]")";
    auto items = s.find("items");
    std::string item = "value";
    if (items != s.end()) {
      item = expression(*items, path + ".items", hint + "-item", depth + 1);
    } else {
      use("value");
    }
    const std::string more = "(\",\" ws " + item + " ws)";
    const int64_t more_max = max < 0 ? -1 : max - 1;
    std::string body;
    if (min == 0) {
      body = "\"[\" ws (" + item + " ws " + more + repeat(0, more_max) + ")? \"]\"";
    } else {
      const std::string r = repeat(min - 1, more_max);
      body = "\"[\" ws " + item + " ws " + (r.empty() ? more : more + r) + " \"]\"";
      if (min == 1 && max == 1) body = "\"[\" ws " + item + " ws \"]\"";
    }
    return add_rule(hint + "-array", body);
  }

  std::string object(const ojson& s, const std::string& path, const std::string& hint, int depth) {
    check_keywords(s, path,
                   {"type", "properties", "required", "additionalProperties", "$defs", "definitions"});
    use("ws");
    std::vector<std::pair<std::string, const ojson*>> props;
    static const ojson kAny = ojson::object();
    if (auto p = s.find("properties"); p != s.end()) {
      if (!p->is_object()) fail(fmt::format("'properties' at {} must be an object", path));
      for (auto it = p->begin(); it != p->end(); ++it) props.emplace_back(it.key(), &it.value());
    }
    std::set<std::string> required;
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) fail(fmt::format("'required' at {} must be a list of names", path));
      for (const ojson& n : *r) {
        if (!n.is_string()) fail(fmt::format("'required' at {} must be a list of names", path));
        const std::string name = n.get<std::string>();
        required.insert(name);
        const bool declared =
            std::any_of(props.begin(), props.end(), [&](const auto& p) { return p.first == name; });
        if (!declared) props.emplace_back(name, &kAny);
      }
    }
    if (props.empty()) return open_object(s, path, hint, depth);
    // kv_i, then F_i (nothing written yet) and R_i (something written: a
    // comma first) from the last property back.
    std::vector<std::string> kv;
    for (const auto& [name, schema] : props) {
      const std::string key = literal(ojson(name).dump(-1, ' ', false, ojson::error_handler_t::replace));
      kv.push_back(key + " ws \":\" ws " +
                   expression(*schema, path + ".properties." + name, hint + "-" + name, depth + 1) + " ws");
    }
    std::string first = "", rest = "";  // F_n, R_n: nothing
    for (size_t i = props.size(); i-- > 0;) {
      const bool req = required.contains(props[i].first);
      const std::string with_rest = rest.empty() ? "" : " " + rest;
      const std::string r_body = "\",\" ws " + kv[i] + with_rest;
      std::string f_body = kv[i] + with_rest;
      std::string r_rule;
      if (req) {
        r_rule = add_rule(hint + "-rest", r_body);
      } else {
        r_rule = add_rule(hint + "-rest", "(" + r_body + ")" + (rest.empty() ? "?" : " | " + rest));
        f_body = "(" + f_body + ")" + (first.empty() ? "?" : " | " + first);
      }
      first = add_rule(hint + "-first", f_body);
      rest = r_rule;
    }
    return add_rule(hint, "\"{\" ws " + first + " \"}\"");
  }

  // An object without declared properties: any keys, values of
  // additionalProperties (a schema) or any.
  std::string open_object(const ojson& s, const std::string& path, const std::string& hint, int depth) {
    auto extra = s.find("additionalProperties");
    if (extra == s.end() || extra->is_boolean()) {
      if (extra != s.end() && !extra->get<bool>()) return R"("{" ws "}")";
      use("object");
      return "object";
    }
    use("string");
    const std::string v = expression(*extra, path + ".additionalProperties", hint + "-value", depth + 1);
    const std::string kv = "string ws \":\" ws " + v + " ws";
    return add_rule(hint, "\"{\" ws (" + kv + " (\",\" ws " + kv + ")*)? \"}\"");
  }

  const ojson* root_ = nullptr;  // the schema being added: what its $refs point into
  std::string root_path_;
  SchemaGrammarLimits limits_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> taken_;
  std::set<std::string> used_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

Result<std::string> json_schema_to_gbnf(const ojson& schema, const SchemaGrammarLimits& limits) {
  const SchemaRule root{"root", &schema, "schema"};
  return json_schema_rules(std::span(&root, 1), {}, limits);
}

Result<std::string> json_schema_rules(std::span<const SchemaRule> schemas,
                                      const std::set<std::string>& reserved,
                                      const SchemaGrammarLimits& limits) {
  std::set<std::string> taken = reserved;
  for (const SchemaRule& s : schemas) taken.insert(s.name);
  try {
    Converter converter(taken, limits);
    for (const SchemaRule& s : schemas) converter.add(*s.schema, s.name, s.path);
    return converter.gbnf();
  } catch (const SchemaError& e) {
    return Status(StatusCode::kInvalidArgument, e.message);
  }
}

}  // namespace moeserve::server::api
