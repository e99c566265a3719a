#include "moe/json_file.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace moeserve::moe {

using nlohmann::json;

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "{}: cannot open: {}", path, std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return make_error(StatusCode::kIoError, "{}: read failed", path);
  return s.str();
}

Status write_text_file(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return make_error(StatusCode::kIoError, "{}: cannot write: {}", tmp, std::strerror(errno));
    out.write(text.data(), std::streamsize(text.size()));
    out.flush();
    if (!out) return make_error(StatusCode::kIoError, "{}: write failed", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return make_error(StatusCode::kIoError, "{}: cannot replace: {}", path, std::strerror(err));
  }
  return Status::ok();
}

Result<json> parse_json(std::string_view text, std::string_view source) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    return make_error(StatusCode::kInvalidArgument, "{}: not JSON ({})", source, e.what());
  }
}

Result<int64_t> json_int(const json& obj, std::string_view key, int64_t lo, int64_t hi,
                         std::string_view source, std::string_view where) {
  const auto it = obj.find(std::string(key));
  if (it == obj.end() || !it->is_number_integer()) {
    return make_error(StatusCode::kInvalidArgument, "{}: {}.{} must be an integer", source, where, key);
  }
  const int64_t v =
      it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : it->get<int64_t>();
  if (v < lo || v > hi) {
    return make_error(StatusCode::kInvalidArgument, "{}: {}.{} is {}, outside {}..{}", source, where, key, v,
                      lo, hi);
  }
  return v;
}

Result<std::string> json_string(const json& obj, std::string_view key, std::string_view source,
                                std::string_view where) {
  const auto it = obj.find(std::string(key));
  if (it == obj.end() || !it->is_string()) {
    return make_error(StatusCode::kInvalidArgument, "{}: {}.{} must be a string", source, where, key);
  }
  return it->get<std::string>();
}

Result<const json*> json_array(const json& obj, std::string_view key, std::string_view source,
                               std::string_view where) {
  const auto it = obj.find(std::string(key));
  if (it == obj.end() || !it->is_array()) {
    return make_error(StatusCode::kInvalidArgument, "{}: {}.{} must be an array", source, where, key);
  }
  return &*it;
}

nlohmann::ordered_json file_head(std::string_view format, int64_t version, const ModelIdentity& m) {
  return {{"format", format},
          {"version", version},
          {"model",
           {{"arch", m.arch},
            {"fingerprint", m.fingerprint},
            {"n_layer", m.n_layer},
            {"n_expert", m.n_expert},
            {"n_expert_used", m.n_expert_used}}}};
}

std::string layered_json(const nlohmann::ordered_json& head,
                         const std::vector<nlohmann::ordered_json>& layers) {
  std::string out = "{\n";
  for (const auto& [key, value] : head.items())
    out += fmt::format(" {}: {},\n", json(key).dump(), value.dump());
  out += " \"layers\": [\n";
  for (size_t i = 0; i < layers.size(); ++i)
    out += "  " + layers[i].dump() + (i + 1 < layers.size() ? ",\n" : "\n");
  out += " ]\n}\n";
  return out;
}

Status check_header(const json& doc, std::string_view format, int64_t version, std::string_view source) {
  if (!doc.is_object()) return make_error(StatusCode::kInvalidArgument, "{}: expected a JSON object", source);
  MOESERVE_ASSIGN_OR_RETURN(std::string f, json_string(doc, "format", source, "(top level)"));
  if (f != format) {
    return make_error(StatusCode::kInvalidArgument, "{}: format is \"{}\", expected \"{}\"", source, f,
                      format);
  }
  MOESERVE_ASSIGN_OR_RETURN(int64_t v, json_int(doc, "version", 0, INT64_MAX, source, "(top level)"));
  if (v != version) {
    return make_error(StatusCode::kInvalidArgument,
                      "{}: version {} is not supported (this build reads version {})", source, v, version);
  }
  return Status::ok();
}

}  // namespace moeserve::moe
