// Reading and writing the small JSON files of expert placement (stats,
// placements): whole-file I/O with errors that name the path, and typed
// field access whose errors name the entry ("layers[3].hot[2]").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace moeserve::moe {

Result<std::string> read_text_file(const std::string& path);
// Writes through a temporary file and a rename: a reader never sees half a file.
Status write_text_file(const std::string& path, std::string_view text);

// The parsed document; kInvalidArgument "SOURCE: not JSON (...)" otherwise.
Result<nlohmann::json> parse_json(std::string_view text, std::string_view source);

// obj[key] as an integer in [lo, hi]; `where` names obj in errors.
Result<int64_t> json_int(const nlohmann::json& obj, std::string_view key, int64_t lo, int64_t hi,
                         std::string_view source, std::string_view where);
Result<std::string> json_string(const nlohmann::json& obj, std::string_view key, std::string_view source,
                                std::string_view where);
// obj[key], which must be an array.
Result<const nlohmann::json*> json_array(const nlohmann::json& obj, std::string_view key,
                                         std::string_view source, std::string_view where);
// The head every file of this kind starts with: format, version, and the
// model it was made for.
struct ModelIdentity {
  std::string arch, fingerprint;
  int64_t n_layer = 0, n_expert = 0, n_expert_used = 0;
};
nlohmann::ordered_json file_head(std::string_view format, int64_t version, const ModelIdentity& model);

// A document whose top-level fields go one a line (objects compact), then
// "layers" with one layer's entry a line: readable, diffable, small.
std::string layered_json(const nlohmann::ordered_json& head,
                         const std::vector<nlohmann::ordered_json>& layers);

// The "format"/"version" header every file of this kind starts with.
Status check_header(const nlohmann::json& doc, std::string_view format, int64_t version,
                    std::string_view source);

}  // namespace moeserve::moe
