// Boundary rows between MPI ranks' GPUs without the host: issue 41's
// "activations through NCCL". The shard protocol's frames still travel as
// MPI messages (mpi_world.h); a forward whose rows go over the link says
// so in its frame, and both ends then move the rows GPU to GPU in frame
// order: the caller's rows right after its call, the shard's right after
// its reply. NCCL moves the bytes (NVLink, PCIe or the network, as it
// finds); nothing here is a transport of its own.
//
// Built with NCCL beside CUDA and MPI (-DMOESERVE_NCCL=AUTO|ON|OFF);
// otherwise no_nccl/ answers "built without NCCL", so callers never #ifdef.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "ipc/socket.h"

namespace moeserve::ipc {

class RowLink {
 public:
  virtual ~RowLink() = default;
  // The device whose memory the rows leave from and arrive in ("cuda:1").
  virtual std::string device() const = 0;
  // `floats` floats at `rows` (that device's memory, complete) to rank
  // `peer`, which receives them; returns once they left. kUnavailable at
  // the deadline (the link is then unusable: an MPI job ends).
  virtual Status send(const float* rows, size_t floats, int peer, Clock::time_point deadline) = 0;
  virtual Status receive(float* rows, size_t floats, int peer, Clock::time_point deadline) = 0;
  // A buffer of at least `floats` floats in the device's memory, the same
  // until the next call for the slot (0 or 1) asks for more.
  virtual Result<float*> buffer(int slot, size_t floats) = 0;
  // Rows moved so far (both ways), for the logs and metrics.
  virtual uint64_t bytes_moved() const = 0;
};

namespace nccl {

// This build has NCCL.
bool built();

struct LinkOptions {
  int rank = 0, size = 1;
  int cuda_device = 0;  // this rank's GPU
  // Hands rank 0's bytes to every rank (MPI_Bcast): the communicator's id.
  std::function<Status(std::span<uint8_t>)> broadcast;
};

// Every rank of the job calls it at the same point (a collective). An
// error on one rank is an error on all (the job should end).
Result<std::unique_ptr<RowLink>> open(const LinkOptions& options);

}  // namespace nccl
}  // namespace moeserve::ipc
