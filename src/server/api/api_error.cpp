#include "server/api/api_error.h"

namespace moeserve::server::api {

nlohmann::json ApiError::to_json() const {
  nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return {{"error", e}};
}

ApiError invalid_request(std::string message, std::string param, std::string code) {
  return {400, "invalid_request_error", std::move(message), std::move(param), std::move(code)};
}
ApiError not_found(std::string message, std::string code) {
  return {404, "invalid_request_error", std::move(message), {}, std::move(code)};
}
ApiError unauthorized(std::string message) {
  return {401, "authentication_error", std::move(message), {}, "invalid_api_key"};
}
ApiError too_many_requests(std::string message) {
  return {429, "rate_limit_error", std::move(message), {}, "queue_full"};
}
ApiError unavailable(std::string message) {
  return {503, "server_error", std::move(message), {}, "unavailable"};
}
ApiError server_error(std::string message) { return {500, "server_error", std::move(message), {}, {}}; }

}  // namespace moeserve::server::api
