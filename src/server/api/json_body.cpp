#include "server/api/json_body.h"

#include <string>

namespace moeserve::server::api {

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

namespace {

// nlohmann messages start with "[json.exception.parse_error.101] "; clients
// only need the part after it ("parse error at line 1, column 5: ...").
// nlohmann also appends "; last read: '<client bytes>'", which may be
// invalid UTF-8 (the error body would then fail to serialize) or control
// characters: drop it, and keep whatever else is left printable ASCII.
std::string strip_exception_prefix(const char* what) {
  std::string s = what;
  if (!s.empty() && s[0] == '[') {
    size_t end = s.find("] ");
    if (end != std::string::npos) s.erase(0, end + 2);
  }
  size_t last_read = s.find("; last read:");
  if (last_read != std::string::npos) s.erase(last_read);
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return s;
}

}  // namespace

Parsed<nlohmann::ordered_json> parse_json_text(std::string_view text, int max_depth) {
  Parsed<nlohmann::ordered_json> out;
  if (json_nesting_depth(text, max_depth) > max_depth) {
    out.error = invalid_request("invalid JSON: nested deeper than " + std::to_string(max_depth) + " levels");
    return out;
  }
  try {
    out.value = nlohmann::ordered_json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    out.error = invalid_request("invalid JSON at byte " + std::to_string(e.byte) + ": " +
                                strip_exception_prefix(e.what()));
  } catch (const std::exception& e) {
    out.error = invalid_request(std::string("invalid JSON: ") + strip_exception_prefix(e.what()));
  }
  return out;
}

Parsed<nlohmann::ordered_json> parse_json_object_body(std::string_view body) {
  Parsed<nlohmann::ordered_json> out = parse_json_text(body);
  if (out.ok() && !out.value->is_object()) {
    out.value.reset();
    out.error = invalid_request("the request body must be a JSON object");
  }
  return out;
}

}  // namespace moeserve::server::api
