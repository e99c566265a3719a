// How much memory this process may still use: the least of what the machine
// has available (MemAvailable), what its cgroup allows (memory.max minus
// memory.current; cgroup v1's limit_in_bytes minus usage_in_bytes) and what
// its address-space limit leaves (RLIMIT_AS minus VmSize). The server plans
// its KV caches against it before it starts serving.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve {

struct HostMemory {
  uint64_t available_bytes = 0;
  std::string bound_by;  // "MemAvailable", "the cgroup limit", "the address-space limit (ulimit -v)"
};

// Unknown parts are ignored; with none known, available_bytes is UINT64_MAX.
HostMemory host_memory_available();

// Parsers of the kernel's text files (exposed for tests).
// "MemAvailable:   123 kB" in /proc/meminfo; "VmSize:" in /proc/self/status.
std::optional<uint64_t> parse_kb_field(std::string_view text, std::string_view field);
// A cgroup file holding a number of bytes or "max" (nullopt: no limit or unreadable).
std::optional<uint64_t> parse_cgroup_bytes(std::string_view text);

}  // namespace moeserve
