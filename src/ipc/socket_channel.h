// A Channel (worker_session.h) over a connected socket: reads wait as long
// as it takes (a parent may be idle), writes give up after kWriteTimeout (a
// parent that stops reading its answers is dropped). Shared by the expert
// worker and the layer shard.
#pragma once

#include "ipc/shm_ring.h"
#include "ipc/socket.h"
#include "ipc/worker_session.h"

namespace moeserve::ipc {

// A parent that stops reading its answers for this long is dropped.
inline constexpr std::chrono::seconds kWriteTimeout{120};

class SocketChannel final : public Channel {
 public:
  explicit SocketChannel(Socket& s) : s_(s) {}
  Status read_exact(std::span<uint8_t> out) override { return s_.read_exact(out, kNoDeadline); }
  Status write_all(std::span<const std::span<const uint8_t>> parts) override {
    return s_.write_all(parts, deadline_in(kWriteTimeout));
  }
  Result<std::span<uint8_t>> map_ring(uint64_t bytes) override {
    MOESERVE_ASSIGN_OR_RETURN(ring_, ShmRegion::map(s_.take_fd(), bytes));
    return std::span<uint8_t>(ring_.data(), ring_.size());
  }

 private:
  Socket& s_;
  ShmRegion ring_;
};

}  // namespace moeserve::ipc
