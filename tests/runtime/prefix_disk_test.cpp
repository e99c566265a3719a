// The prefix cache's disk tier: entries spilled from RAM (and flushed when
// the cache goes) are restored bit for bit after a "restart" (a new cache
// and tier over the same folder); damaged, foreign and garbage files are
// skipped with one warning each and never loaded; the byte budget evicts
// the oldest files; an unusable folder is a clear error.
#include "runtime/prefix_disk.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "runtime/kv_fingerprint.h"
#include "runtime/prefix_cache.h"

namespace moeserve::runtime {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kFingerprint = 0x1234;

// A fresh folder per test, removed after it.
class PrefixDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / fmt::format("prefix_disk_{}_{}", getpid(), info->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  PrefixDiskOptions options(uint64_t max_bytes = uint64_t(1) << 30) const {
    return {.dir = dir_.string(), .max_bytes = max_bytes, .fingerprint = kFingerprint, .kv_dim = 4};
  }
  std::unique_ptr<PrefixDiskTier> open_tier(uint64_t max_bytes = uint64_t(1) << 30) const {
    auto tier = PrefixDiskTier::open(options(max_bytes));
    EXPECT_TRUE(tier.is_ok()) << tier.status().to_string();
    return tier.is_ok() ? std::move(tier).value() : nullptr;
  }
  std::vector<fs::path> files() const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
  }

  fs::path dir_;
};

// Rows [0, n) of every layer from (layer, row, token).
void fill(KvCache& kv, const std::vector<int32_t>& tokens) {
  for (int64_t l = 0; l < kv.n_layer(); ++l) {
    for (size_t p = 0; p < tokens.size(); ++p) {
      for (int64_t i = 0; i < kv.kv_dim(); ++i) {
        kv.view().layers[size_t(l)].k[int64_t(p) * kv.kv_dim() + i] = uint16_t(l * 1000 + tokens[p] * 7 + i);
        kv.view().layers[size_t(l)].v[int64_t(p) * kv.kv_dim() + i] = uint16_t(l * 1000 + tokens[p] * 11 + i);
      }
    }
  }
}

void expect_same_rows(KvCache& a, KvCache& b, int64_t n) {
  for (int64_t l = 0; l < a.n_layer(); ++l) {
    for (int64_t i = 0; i < n * a.kv_dim(); ++i) {
      ASSERT_EQ(a.view().layers[size_t(l)].k[i], b.view().layers[size_t(l)].k[i]) << "layer " << l;
      ASSERT_EQ(a.view().layers[size_t(l)].v[i], b.view().layers[size_t(l)].v[i]) << "layer " << l;
    }
  }
}

int count_warnings(const std::string& log) {
  int n = 0;
  for (size_t at = log.find("[warn]"); at != std::string::npos; at = log.find("[warn]", at + 1)) ++n;
  return n;
}

// Stores `tokens` (rows from fill) into a cache over the folder and lets it
// flush: one file per entry.
void write_entry(const PrefixDiskOptions& o, const std::vector<int32_t>& tokens) {
  PrefixCache cache(1 << 20);
  auto tier = PrefixDiskTier::open(o);
  ASSERT_TRUE(tier.is_ok());
  cache.attach_disk(std::move(tier).value());
  KvCache kv(2, o.kv_dim, 32);
  fill(kv, tokens);
  cache.store(tokens, kv);
}

TEST_F(PrefixDiskTest, SpilledAndFlushedEntriesSurviveARestartBitForBit) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6}, b = {7, 8, 9, 10, 11, 12};
  KvCache src_a(2, 4, 32), src_b(2, 4, 32);
  fill(src_a, a);
  fill(src_b, b);
  {
    // Room for one entry (2 layers x 2 x 6 rows x 4 dims x 2 bytes + 24 bytes of tokens = 216 bytes).
    PrefixCache cache(300);
    cache.attach_disk(open_tier());
    cache.store(a, src_a);
    cache.store(b, src_b);  // evicts a: written to disk (in the background)
    cache.wait_for_disk();
    EXPECT_EQ(cache.stats().entries, 1u);
    EXPECT_EQ(cache.stats().disk_entries, 1u);
  }  // the cache goes: b is flushed too
  EXPECT_EQ(files().size(), 2u);

  PrefixCache cache(300);  // the restart
  cache.attach_disk(open_tier());
  EXPECT_EQ(cache.stats().disk_entries, 2u);
  KvCache dst(2, 4, 32);
  std::vector<int32_t> query = a;
  query.push_back(99);
  EXPECT_EQ(cache.restore(query, 100, dst), 6);
  expect_same_rows(src_a, dst, 6);
  KvCache dst_b(2, 4, 32);
  EXPECT_EQ(cache.restore(std::vector<int32_t>{7, 8, 9, 10, 50}, 100, dst_b), 4);  // a prefix of an entry
  expect_same_rows(src_b, dst_b, 4);
  const PrefixCacheStats st = cache.stats();
  EXPECT_EQ(st.hits, 2);
  EXPECT_EQ(st.disk_hits, 2);
  EXPECT_EQ(st.reused_tokens, 10);
  // Now in RAM: the next lookup does not go to disk.
  EXPECT_EQ(cache.restore(b, 100, dst_b), 6);
  EXPECT_EQ(cache.stats().disk_hits, 2);
}

