#include "server/api/metrics.h"

#include <charconv>
#include <cmath>

namespace moeserve::server::api {

namespace {

struct MetricInfo {
  const char* name;  // without the moeserve_ prefix
  const char* help;
};

constexpr MetricInfo kCounters[] = {
    {"prompt_tokens_total", "Prompt tokens processed."},
    {"generated_tokens_total", "Tokens generated."},
    {"prefix_cache_hits_total", "Prefix cache lookups that reused cached KV."},
    {"prefix_cache_misses_total", "Prefix cache lookups that found nothing."},
    {"prefix_cache_reused_tokens_total", "Prompt tokens served from the prefix cache."},
    {"prefix_cache_disk_hits_total", "Prefix cache hits served by an entry loaded from the disk tier."},
    {"kv_preemptions_total",
     "Sequences paused because the paged KV pool ran short (rows swapped to host memory)."},
    {"kv_host_restored_blocks_total",
     "Shared prefix blocks copied back from the host tier instead of computed."},
    {"kv_disk_restored_blocks_total",
     "Shared prefix blocks read back from the disk tier (--kv-cache-dir) instead of computed."},
};
static_assert(std::size(kCounters) == static_cast<size_t>(Counter::kCount_));

constexpr MetricInfo kGauges[] = {
    {"queue_depth", "Requests waiting for a slot."},
    {"active_slots", "Slots generating now."},
    {"slots_total", "Slots (concurrent sequences) configured."},
    {"kv_cache_used_tokens", "KV cache cells in use."},
    {"kv_cache_capacity_tokens", "KV cache capacity in tokens."},
    {"prefix_cache_bytes", "Memory held by the prefix cache."},
    {"prefix_cache_entries", "Entries in the prefix cache."},
    {"prefix_cache_disk_bytes", "Bytes of the prefix cache's disk tier files."},
    {"prefix_cache_disk_entries", "Entries in the prefix cache's disk tier."},
    {"kv_blocks_total", "Blocks of the paged KV pool (0: no pool)."},
    {"kv_blocks_free", "Free blocks of the paged KV pool."},
    {"kv_swapped_sequences", "Sequences paused for KV blocks, waiting to resume."},
    {"kv_host_blocks", "Shared prefix blocks kept in the host tier (--kv-host-mem)."},
    {"kv_host_bytes", "Bytes of the host tier's blocks."},
    {"kv_disk_blocks", "Shared prefix blocks kept on disk (paged KV with --kv-cache-dir)."},
    {"kv_disk_bytes", "Bytes of the disk tier's block files."},
};
static_assert(std::size(kGauges) == static_cast<size_t>(Gauge::kCount_));

// Appends the # HELP / # TYPE header of one metric family.
void header(std::string& out, std::string_view name, std::string_view help, std::string_view type) {
  out += "# HELP moeserve_";
  out += name;
  out += ' ';
  out += help;  // our own constant text: nothing to escape
  out += "\n# TYPE moeserve_";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, std::string_view name, std::string_view labels, double value) {
  out += "moeserve_";
  out += name;
  out += labels;
  out += ' ';
  out += format_metric_value(value);
  out += '\n';
}

}  // namespace

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string format_metric_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), value);  // shortest round-trip form
  return std::string(buf, result.ptr);
}

void Metrics::record_request(std::string_view endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{std::string(endpoint), status}];
}

void Metrics::record_error(std::string_view kind) {
  std::lock_guard lock(mutex_);
  auto it = errors_.find(kind);
  if (it == errors_.end()) it = errors_.emplace(std::string(kind), 0).first;
  ++it->second;
}

void Metrics::add(Counter counter, int64_t amount) {
  std::lock_guard lock(mutex_);
  counters_[static_cast<size_t>(counter)] += amount;
}

void Metrics::set(Gauge gauge, double value) {
  std::lock_guard lock(mutex_);
  gauges_[static_cast<size_t>(gauge)] = value;
}

void Metrics::record_prefix_lookup(bool hit, int64_t reused_tokens) {
  std::lock_guard lock(mutex_);
  ++counters_[static_cast<size_t>(hit ? Counter::kPrefixCacheHits : Counter::kPrefixCacheMisses)];
  if (hit) counters_[static_cast<size_t>(Counter::kPrefixCacheReusedTokens)] += reused_tokens;
}

void Metrics::record_prefill(int64_t tokens, double seconds) {
  std::lock_guard lock(mutex_);
  prefill_.tokens += tokens;
  prefill_.seconds += seconds;
}

void Metrics::record_decode(int64_t tokens, double seconds) {
  std::lock_guard lock(mutex_);
  decode_.tokens += tokens;
  decode_.seconds += seconds;
}

int64_t Metrics::counter(Counter counter) const {
  std::lock_guard lock(mutex_);
  return counters_[static_cast<size_t>(counter)];
}

double Metrics::gauge(Gauge gauge) const {
  std::lock_guard lock(mutex_);
  return gauges_[static_cast<size_t>(gauge)];
}

int64_t Metrics::requests(std::string_view endpoint, int status) const {
  std::lock_guard lock(mutex_);
  auto it = requests_.find(std::pair<std::string, int>(endpoint, status));
  return it == requests_.end() ? 0 : it->second;
}

int64_t Metrics::errors(std::string_view kind) const {
  std::lock_guard lock(mutex_);
  auto it = errors_.find(kind);
  return it == errors_.end() ? 0 : it->second;
}

double Metrics::prefill_tokens_per_second() const {
  std::lock_guard lock(mutex_);
  return prefill_.rate();
}

double Metrics::decode_tokens_per_second() const {
  std::lock_guard lock(mutex_);
  return decode_.rate();
}

std::string Metrics::render_prometheus() const {
  std::lock_guard lock(mutex_);
  std::string out;
  header(out, "requests_total", "HTTP requests by endpoint and status code.", "counter");
  for (const auto& [key, count] : requests_) {
    std::string labels =
        "{endpoint=\"" + escape_label_value(key.first) + "\",status=\"" + std::to_string(key.second) + "\"}";
    sample(out, "requests_total", labels, static_cast<double>(count));
  }
  header(out, "errors_total", "Errors by kind.", "counter");
  for (const auto& [kind, count] : errors_) {
    sample(out, "errors_total", "{kind=\"" + escape_label_value(kind) + "\"}", static_cast<double>(count));
  }
  for (size_t i = 0; i < std::size(kCounters); ++i) {
    header(out, kCounters[i].name, kCounters[i].help, "counter");
    sample(out, kCounters[i].name, "", static_cast<double>(counters_[i]));
  }
  for (size_t i = 0; i < std::size(kGauges); ++i) {
    header(out, kGauges[i].name, kGauges[i].help, "gauge");
    sample(out, kGauges[i].name, "", gauges_[i]);
  }
  const std::pair<const char*, const Throughput*> phases[] = {{"prefill", &prefill_}, {"decode", &decode_}};
  for (const auto& [phase, t] : phases) {
    std::string p = phase;
    header(out, p + "_tokens_total", "Tokens processed in the " + p + " phase.", "counter");
    sample(out, p + "_tokens_total", "", static_cast<double>(t->tokens));
    header(out, p + "_seconds_total", "Seconds spent in the " + p + " phase.", "counter");
    sample(out, p + "_seconds_total", "", t->seconds);
    header(out, p + "_tokens_per_second", "Average " + p + " throughput (tokens_total / seconds_total).",
           "gauge");
    sample(out, p + "_tokens_per_second", "", t->rate());
  }
  return out;
}

}  // namespace moeserve::server::api
