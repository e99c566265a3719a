// A single-line progress bar on stderr for long operations (convert,
// quantize, make-model):
//   quantize  [#########-----------]  45%  123/291 tensors  512.0/1140.2 MiB  85.3 MiB/s
// Redrawn with '\r' at most every ~100 ms. Silent when stderr is not a TTY
// (logs and tests stay clean) unless forced. Thread-safe: workers may call
// add() concurrently; one of them redraws, the others never wait.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace moeserve {

struct ProgressOptions {
  std::string label;          // "convert"
  uint64_t total_units = 0;   // the bar's 100% (e.g. bytes)
  uint64_t total_items = 0;   // shown as "done/total items" when > 0
  std::string item_name = "items";
  bool units_are_bytes = true;  // show units as MiB and the rate as MiB/s
  enum class Mode { kAuto, kForceOn, kOff } mode = Mode::kAuto;
};

class Progress {
 public:
  explicit Progress(ProgressOptions options);
  ~Progress();  // finish() if not done yet
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add_units(uint64_t units);
  void add_items(uint64_t items);
  // Draw the final 100% state (or where it stopped) and end the line.
  void finish();
  bool enabled() const { return enabled_; }
  // The line as it would be drawn now (tests).
  std::string render() const;

 private:
  void maybe_draw(bool force);
  ProgressOptions options_;
  bool enabled_ = false;
  bool finished_ = false;
  std::atomic<uint64_t> units_{0};
  std::atomic<uint64_t> items_{0};
  std::chrono::steady_clock::time_point start_;
  std::atomic<int64_t> last_draw_ns_{0};
  std::mutex draw_mutex_;
};

}  // namespace moeserve