TEST_F(PrefixDiskTest, DamagedForeignAndGarbageFilesAreSkippedWithOneWarningEach) {
  const PrefixDiskOptions o = options();
  const std::vector<int32_t> good = {1, 2, 3}, truncated = {4, 5, 6}, flipped = {7, 8, 9};
  for (const auto& t : {good, truncated, flipped}) write_entry(o, t);
  const fs::path truncated_file = dir_ / prefix_file_name(truncated);
  const fs::path flipped_file = dir_ / prefix_file_name(flipped);
  fs::resize_file(truncated_file, fs::file_size(truncated_file) - 3);
  {
    std::fstream f(flipped_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(sizeof(PrefixFileHeader) + 3 * 4 + 5));  // a byte of the rows
    f.put(char(0x5a));
  }
  // Another model's entry, and a file that only has our name.
  const std::vector<int32_t> foreign = {1, 2, 3, 4};
  std::vector<uint16_t> rows(size_t(2 * 2 * 4 * 4), 1);
  ASSERT_TRUE(write_prefix_file((dir_ / prefix_file_name(foreign)).string(),
                                {.fingerprint = 999, .kv_dim = 4, .tokens = foreign, .rows = rows})
                  .is_ok());
  std::ofstream(dir_ / "0123456789abcdef.kvpc") << "not a prefix file at all, just some text";
  std::ofstream(dir_ / "short.kvpc") << "MOE";
  std::ofstream(dir_ / "notes.txt") << "not ours: ignored";

  ::testing::internal::CaptureStderr();
  PrefixCache cache(1 << 20);
  cache.attach_disk(open_tier());
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_warnings(log), 4) << log;                   // truncated, foreign, garbage, short
  EXPECT_EQ(cache.stats().disk_entries, 2u) << log;           // good, flipped (its header is fine)
  EXPECT_FALSE(fs::exists(truncated_file));                   // ours and damaged: deleted
  EXPECT_TRUE(fs::exists(dir_ / prefix_file_name(foreign)));  // another model's: left alone
  EXPECT_TRUE(fs::exists(dir_ / "0123456789abcdef.kvpc"));

  KvCache dst(2, 4, 32);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(cache.restore(std::vector<int32_t>{7, 8, 9, 1}, 10, dst), 0);  // the checksum fails: a miss
  log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_warnings(log), 1) << log;
  EXPECT_NE(log.find("checksum"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(flipped_file));
  EXPECT_EQ(cache.stats().disk_entries, 1u);
  EXPECT_EQ(cache.restore(std::vector<int32_t>{4, 5, 6, 1}, 10, dst), 0);  // truncated: never indexed
  EXPECT_EQ(cache.restore(std::vector<int32_t>{1, 2, 3, 4}, 10, dst), 3);  // not the foreign entry
  EXPECT_EQ(cache.stats().disk_hits, 1);
}

TEST_F(PrefixDiskTest, TheBudgetEvictsTheOldestFiles) {
  // Each file: 72 bytes of header + 3 tokens x 4 + 2 layers x 2 x 3 rows x 4 dims x 2 = 180 bytes.
  {
    auto tier = open_tier(400);
    std::vector<uint16_t> rows(2 * 2 * 3 * 4, 7);
    for (int32_t t = 1; t <= 3; ++t) tier->save(std::vector<int32_t>{t, t, t}, rows, {});
    EXPECT_EQ(tier->entries(), 2u);
    EXPECT_LE(tier->bytes(), 400u);
    EXPECT_FALSE(fs::exists(dir_ / prefix_file_name(std::vector<int32_t>{1, 1, 1})));
    // Used: the newest now.
    EXPECT_EQ(tier->find(std::vector<int32_t>{2, 2, 2}, 10, 0).n, 3);
    EXPECT_TRUE(tier->load(prefix_file_name(std::vector<int32_t>{2, 2, 2})).has_value());
  }
  // Mtimes order a restart's index: entry 3 made older, a smaller budget keeps the newest.
  const auto old = fs::last_write_time(dir_ / prefix_file_name(std::vector<int32_t>{3, 3, 3}));
  fs::last_write_time(dir_ / prefix_file_name(std::vector<int32_t>{3, 3, 3}), old - std::chrono::hours(1));
  auto tier = open_tier(200);
  EXPECT_EQ(tier->entries(), 1u);
  EXPECT_EQ(tier->find(std::vector<int32_t>{2, 2, 2}, 10, 0).n, 3);
  EXPECT_EQ(files().size(), 1u);
}

TEST_F(PrefixDiskTest, AFolderThatCannotBeCreatedIsAClearError) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "a_file") << "x";
  PrefixDiskOptions o = options();
  o.dir = (dir_ / "a_file" / "cache").string();
  auto tier = PrefixDiskTier::open(o);
  ASSERT_FALSE(tier.is_ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kIoError);
  EXPECT_NE(tier.status().message().find("--kv-cache-dir"), std::string::npos);
  EXPECT_NE(tier.status().message().find("cannot create"), std::string::npos) << tier.status().message();
}

TEST(KvFingerprint, CoversTheWeightsNotOnlyTheLayout) {
  const std::string path = fmt::format("{}/models/qwen3moe-tiny.bf16.gguf", MOESERVE_TEST_DATA_DIR);
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  std::vector<uint8_t> bytes(file->bytes().begin(), file->bytes().end());
  auto same = GgufFile::parse_bytes(bytes, "copy");
  ASSERT_TRUE(same.is_ok());
  EXPECT_EQ(kv_fingerprint(*file), kv_fingerprint(*same));
  // One weight byte changed (same names, types, shapes, offsets): another fingerprint.
  std::vector<uint8_t> tuned = bytes;
  tuned[size_t(file->tensors().back().offset) + 1] ^= 1;
  auto other = GgufFile::parse_bytes(tuned, "tuned");
  ASSERT_TRUE(other.is_ok());
  EXPECT_NE(kv_fingerprint(*file), kv_fingerprint(*other));
}

}  // namespace
}  // namespace moeserve::runtime
