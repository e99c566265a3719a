#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace moeserve {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("MOESERVE_LOG");
  if (env == nullptr) return LogLevel::kInfo;
  const std::string v(env);
  if (v == "debug") return LogLevel::kDebug;
  if (v == "warn") return LogLevel::kWarn;
  if (v == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{int(level_from_env())};
  return level;
}

}  // namespace

LogLevel log_level() { return LogLevel(level_storage().load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { level_storage().store(int(level)); }

void log_write(LogLevel level, std::string_view message) {
  static std::mutex mu;
  static const char* const kNames[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[%s] %.*s\n", kNames[int(level)], int(message.size()), message.data());
}

}  // namespace moeserve
