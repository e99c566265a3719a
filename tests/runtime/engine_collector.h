// The batch engine tests' request side: a greedy request, and a Collector
// that gathers one request's stream (tokens, text, events) and waits for
// its end.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/batch_engine.h"

namespace moeserve::testing {

using runtime::EngineRequest;
using runtime::RequestStats;
using runtime::TokenEvent;

inline EngineRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  return r;
}

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<TokenEvent> events;
  bool done = false;
  Status status;
  RequestStats stats;
  int cancel_after = -1;           // on_token returns false after this many tokens
  std::function<void()> on_token;  // runs first, on the engine thread, for each token

  void attach(EngineRequest& r) {
    r.on_token = [this](const TokenEvent& ev) {
      if (on_token) on_token();
      std::lock_guard lock(mu);
      text += ev.text;
      tokens.push_back(ev.token);
      events.push_back(ev);
      return cancel_after < 0 || int(tokens.size()) < cancel_after;
    };
    r.on_finish = [this](const Status& st, const RequestStats& s) {
      std::lock_guard lock(mu);
      status = st;
      stats = s;
      text += s.tail_text;
      done = true;
      cv.notify_all();
    };
  }
  // A greedy request collected here.
  EngineRequest request(std::vector<int32_t> prompt, int64_t max_tokens) {
    EngineRequest r = greedy_request(std::move(prompt), max_tokens);
    attach(r);
    return r;
  }
  void wait() {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done; }))
        << "request never finished";
  }
};

}  // namespace moeserve::testing
