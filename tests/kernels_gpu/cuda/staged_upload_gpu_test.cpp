// StagedUpload (backend/cuda/staged_upload.h): copies from pageable host
// memory through two pinned buffers arrive byte for byte, across chunk
// boundaries and with a short last chunk, on its own stream and on a
// borrowed one; and CudaDevice::probe_staged_copies measures a rate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/staged_upload.h"
#include "kernels_gpu/cuda/gpu_test_util.h"

namespace moeserve {
namespace {

using backend::StagedUpload;
using testing::DeviceArray;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = uint8_t(rng());
  return v;
}

TEST(StagedUpload, CopiesPageableMemoryByteForByte) {
  MOESERVE_REQUIRE_GPU();
  struct Shape {
    size_t chunk;
    int threads;  // an 8 MiB chunk over 3 or 4 threads: parts of 2-3 MiB
  };
  for (const Shape sh : {Shape{size_t(1) << 20, 1}, Shape{size_t(8) << 20, 4}, Shape{size_t(8) << 20, 3}}) {
    // 5.3 chunks in two pieces, the second starting mid-chunk at an odd offset.
    const std::vector<uint8_t> host = random_bytes(5 * sh.chunk + 333'333, uint32_t(sh.chunk + sh.threads));
    const size_t first = 2 * sh.chunk + 12'345;
    for (bool borrowed : {false, true}) {
      SCOPED_TRACE(std::to_string(sh.chunk >> 20) + " MiB chunks, " + std::to_string(sh.threads) +
                   " threads, " + (borrowed ? "borrowed stream" : "own stream"));
      cudaStream_t stream = nullptr;
      if (borrowed) MOESERVE_CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      DeviceArray<uint8_t> dev(host.size());
      dev.poison();
      {
        StagedUpload up(sh.chunk, sh.threads);
        ASSERT_TRUE(up.init(stream).is_ok());
        ASSERT_TRUE(up.copy(dev.get(), host.data(), first).is_ok());
        ASSERT_TRUE(up.copy(dev.get() + first, host.data() + first, host.size() - first).is_ok());
        ASSERT_TRUE(up.finish().is_ok());
      }
      EXPECT_EQ(dev.download(), host);
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  }
}

// Many small pieces in scattered order (a statistics placement's cold
// experts): they share buffers, split across buffer ends and threads.
TEST(StagedUpload, ManySmallPiecesShareTheBuffers) {
  MOESERVE_REQUIRE_GPU();
  const std::vector<uint8_t> host = random_bytes(size_t(3) << 20, 11);
  std::vector<std::pair<size_t, size_t>> pieces;  // offset, bytes
  std::mt19937 rng(5);
  for (size_t off = 0; off < host.size();) {
    const size_t n = std::min(host.size() - off, size_t(1 + rng() % 50'000));
    pieces.emplace_back(off, n);
    off += n;
  }
  std::shuffle(pieces.begin(), pieces.end(), rng);
  DeviceArray<uint8_t> dev(host.size());
  dev.poison();
  {
    StagedUpload up(size_t(1) << 20, 4);
    ASSERT_TRUE(up.init().is_ok());
    for (const auto& [off, n] : pieces) ASSERT_TRUE(up.copy(dev.get() + off, host.data() + off, n).is_ok());
    ASSERT_TRUE(up.finish().is_ok());
  }
  EXPECT_EQ(dev.download(), host);
}

TEST(StagedUpload, RefusesACopyBeforeInitAndEmptyChunks) {
  MOESERVE_REQUIRE_GPU();
  std::vector<uint8_t> host(16, 1);
  DeviceArray<uint8_t> dev(16);
  StagedUpload not_ready;
  EXPECT_FALSE(not_ready.copy(dev.get(), host.data(), host.size()).is_ok());
  StagedUpload empty(0);
  EXPECT_FALSE(empty.init().is_ok());
}

TEST(StagedUpload, TheDeviceMeasuresCopiesThroughStaging) {
  MOESERVE_REQUIRE_GPU();
  auto gpu = backend::CudaDevice::open(0);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  const std::vector<uint8_t> host = random_bytes(size_t(40) << 20, 3);
  Result<double> rate = (*gpu)->probe_staged_copies(host);
  ASSERT_TRUE(rate.is_ok()) << rate.status().to_string();
  EXPECT_GT(*rate, 1e8);  // bytes/s: any working copy path moves more than 0.1 GB/s
  EXPECT_FALSE((*gpu)->host_memory_pinned(host.data(), host.size()));
}

}  // namespace
}  // namespace moeserve
