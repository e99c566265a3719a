// Metrics: the Prometheus text is checked with a small parser of the
// exposition format (HELP/TYPE lines, samples with escaped labels).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/api/metrics.h"

namespace moeserve::server::api {
namespace {

struct Family {
  std::string help;
  std::string type;
};

struct Exposition {
  std::map<std::string, Family> families;
  // "name{label=\"value\",...}" (labels unescaped, in order) -> value
  std::map<std::string, double> samples;
  std::vector<std::string> errors;
};

// Parses a label set starting after '{'; returns the unescaped text and advances `i` past '}'.
std::string parse_labels(const std::string& line, size_t& i, std::vector<std::string>& errors) {
  std::string out = "{";
  while (i < line.size() && line[i] != '}') {
    size_t eq = line.find('=', i);
    if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
      errors.push_back("bad label: " + line);
      return out;
    }
    out += line.substr(i, eq - i) + "=\"";
    i = eq + 2;
    for (; i < line.size() && line[i] != '"'; ++i) {
      if (line[i] == '\\' && i + 1 < line.size()) {
        char e = line[++i];
        if (e == 'n') {
          out += '\n';
        } else if (e == '\\' || e == '"') {
          out += e;
        } else {
          errors.push_back("bad escape: " + line);
        }
      } else {
        out += line[i];
      }
    }
    out += '"';
    ++i;  // closing quote
    if (i < line.size() && line[i] == ',') {
      out += ',';
      ++i;
    }
  }
  ++i;
  return out + "}";
}

Exposition parse_exposition(const std::string& text) {
  Exposition x;
  if (!text.empty() && text.back() != '\n') x.errors.push_back("no final newline");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
      std::string rest = line.substr(7);
      size_t sp = rest.find(' ');
      std::string name = rest.substr(0, sp);
      (line[2] == 'H' ? x.families[name].help : x.families[name].type) = rest.substr(sp + 1);
      continue;
    }
    size_t i = 0;
    while (i < line.size() && (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_')) ++i;
    std::string key = line.substr(0, i);
    if (key.empty()) {
      x.errors.push_back("bad line: " + line);
      continue;
    }
    if (i < line.size() && line[i] == '{') {
      ++i;
      key += parse_labels(line, i, x.errors);
    }
    if (i >= line.size() || line[i] != ' ') {
      x.errors.push_back("no value: " + line);
      continue;
    }
    x.samples[key] = std::stod(line.substr(i + 1));
  }
  return x;
}

TEST(ApiMetrics, FreshRegistryExportsEveryFamily) {
  Metrics m;
  Exposition x = parse_exposition(m.render_prometheus());
  EXPECT_TRUE(x.errors.empty()) << x.errors.front();
  for (const char* counter :
       {"requests_total", "errors_total", "prompt_tokens_total", "generated_tokens_total",
        "prefix_cache_hits_total", "prefix_cache_misses_total", "prefix_cache_reused_tokens_total",
        "prefix_cache_disk_hits_total", "prefill_tokens_total", "prefill_seconds_total",
        "decode_tokens_total", "decode_seconds_total"}) {
    std::string name = std::string("moeserve_") + counter;
    EXPECT_EQ(x.families[name].type, "counter") << name;
    EXPECT_FALSE(x.families[name].help.empty()) << name;
  }
  for (const char* gauge :
       {"queue_depth", "active_slots", "slots_total", "kv_cache_used_tokens", "kv_cache_capacity_tokens",
        "prefix_cache_bytes", "prefix_cache_entries", "prefix_cache_disk_bytes", "prefix_cache_disk_entries",
        "prefill_tokens_per_second", "decode_tokens_per_second"}) {
    std::string name = std::string("moeserve_") + gauge;
    EXPECT_EQ(x.families[name].type, "gauge") << name;
    EXPECT_EQ(x.samples.at(name), 0.0) << name;
  }
  EXPECT_EQ(x.samples.count("moeserve_requests_total"), 0u);  // no label set seen yet
}

TEST(ApiMetrics, CountersGaugesAndThroughput) {
  Metrics m;
  m.record_request("/v1/chat/completions", 200);
  m.record_request("/v1/chat/completions", 200);
  m.record_request("/v1/chat/completions", 400);
  m.record_request("/v1/models", 200);
  m.record_error("engine");
  m.add(Counter::kPromptTokens, 120);
  m.add(Counter::kGeneratedTokens, 30);
  m.add(Counter::kGeneratedTokens);
  m.record_prefix_lookup(true, 64);
  m.record_prefix_lookup(true, 16);
  m.record_prefix_lookup(false, 99);
  m.set(Gauge::kQueueDepth, 3);
  m.set(Gauge::kKvCacheCapacityTokens, 32768);
  m.set(Gauge::kPrefixCacheBytes, 1.5e9);
  m.record_prefill(1000, 0.5);
  m.record_prefill(1000, 1.5);
  m.record_decode(50, 2.0);

  EXPECT_EQ(m.requests("/v1/chat/completions", 200), 2);
  EXPECT_EQ(m.requests("/v1/chat/completions", 500), 0);
  EXPECT_EQ(m.errors("engine"), 1);
  EXPECT_EQ(m.counter(Counter::kGeneratedTokens), 31);
  EXPECT_EQ(m.counter(Counter::kPrefixCacheHits), 2);
  EXPECT_EQ(m.counter(Counter::kPrefixCacheMisses), 1);
  EXPECT_EQ(m.counter(Counter::kPrefixCacheReusedTokens), 80);
  EXPECT_EQ(m.gauge(Gauge::kQueueDepth), 3);
  EXPECT_DOUBLE_EQ(m.prefill_tokens_per_second(), 1000.0);
  EXPECT_DOUBLE_EQ(m.decode_tokens_per_second(), 25.0);

  Exposition x = parse_exposition(m.render_prometheus());
  ASSERT_TRUE(x.errors.empty()) << x.errors.front();
  EXPECT_EQ(x.samples.at(R"(moeserve_requests_total{endpoint="/v1/chat/completions",status="200"})"), 2);
  EXPECT_EQ(x.samples.at(R"(moeserve_requests_total{endpoint="/v1/chat/completions",status="400"})"), 1);
  EXPECT_EQ(x.samples.at(R"(moeserve_requests_total{endpoint="/v1/models",status="200"})"), 1);
  EXPECT_EQ(x.samples.at(R"(moeserve_errors_total{kind="engine"})"), 1);
  EXPECT_EQ(x.samples.at("moeserve_prompt_tokens_total"), 120);
  EXPECT_EQ(x.samples.at("moeserve_generated_tokens_total"), 31);
  EXPECT_EQ(x.samples.at("moeserve_prefix_cache_reused_tokens_total"), 80);
  EXPECT_EQ(x.samples.at("moeserve_queue_depth"), 3);
  EXPECT_EQ(x.samples.at("moeserve_kv_cache_capacity_tokens"), 32768);
  EXPECT_EQ(x.samples.at("moeserve_prefix_cache_bytes"), 1.5e9);
  EXPECT_EQ(x.samples.at("moeserve_prefill_tokens_total"), 2000);
  EXPECT_EQ(x.samples.at("moeserve_prefill_seconds_total"), 2.0);
  EXPECT_EQ(x.samples.at("moeserve_prefill_tokens_per_second"), 1000);
  EXPECT_EQ(x.samples.at("moeserve_decode_tokens_per_second"), 25);
}

TEST(ApiMetrics, LabelValuesAreEscaped) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Metrics m;
  m.record_request("/weird\"path\\with\nnewline", 404);
  std::string text = m.render_prometheus();
  EXPECT_NE(text.find(R"(endpoint="/weird\"path\\with\nnewline")"), std::string::npos) << text;
  Exposition x = parse_exposition(text);
  ASSERT_TRUE(x.errors.empty()) << x.errors.front();
  EXPECT_EQ(x.samples.at("moeserve_requests_total{endpoint=\"/weird\"path\\with\nnewline\",status=\"404\"}"),
            1);
}

TEST(ApiMetrics, ValueFormatting) {
  EXPECT_EQ(format_metric_value(0), "0");
  EXPECT_EQ(format_metric_value(42), "42");
  EXPECT_EQ(format_metric_value(0.25), "0.25");
  EXPECT_EQ(format_metric_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_metric_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_metric_value(std::nan("")), "NaN");
}

TEST(ApiMetrics, ConcurrentUpdatesAreNotLost) {
  Metrics m;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&m] {
      for (int i = 0; i < 1000; ++i) {
        m.record_request("/v1/completions", 200);
        m.add(Counter::kGeneratedTokens, 2);
        m.record_decode(1, 0.001);
        if (i % 100 == 0) (void)m.render_prometheus();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(m.requests("/v1/completions", 200), 4000);
  EXPECT_EQ(m.counter(Counter::kGeneratedTokens), 8000);
  EXPECT_NEAR(m.decode_tokens_per_second(), 1000.0, 1e-6);
}

}  // namespace
}  // namespace moeserve::server::api
