// The prefix cache's disk tier through the batch engine, with the tiny
// models of tests/data/models (qwen3moe: attention rows; qwen35moe: rows
// and recurrent states): the entries of one engine, flushed when it stops,
// serve a restarted engine (a new one over the same folder) as disk hits
// counted in cached_tokens, and its greedy output equals the cold run's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "runtime/batch_engine.h"
#include "runtime/engine_collector.h"
#include "test_device.h"

namespace moeserve::runtime {
namespace {

namespace fs = std::filesystem;

struct Run {
  std::vector<int32_t> tokens;
  int64_t cached = 0;
  PrefixCacheStats prefix;
};

// One engine over `dir` (a process's life): the prompts in turn, then the engine stops.
std::vector<Run> run_engine(Model& model, const fs::path& dir,
                            const std::vector<std::vector<int32_t>>& prompts) {
  EngineOptions eo;
  eo.n_slots = 2;
  eo.n_ctx = 128;
  eo.n_batch = 8;
  eo.prefix_cache_bytes = size_t(16) << 20;
  eo.kv_cache_dir = dir.string();
  BatchEngine engine(model, eo);
  EXPECT_TRUE(engine.status().is_ok()) << engine.status().to_string();
  std::vector<Run> runs;
  for (const auto& p : prompts) {
    moeserve::testing::Collector c;
    EngineRequest r = c.request(p, 8);
    r.stop_at_eos = false;
    EXPECT_TRUE(engine.submit(std::move(r)).is_ok());
    c.wait();
    EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
    runs.push_back({c.tokens, c.stats.cached_tokens, engine.stats().prefix});
  }
  return runs;
}

void restart_reuses_the_prompt(const std::string& model_file) {
  auto model = Model::load(fmt::format("{}/models/{}", MOESERVE_TEST_DATA_DIR, model_file),
                           {.n_threads = 2, .device = moeserve::testing::test_device()});
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("prefix_disk_engine_{}_{}", getpid(), model_file);
  fs::remove_all(dir);
  const std::vector<int32_t> prompt = (*model)->tokenizer().encode("You are a helpful assistant. def main(");
  const std::vector<Run> cold = run_engine(**model, dir, {prompt});
  ASSERT_EQ(cold.size(), 1u);
  EXPECT_EQ(cold[0].cached, 0);
  EXPECT_EQ(cold[0].prefix.disk_hits, 0);

  const std::vector<Run> warm = run_engine(**model, dir, {prompt});  // the restart
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_EQ(warm[0].cached, int64_t(prompt.size()) - 1);  // all but the token that gives the logits
  EXPECT_EQ(warm[0].prefix.disk_hits, 1);
  EXPECT_GT(warm[0].prefix.disk_entries, 0u);
  EXPECT_EQ(warm[0].tokens, cold[0].tokens);
  fs::remove_all(dir);
}

TEST(PrefixDiskEngine, ARestartedEngineReusesTheDiskEntriesQwen3Moe) {
  restart_reuses_the_prompt("qwen3moe-tiny.bf16.gguf");
}

TEST(PrefixDiskEngine, ARestartedEngineReusesTheDiskEntriesRecurrentQwen35Moe) {
  restart_reuses_the_prompt("qwen35moe-tiny.bf16.gguf");
}

// Paged KV: the host tier (one block of room here) pushes the blocks it
// evicts to disk, and a prompt whose blocks left the pool and the host
// tier reads them back from there; when the engine stops, every block of
// the tree and the host tier goes to disk, and a restarted engine takes
// the prompt's whole blocks from disk (the same output as the cold run).
TEST(PrefixDiskEngine, PagedBlocksGoToDiskAndServeARestart) {
  auto model = Model::load(fmt::format("{}/models/qwen3moe-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR),
                           {.n_threads = 2, .device = moeserve::testing::test_device()});
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  const fs::path dir = fs::temp_directory_path() / fmt::format("prefix_disk_engine_{}_paged", getpid());
  fs::remove_all(dir);
  auto block_bytes = [&] {
    auto probe = (*model)->new_kv_pool({.bytes = size_t(8) << 20, .block_rows = 4});
    EXPECT_TRUE(probe.is_ok());
    return probe.is_ok() ? (*probe)->block_bytes() : size_t(0);
  }();
  ASSERT_GT(block_bytes, 0u);
  EngineOptions eo;
  eo.n_slots = 2;
  eo.n_ctx = 96;
  eo.n_batch = 8;
  eo.kv_block_rows = 4;
  eo.kv_pool_bytes = block_bytes * 24;
  eo.kv_host_bytes = block_bytes;
  eo.kv_cache_dir = dir.string();
  auto run = [](BatchEngine& engine, const std::vector<int32_t>& prompt) {
    moeserve::testing::Collector c;
    EngineRequest r = c.request(prompt, 12);
    r.stop_at_eos = false;
    EXPECT_TRUE(engine.submit(std::move(r)).is_ok());
    c.wait();
    EXPECT_TRUE(c.status.is_ok()) << c.status.to_string();
    return std::pair(c.tokens, c.stats.cached_tokens);
  };
  const auto& tok = (*model)->tokenizer();
  const std::vector<int32_t> prompt =
      tok.encode("You are a helpful assistant. Answer briefly and cite the source you used. def main(");
  const int64_t whole = (int64_t(prompt.size()) - 1) / 4 * 4;  // every whole block but the logits row's
  // The last prompt of the first run: its blocks are still in the tree at
  // shutdown, so only the shutdown's flush puts them on disk.
  const std::vector<int32_t> last = tok.encode("Write a haiku about the sea, then explain its meter in");
  const int64_t last_whole = (int64_t(last.size()) - 1) / 4 * 4;
  std::vector<int32_t> cold, last_cold;
  {
    BatchEngine engine(**model, eo);
    ASSERT_TRUE(engine.status().is_ok()) << engine.status().to_string();
    const auto first = run(engine, prompt);
    cold = first.first;
    EXPECT_EQ(first.second, 0);
    for (const char* other :
         {"The weather in Paris is mild in spring and", "import numpy as np\nx = np.",
          "Once upon a time there was a dragon who lived", "SELECT name FROM users WHERE"}) {
      (void)run(engine, tok.encode(other));  // pushes the prompt's blocks out of the pool and the host tier
    }
    const EngineStats mid = engine.stats();
    EXPECT_GT(mid.kv_disk.saved + mid.kv_disk.files, 0);
    const auto again = run(engine, prompt);
    EXPECT_EQ(again.first, cold);
    EXPECT_EQ(again.second, whole);
    const EngineStats st = engine.stats();
    EXPECT_GT(st.kv_host.restored_from_disk, 0);
    EXPECT_GT(st.kv_disk.loaded, 0);
    last_cold = run(engine, last).first;
  }
  BatchEngine restarted(**model, eo);
  ASSERT_TRUE(restarted.status().is_ok()) << restarted.status().to_string();
  EXPECT_GT(restarted.stats().kv_disk.files, 0);
  const auto warm = run(restarted, prompt);
  EXPECT_EQ(warm.first, cold);
  EXPECT_EQ(warm.second, whole);
  const auto last_warm = run(restarted, last);
  EXPECT_EQ(last_warm.first, last_cold);
  EXPECT_EQ(last_warm.second, last_whole);
  EXPECT_GT(restarted.stats().kv_disk.loaded, 0);
  fs::remove_all(dir);
}

TEST(PrefixDiskEngine, AnUnusableFolderIsTheEngineStatus) {
  auto model = Model::load(fmt::format("{}/models/qwen3moe-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR),
                           {.n_threads = 1, .device = moeserve::testing::test_device()});
  ASSERT_TRUE(model.is_ok());
  EngineOptions eo;
  eo.n_slots = 1;
  eo.n_ctx = 64;
  eo.kv_cache_dir = "/proc/self/no-such-folder";
  BatchEngine engine(**model, eo);
  EXPECT_FALSE(engine.status().is_ok());
  EXPECT_NE(engine.status().message().find("--kv-cache-dir"), std::string::npos) << engine.status().message();
}

}  // namespace
}  // namespace moeserve::runtime
