// A scratch folder for one test process, removed when the process exits, so
// the model files tests write do not pile up in /tmp run after run (they
// once filled CI's disk).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace moeserve::testing {

class ProcessTempDir {
 public:
  explicit ProcessTempDir(const std::string& prefix)
      : path_(std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(getpid()))) {
    std::filesystem::create_directories(path_);
  }
  ~ProcessTempDir() {
    std::error_code ec;  // best effort: never throw from a destructor
    std::filesystem::remove_all(path_, ec);
  }
  ProcessTempDir(const ProcessTempDir&) = delete;
  ProcessTempDir& operator=(const ProcessTempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The folder for `prefix` in this process: made on first use, removed at exit.
inline const std::filesystem::path& process_temp_dir(const std::string& prefix) {
  static ProcessTempDir dir(prefix);
  return dir.path();
}

}  // namespace moeserve::testing
