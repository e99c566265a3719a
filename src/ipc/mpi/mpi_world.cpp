// MPI ranks as layer shards: the shard protocol's bytes as MPI messages.
// A write is one message (the parts gathered); a read takes bytes from the
// messages received so far, waiting for the next with MPI_Iprobe until the
// deadline (so no receive hangs: MPI itself waits forever). A message of
// the close tag ends the stream (rank 0's exit).
#include "ipc/mpi_world.h"

#include <fmt/format.h>
#include <mpi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/log.h"

namespace moeserve::ipc::mpi {
namespace {

constexpr int kDataTag = 1;
constexpr int kCloseTag = 2;

// MPI calls one at a time: a library that grants less than
// MPI_THREAD_MULTIPLE is still safe with several shards' threads.
std::mutex& mpi_mutex() {
  static std::mutex mu;
  return mu;
}

void finalize_at_exit() {
  std::lock_guard lock(mpi_mutex());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// The bytes exchanged with one peer rank.
class Peer {
 public:
  explicit Peer(int rank) : rank_(rank) {}

  Status send(std::span<const std::span<const uint8_t>> parts, int tag = kDataTag) {
    out_.clear();
    for (const auto& p : parts) out_.insert(out_.end(), p.begin(), p.end());
    if (out_.size() > size_t(INT32_MAX))
      return make_error(StatusCode::kOutOfRange, "an MPI message of {} bytes", out_.size());
    std::lock_guard lock(mpi_mutex());
    if (MPI_Send(out_.data(), int(out_.size()), MPI_BYTE, rank_, tag, MPI_COMM_WORLD) != MPI_SUCCESS)
      return make_error(StatusCode::kIoError, "MPI_Send to rank {} failed", rank_);
    return Status::ok();
  }

  Status receive(std::span<const std::span<uint8_t>> parts, Clock::time_point deadline) {
    for (const std::span<uint8_t>& p : parts) {
      size_t done = 0;
      while (done < p.size()) {
        if (at_ == in_.size()) MOESERVE_RETURN_IF_ERROR(next_message(deadline));
        const size_t n = std::min(p.size() - done, in_.size() - at_);
        std::memcpy(p.data() + done, in_.data() + at_, n);
        done += n, at_ += n;
      }
    }
    return Status::ok();
  }

  bool closed() const { return closed_; }

 private:
  Status next_message(Clock::time_point deadline) {
    if (closed_) return make_error(StatusCode::kIoError, "rank {} closed the stream", rank_);
    const auto start = Clock::now();
    while (true) {
      int flag = 0;
      MPI_Status status;
      {
        std::lock_guard lock(mpi_mutex());
        MPI_Iprobe(rank_, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &status);
        if (flag) {
          int count = 0;
          MPI_Get_count(&status, MPI_BYTE, &count);
          in_.resize(size_t(count));
          at_ = 0;
          MPI_Recv(in_.data(), count, MPI_BYTE, rank_, status.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          if (status.MPI_TAG == kCloseTag) {
            closed_ = true;
            in_.clear();
            return make_error(StatusCode::kIoError, "rank {} closed the stream", rank_);
          }
          if (count > 0) return Status::ok();
          continue;
        }
      }
      const auto now = Clock::now();
      if (now >= deadline)
        return make_error(StatusCode::kUnavailable, "rank {} did not answer in time", rank_);
      // Spin for the first 10 ms (a decode step's answer, the next step's
      // call: a nap's wake-up would add its latency to every token), then nap.
      if (now - start < std::chrono::milliseconds(10)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  int rank_;
  std::vector<uint8_t> in_, out_;
  size_t at_ = 0;
  bool closed_ = false;
};

class RankStream final : public ShardStream {
 public:
  explicit RankStream(int rank) : peer_(rank) {}
  ~RankStream() override { close(); }
  Status write_all(std::span<const std::span<const uint8_t>> parts, Clock::time_point) override {
    if (closed_) return make_error(StatusCode::kIoError, "the stream is closed");
    return peer_.send(parts);
  }
  Status read_exact(std::span<const std::span<uint8_t>> parts, Clock::time_point deadline) override {
    if (closed_) return make_error(StatusCode::kIoError, "the stream is closed");
    return peer_.receive(parts, deadline);
  }
  // Tells the rank this job is over (its shard loop ends).
  void close() override {
    if (closed_) return;
    closed_ = true;
    (void)peer_.send({}, kCloseTag);
  }

 private:
  Peer peer_;
  bool closed_ = false;
};

class RootChannel final : public Channel {
 public:
  RootChannel() : peer_(0) {}
  Status read_exact(std::span<uint8_t> out) override {
    const std::span<uint8_t> part[1] = {out};
    return peer_.receive(part, kNoDeadline);
  }
  Status write_all(std::span<const std::span<const uint8_t>> parts) override { return peer_.send(parts); }
  Result<std::span<uint8_t>> map_ring(uint64_t) override {
    return make_error(StatusCode::kUnsupported, "no shared memory between MPI ranks");
  }

 private:
  Peer peer_;
};

}  // namespace

bool built() { return true; }

bool launched() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

Result<World> init() {
  static std::once_flag once;
  static Status init_status;
  static World world;
  std::call_once(once, [] {
    if (!launched()) {
      init_status =
          make_error(StatusCode::kUnsupported,
                     "--layer-split mpi:R runs under mpirun: start every rank with the same command, e.g. "
                     "mpirun -np 2 -H hostA,hostB moeserve serve -m FILE --layer-split mpi:0,mpi:1");
      return;
    }
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
      init_status = make_error(StatusCode::kUnavailable, "MPI_Init_thread failed");
      return;
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      init_status =
          make_error(StatusCode::kUnsupported, "this MPI library allows calls from one thread only");
      return;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world.size);
    std::atexit(finalize_at_exit);
  });
  if (!init_status.is_ok()) return init_status;
  return world;
}

std::unique_ptr<ShardStream> stream_to(int rank) { return std::make_unique<RankStream>(rank); }

std::unique_ptr<Channel> channel_from_root() { return std::make_unique<RootChannel>(); }

Status broadcast(std::span<uint8_t> bytes) {
  std::lock_guard lock(mpi_mutex());
  if (MPI_Bcast(bytes.data(), int(bytes.size()), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
    return make_error(StatusCode::kIoError, "MPI_Bcast of {} bytes failed", bytes.size());
  return Status::ok();
}

void abort(const Status& why) {
  std::fprintf(stderr, "error: %s; ending the MPI job (a job cannot go on without one of its ranks)\n",
               why.message().c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace moeserve::ipc::mpi
