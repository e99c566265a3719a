// MPI for layer shards on other machines (`mpirun ... moeserve serve
// --layer-split mpi:0,mpi:1`): every rank runs the same command; rank 0
// serves and the others run their layer ranges for it. The shard protocol
// (shard_frames.h) travels as MPI messages between rank 0 and each rank, the
// same frames as over a shard process's socket. OpenMPI launches the ranks
// and moves the bytes; nothing here is a transport of its own.
//
// Built when CMake finds MPI (-DMOESERVE_MPI=AUTO|ON|OFF); otherwise every
// function says so (no_mpi/). An MPI job cannot lose a rank and go on: a
// receive that times out or a rank that is gone ends the job (abort).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"
#include "ipc/shard_client.h"
#include "ipc/worker_session.h"

namespace moeserve::ipc::mpi {

// This build has MPI.
bool built();
// This process was started by mpirun (its environment says so).
bool launched();

struct World {
  int rank = 0, size = 1;
};
// Initialises MPI once (threads: the server calls from several, one at a
// time per shard) and finalises it at exit. kUnsupported without MPI or
// outside mpirun.
Result<World> init();

// Rank 0's stream to `rank` (a shard's calls and their answers).
std::unique_ptr<ShardStream> stream_to(int rank);
// A shard rank's channel from rank 0 (shard_session.h serves it); it ends
// when rank 0 closes its stream (its exit).
std::unique_ptr<Channel> channel_from_root();
// Rank 0's `bytes` to every rank (each passes a buffer of the same size).
Status broadcast(std::span<uint8_t> bytes);
// Ends the whole job (every rank) with the reason on stderr.
[[noreturn]] void abort(const Status& why);

}  // namespace moeserve::ipc::mpi
