#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace moeserve {

namespace {
constexpr int64_t kRedrawIntervalNs = 100'000'000;
constexpr int kBarWidth = 24;
}  // namespace

Progress::Progress(ProgressOptions options) : options_(std::move(options)), start_(std::chrono::steady_clock::now()) {
  using Mode = ProgressOptions::Mode;
  enabled_ = options_.mode == Mode::kForceOn || (options_.mode == Mode::kAuto && isatty(STDERR_FILENO) == 1);
}

Progress::~Progress() { finish(); }

void Progress::add_units(uint64_t units) {
  units_.fetch_add(units, std::memory_order_relaxed);
  maybe_draw(false);
}

void Progress::add_items(uint64_t items) {
  items_.fetch_add(items, std::memory_order_relaxed);
  maybe_draw(false);
}

std::string Progress::render() const {
  const uint64_t units = units_.load(std::memory_order_relaxed);
  const uint64_t items = items_.load(std::memory_order_relaxed);
  const double fraction =
      options_.total_units > 0 ? std::min(1.0, double(units) / double(options_.total_units)) : (finished_ ? 1.0 : 0.0);
  const int filled = int(fraction * kBarWidth + 0.5);
  std::string line = fmt::format("{} [{}{}] {:3d}%", options_.label, std::string(size_t(filled), '#'),
                                 std::string(size_t(kBarWidth - filled), '-'), int(fraction * 100.0));
  if (options_.total_items > 0) line += fmt::format("  {}/{} {}", items, options_.total_items, options_.item_name);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (options_.units_are_bytes) {
    constexpr double kMiB = 1024.0 * 1024.0;
    line += fmt::format("  {:.1f}/{:.1f} MiB", double(units) / kMiB, double(options_.total_units) / kMiB);
    if (seconds > 0) line += fmt::format("  {:.1f} MiB/s", double(units) / kMiB / seconds);
  } else {
    line += fmt::format("  {}/{}", units, options_.total_units);
    if (seconds > 0) line += fmt::format("  {:.1f}/s", double(units) / seconds);
  }
  return line;
}

void Progress::maybe_draw(bool force) {
  if (!enabled_) return;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start_).count();
  if (!force && now - last_draw_ns_.load(std::memory_order_relaxed) < kRedrawIntervalNs) return;
  std::unique_lock<std::mutex> lock(draw_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) {
    if (!force) return;
    lock.lock();
  }
  last_draw_ns_.store(now, std::memory_order_relaxed);
  // \x1b[K clears what a longer previous line left behind.
  std::fprintf(stderr, "\r%s\x1b[K", render().c_str());
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  maybe_draw(true);
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace moeserve
