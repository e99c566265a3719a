// Helpers of the expert worker tests on the tiny trained MoE model: the
// model, expert sets, a scratch directory for placements, worker options
// for a spawned `moeserve worker`, and greedy generation.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "format/model_keys.h"
#include "ipc/socket.h"
#include "ipc/worker_backend.h"
#include "moe/json_file.h"
#include "moe/moe_shape.h"
#include "moe/placement.h"
#include "runtime/generator.h"
#include "runtime/model.h"

namespace moeserve::ipc::worker_test {

inline const std::string kModel = std::string(MOESERVE_TEST_DATA_DIR) + "/models/qwen3moe-tiny.bf16.gguf";
constexpr int kLayers = 4, kExperts = 16;

inline std::vector<std::vector<int32_t>> all_experts() {
  std::vector<int32_t> all(kExperts);
  std::iota(all.begin(), all.end(), 0);
  return std::vector<std::vector<int32_t>>(kLayers, all);
}

// Even experts in even layers, odd experts in odd layers.
inline std::vector<std::vector<int32_t>> half_experts() {
  std::vector<std::vector<int32_t>> h(kLayers);
  for (int l = 0; l < kLayers; ++l) {
    for (int e = l % 2; e < kExperts; e += 2) h[size_t(l)].push_back(e);
  }
  return h;
}

// A scratch directory with a placement file for `worker` experts.
class Scratch {
 public:
  Scratch() {
    auto d = make_private_dir("moeserve-ipc-test");
    EXPECT_TRUE(d.is_ok());
    dir_ = *d;
  }
  ~Scratch() { remove_private_dir(dir_); }
  std::string placement(const std::vector<std::vector<int32_t>>& worker, const std::string& name = "p.json") {
    auto file = GgufFile::open(kModel);
    EXPECT_TRUE(file.is_ok());
    auto shape = moe::moe_shape(*file);
    EXPECT_TRUE(shape.is_ok());
    moe::ExpertPlacement p;
    p.hot.assign(kLayers, {});
    p.worker = worker;
    const std::string path = dir_ + "/" + name;
    EXPECT_TRUE(moe::write_text_file(path, moe::to_json(p, *shape)).is_ok());
    return path;
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

inline WorkerBackendOptions worker_options(const std::vector<std::vector<int32_t>>& owned,
                                           const std::string& placement) {
  auto file = GgufFile::open(kModel);
  EXPECT_TRUE(file.is_ok());
  auto shape = moe::moe_shape(*file);
  EXPECT_TRUE(shape.is_ok());
  WorkerBackendOptions w;
  w.spawn = true;
  w.exe = MOESERVE_BIN;
  w.model_path = kModel;
  w.placement_path = placement;
  w.worker_threads = 2;
  w.pack_weights = true;
  w.model_fingerprint = fingerprint_value(shape->fingerprint);
  w.placement_fingerprint = moe::experts_fingerprint(owned);
  w.kernel_id = kernel_identity(true);
  w.n_embd = uint32_t(file->get_int(file->arch_key(keys::kEmbeddingLength)).value_or(0));
  w.capacity_rows = 64;  // prompts of 33 tokens: several batched calls a layer
  w.stream_rows = 4;
  w.start_timeout = std::chrono::seconds(120);
  w.backoff_first = std::chrono::milliseconds(20);
  return w;
}

inline std::unique_ptr<runtime::Model> load(backend::ExpertBackend* worker,
                                            const std::vector<std::vector<int32_t>>& owned) {
  runtime::ModelLoadOptions o{.n_threads = 2, .device = "cpu"};
  o.expert_worker = worker;
  o.worker_experts = owned;
  auto m = runtime::Model::load(kModel, o);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? std::move(m.value()) : nullptr;
}

inline const std::vector<int32_t> kPrompt = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                             12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                                             23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33};

// Prefill in chunks of 8 (and one of 1), then greedy decode; `between` runs
// after each decoded token.
inline Result<std::vector<int32_t>> greedy(runtime::Model& m, int n,
                                           const std::function<void(int)>& between = {}) {
  runtime::Generator g(m, 256);
  MOESERVE_RETURN_IF_ERROR(g.status());
  std::vector<int32_t> out;
  int32_t id = -1;
  MOESERVE_RETURN_IF_ERROR(g.prefill_greedy(kPrompt, 8, &id));
  out.push_back(id);
  while (int(out.size()) < n) {
    if (between) between(int(out.size()));
    MOESERVE_RETURN_IF_ERROR(g.decode_greedy(id, &id));
    out.push_back(id);
  }
  return out;
}

}  // namespace moeserve::ipc::worker_test
