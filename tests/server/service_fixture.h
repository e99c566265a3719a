// The ApiService tests' fixture: the trained tiny model behind a
// BatchEngine and an ApiService, requests in, replies out (no sockets).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api_service.h"
#include "test_device.h"

namespace moeserve::server::service_test {

using nlohmann::json;

inline const std::string kModel = std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen3moe-tiny.bf16.gguf";

struct Fixture {
  std::unique_ptr<runtime::Model> model;
  std::unique_ptr<runtime::BatchEngine> engine;
  std::unique_ptr<ApiService> service;

  explicit Fixture(runtime::EngineOptions eo = {}, std::string api_key = {},
                   std::function<bool(const std::string&)> inject_allocation_failure = {},
                   std::vector<std::vector<int32_t>> gpu_experts = {}, bool split_experts = false) {
    runtime::ModelLoadOptions lo{.n_threads = 1, .device = moeserve::testing::test_device()};
    lo.gpu_experts = std::move(gpu_experts);
    lo.split_experts = split_experts;
    model = std::move(runtime::Model::load(kModel, lo).value());
    if (eo.n_ctx == 4096) eo.n_ctx = 256;
    engine = std::make_unique<runtime::BatchEngine>(*model, eo);
    ServiceConfig c;
    c.model_id = "tiny";
    c.api_key = std::move(api_key);
    c.web_page = "<html>chat</html>";
    c.inject_allocation_failure = std::move(inject_allocation_failure);
    service = std::make_unique<ApiService>(*model, *engine, c);
  }
  ~Fixture() {
    engine.reset();  // before the service: finishing requests touch sessions only
  }
  ApiReply post(const std::string& path, const std::string& body, const std::string& auth = {}) {
    return service->handle({"POST", path, body, auth, {}, {}});
  }
  ApiReply get(const std::string& path, const std::string& auth = {}) {
    return service->handle({"GET", path, "", auth, {}, {}});
  }
};

inline std::string drain(const ApiReply& r) {
  std::string all;
  while (r.stream->next(all, std::chrono::milliseconds(100))) {
  }
  return all;
}

// The data: payloads of an SSE body, [DONE] excluded (asserted last).
inline std::vector<json> sse_events(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  bool done = false;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string payload = body.substr(pos + 6, end - pos - 6);
    EXPECT_FALSE(done) << "data after [DONE]";
    if (payload == "[DONE]") {
      done = true;
    } else {
      out.push_back(json::parse(payload));
    }
    pos = end;
  }
  EXPECT_TRUE(done) << "stream did not end with [DONE]";
  return out;
}

inline const char* const kChat =
    R"({"model":"tiny","messages":[{"role":"system","content":"You write Python."},
  {"role":"user","content":"Write a function"}],"max_tokens":24,"temperature":0})";

}  // namespace moeserve::server::service_test
