#include "core/host_memory.h"

#include <sys/resource.h>

#include <charconv>
#include <fstream>
#include <limits>
#include <sstream>

namespace moeserve {
namespace {

std::optional<std::string> read_file(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<uint64_t> parse_u64(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end == s.data()) return std::nullopt;
  return v;
}

uint64_t minus(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

}  // namespace

std::optional<uint64_t> parse_kb_field(std::string_view text, std::string_view field) {
  for (size_t at = text.find(field); at != std::string_view::npos; at = text.find(field, at + 1)) {
    if (at != 0 && text[at - 1] != '\n') continue;
    std::string_view rest = text.substr(at + field.size());
    if (rest.empty() || rest.front() != ':') continue;
    const auto kb = parse_u64(rest.substr(1));
    if (!kb || *kb > std::numeric_limits<uint64_t>::max() / 1024) return std::nullopt;
    return *kb * 1024;
  }
  return std::nullopt;
}

std::optional<uint64_t> parse_cgroup_bytes(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text == "max") return std::nullopt;
  const auto v = parse_u64(text);
  // cgroup v1 reports "no limit" as a huge page-rounded number.
  if (!v || *v >= (uint64_t(1) << 62)) return std::nullopt;
  return v;
}

HostMemory host_memory_available() {
  HostMemory m;
  m.available_bytes = std::numeric_limits<uint64_t>::max();
  auto bound = [&m](uint64_t bytes, const char* by) {
    if (bytes < m.available_bytes) m.available_bytes = bytes, m.bound_by = by;
  };
  if (auto info = read_file("/proc/meminfo")) {
    if (auto avail = parse_kb_field(*info, "MemAvailable")) bound(*avail, "MemAvailable");
  }
  // cgroup v2, then v1.
  std::optional<uint64_t> limit, usage;
  if (auto max = read_file("/sys/fs/cgroup/memory.max")) {
    limit = parse_cgroup_bytes(*max);
    if (auto cur = read_file("/sys/fs/cgroup/memory.current")) usage = parse_cgroup_bytes(*cur);
  } else if (auto max1 = read_file("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
    limit = parse_cgroup_bytes(*max1);
    if (auto cur = read_file("/sys/fs/cgroup/memory/memory.usage_in_bytes")) usage = parse_cgroup_bytes(*cur);
  }
  if (limit) bound(minus(*limit, usage.value_or(0)), "the cgroup limit");
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    uint64_t used = 0;
    if (auto status = read_file("/proc/self/status")) used = parse_kb_field(*status, "VmSize").value_or(0);
    bound(minus(uint64_t(as.rlim_cur), used), "the address-space limit (ulimit -v)");
  }
  return m;
}

}  // namespace moeserve
