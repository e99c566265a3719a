// OpenAI-style API errors: an HTTP status plus the JSON body every OpenAI
// client understands:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace moeserve::server::api {

struct ApiError {
  int status = 400;
  std::string type =
      "invalid_request_error";  // invalid_request_error, authentication_error, server_error, ...
  std::string message;
  std::string param;  // empty: null in the JSON
  std::string code;   // empty: null in the JSON

  nlohmann::json to_json() const;
};

ApiError invalid_request(std::string message, std::string param = {}, std::string code = {});
ApiError not_found(std::string message, std::string code = {});
ApiError unauthorized(std::string message);
ApiError too_many_requests(std::string message);
ApiError unavailable(std::string message);
ApiError server_error(std::string message);

}  // namespace moeserve::server::api
