// How fast this machine streams memory right now.
//
// Decode on a CPU is bound by how fast the weights stream from DRAM, and on a
// shared (virtual) machine that speed changes with what the neighbours do —
// we have seen it range over 17-28 GB/s on one 2-vCPU VM within minutes, with
// no CPU steal at all. `moeserve bench` measures it next to its runs so that
// a decode speed can be read as a fraction of the bound of that moment.
#pragma once

#include <cstddef>

#include "core/status.h"
#include "core/thread_pool.h"

namespace moeserve {

struct ReadBandwidthOptions {
  size_t bytes = size_t(256) << 20;  // larger than the caches, as the weights are
  int passes = 3;                    // the best pass counts
  ThreadPool* pool = nullptr;        // null: the calling thread alone
};

// The best read bandwidth of `passes` passes over a fresh buffer, in GB/s
// (1e9 bytes per second), every thread of the pool reading its own part.
Result<double> measure_read_bandwidth(const ReadBandwidthOptions& options);

}  // namespace moeserve
