#include "core/memory_bandwidth.h"

#include <gtest/gtest.h>

namespace moeserve {
namespace {

TEST(MemoryBandwidth, MeasuresAPositiveRateAloneAndWithAPool) {
  ReadBandwidthOptions o;
  o.bytes = size_t(8) << 20;
  o.passes = 2;
  auto alone = measure_read_bandwidth(o);
  ASSERT_TRUE(alone.is_ok()) << alone.status().message();
  EXPECT_GT(*alone, 0.0);
  ThreadPool pool(2);
  o.pool = &pool;
  auto pooled = measure_read_bandwidth(o);
  ASSERT_TRUE(pooled.is_ok()) << pooled.status().message();
  EXPECT_GT(*pooled, 0.0);
}

TEST(MemoryBandwidth, RejectsAnEmptyMeasurement) {
  ReadBandwidthOptions o;
  o.bytes = 100;
  EXPECT_FALSE(measure_read_bandwidth(o).is_ok());
  o.bytes = size_t(1) << 20;
  o.passes = 0;
  EXPECT_FALSE(measure_read_bandwidth(o).is_ok());
}

}  // namespace
}  // namespace moeserve
