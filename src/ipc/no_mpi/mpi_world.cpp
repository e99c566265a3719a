// A build without MPI: --layer-split mpi:R says how to get it.
#include "ipc/mpi_world.h"

#include <cstdio>
#include <cstdlib>

namespace moeserve::ipc::mpi {

bool built() { return false; }

bool launched() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

Result<World> init() {
  return make_error(StatusCode::kUnsupported,
                    "this moeserve was built without MPI: install Debian's libopenmpi-dev and rebuild "
                    "(-DMOESERVE_MPI=ON) to run layer shards on MPI ranks");
}

std::unique_ptr<ShardStream> stream_to(int) { return nullptr; }

std::unique_ptr<Channel> channel_from_root() { return nullptr; }

Status broadcast(std::span<uint8_t>) {
  return make_error(StatusCode::kUnsupported, "this moeserve was built without MPI");
}

void abort(const Status& why) {
  std::fprintf(stderr, "error: %s\n", why.message().c_str());
  std::_Exit(1);
}

}  // namespace moeserve::ipc::mpi
