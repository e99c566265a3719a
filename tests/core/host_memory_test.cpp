#include "core/host_memory.h"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

TEST(HostMemory, ParsesKilobyteFields) {
  const char* meminfo = "MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:    8192000 kB\n";
  EXPECT_EQ(parse_kb_field(meminfo, "MemAvailable"), uint64_t(8192000) * 1024);
  EXPECT_EQ(parse_kb_field(meminfo, "MemTotal"), uint64_t(16384000) * 1024);
  EXPECT_FALSE(parse_kb_field(meminfo, "SwapTotal").has_value());
  // A field name inside another's line is not the field.
  EXPECT_FALSE(parse_kb_field("XMemAvailable: 5 kB\n", "MemAvailable").has_value());
  EXPECT_FALSE(parse_kb_field("MemAvailable: lots\n", "MemAvailable").has_value());
  EXPECT_FALSE(parse_kb_field("MemAvailable: 99999999999999999999 kB\n", "MemAvailable").has_value());
}

TEST(HostMemory, ParsesCgroupLimits) {
  EXPECT_EQ(parse_cgroup_bytes("1073741824\n"), uint64_t(1) << 30);
  EXPECT_FALSE(parse_cgroup_bytes("max\n").has_value());
  EXPECT_FALSE(parse_cgroup_bytes("9223372036854771712\n").has_value()) << "cgroup v1's 'no limit'";
  EXPECT_FALSE(parse_cgroup_bytes("").has_value());
}

TEST(HostMemory, ReportsSomethingOnThisMachine) {
  const HostMemory m = host_memory_available();
  EXPECT_GT(m.available_bytes, uint64_t(0));
}

}  // namespace
}  // namespace moeserve
