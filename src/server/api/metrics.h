// The server's metrics, exported at /metrics in the Prometheus text
// exposition format (version 0.0.4). Thread-safe: the HTTP threads and the
// batching engine update it concurrently; one mutex guards everything, as
// updates are a handful per request/step and never on a per-token hot path.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace moeserve::server::api {

// Monotonic totals (exported with the _total suffix).
enum class Counter {
  kPromptTokens,             // moeserve_prompt_tokens_total
  kGeneratedTokens,          // moeserve_generated_tokens_total
  kPrefixCacheHits,          // moeserve_prefix_cache_hits_total
  kPrefixCacheMisses,        // moeserve_prefix_cache_misses_total
  kPrefixCacheReusedTokens,  // moeserve_prefix_cache_reused_tokens_total
  kPrefixCacheDiskHits,      // moeserve_prefix_cache_disk_hits_total (also counted as hits)
  kKvPreemptions,            // moeserve_kv_preemptions_total (paged KV: sequences swapped out)
  kKvHostRestoredBlocks,     // moeserve_kv_host_restored_blocks_total (--kv-host-mem)
  kKvDiskRestoredBlocks,     // moeserve_kv_disk_restored_blocks_total (paged KV, --kv-cache-dir)
  kCount_,
};

// Current values.
enum class Gauge {
  kQueueDepth,              // moeserve_queue_depth
  kActiveSlots,             // moeserve_active_slots
  kSlotsTotal,              // moeserve_slots_total
  kKvCacheUsedTokens,       // moeserve_kv_cache_used_tokens
  kKvCacheCapacityTokens,   // moeserve_kv_cache_capacity_tokens
  kPrefixCacheBytes,        // moeserve_prefix_cache_bytes
  kPrefixCacheEntries,      // moeserve_prefix_cache_entries
  kPrefixCacheDiskBytes,    // moeserve_prefix_cache_disk_bytes (--kv-cache-dir)
  kPrefixCacheDiskEntries,  // moeserve_prefix_cache_disk_entries
  kKvBlocksTotal,           // moeserve_kv_blocks_total (paged KV, --kv-mem)
  kKvBlocksFree,            // moeserve_kv_blocks_free
  kKvSwappedSequences,      // moeserve_kv_swapped_sequences
  kKvHostBlocks,            // moeserve_kv_host_blocks (--kv-host-mem)
  kKvHostBytes,             // moeserve_kv_host_bytes
  kKvDiskBlocks,            // moeserve_kv_disk_blocks (paged KV, --kv-cache-dir)
  kKvDiskBytes,             // moeserve_kv_disk_bytes
  kCount_,
};

class Metrics {
 public:
  // moeserve_requests_total{endpoint, status}
  void record_request(std::string_view endpoint, int status);
  // moeserve_errors_total{kind}: failures worth alerting on (e.g. "engine", "timeout").
  void record_error(std::string_view kind);
  void add(Counter counter, int64_t amount = 1);
  void set(Gauge gauge, double value);
  // One prefix cache lookup: a hit with the tokens it saved, or a miss.
  void record_prefix_lookup(bool hit, int64_t reused_tokens);
  // Time spent on prefill / decode and the tokens it produced; exported as
  // totals and as the rate total_tokens / total_seconds.
  void record_prefill(int64_t tokens, double seconds);
  void record_decode(int64_t tokens, double seconds);

  int64_t counter(Counter counter) const;
  double gauge(Gauge gauge) const;
  int64_t requests(std::string_view endpoint, int status) const;
  int64_t errors(std::string_view kind) const;
  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;

  std::string render_prometheus() const;

 private:
  struct Throughput {
    int64_t tokens = 0;
    double seconds = 0;
    double rate() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0; }
  };

  mutable std::mutex mutex_;
  int64_t counters_[static_cast<size_t>(Counter::kCount_)] = {};
  double gauges_[static_cast<size_t>(Gauge::kCount_)] = {};
  std::map<std::pair<std::string, int>, int64_t, std::less<>> requests_;
  std::map<std::string, int64_t, std::less<>> errors_;
  Throughput prefill_;
  Throughput decode_;
};

// Prometheus label value escaping: backslash, double quote, newline.
std::string escape_label_value(std::string_view value);
// A sample value: integers without a fraction, +Inf/-Inf/NaN spelled out.
std::string format_metric_value(double value);

}  // namespace moeserve::server::api
