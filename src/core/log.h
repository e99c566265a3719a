// Minimal leveled logging to stderr. MOESERVE_LOG=debug|info|warn|error.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace moeserve {

enum class LogLevel { kDebug = 0, kInfo, kWarn, kError };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log_at(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < log_level()) return;
  log_write(level, fmt::format(f, std::forward<Args>(args)...));
}

#define MOESERVE_LOG_DEBUG(...) ::moeserve::log_at(::moeserve::LogLevel::kDebug, __VA_ARGS__)
#define MOESERVE_LOG_INFO(...) ::moeserve::log_at(::moeserve::LogLevel::kInfo, __VA_ARGS__)
#define MOESERVE_LOG_WARN(...) ::moeserve::log_at(::moeserve::LogLevel::kWarn, __VA_ARGS__)
#define MOESERVE_LOG_ERROR(...) ::moeserve::log_at(::moeserve::LogLevel::kError, __VA_ARGS__)

}  // namespace moeserve
