// Paged KV's disk tier (kv_block_disk.h) on its own: blocks written by the
// writer thread come back bit for bit, also after a reopen (a restart);
// another model's files are left alone, damaged files of ours (truncated,
// a flipped value, a renamed file) are skipped and deleted; the folder
// keeps to its budget, least recently used first.
#include "runtime/kv_block_disk.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace moeserve::runtime {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kRows = 4;
constexpr size_t kBytes = 512;  // 256 values a block

struct TempDir {
  fs::path path;
  explicit TempDir(const char* name)
      : path(fs::temp_directory_path() / fmt::format("kv_block_disk_{}_{}", getpid(), name)) {
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

KvBlockDiskOptions options(const fs::path& dir, uint64_t fingerprint = 42, uint64_t max_bytes = 1 << 20) {
  return {.dir = dir.string(),
          .max_bytes = max_bytes,
          .fingerprint = fingerprint,
          .block_rows = kRows,
          .block_bytes = kBytes};
}

std::vector<uint16_t> values(uint16_t seed) {
  std::vector<uint16_t> v(kBytes / 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = uint16_t(seed * 31 + i * 7);
  return v;
}

std::unique_ptr<KvBlockDisk> open_disk(const KvBlockDiskOptions& o) {
  auto d = KvBlockDisk::open(o);
  EXPECT_TRUE(d.is_ok()) << d.status().to_string();
  return d.is_ok() ? std::move(d).value() : nullptr;
}

fs::path only_file(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir / "blocks")) files.push_back(e.path());
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? fs::path() : files[0];
}

const std::vector<int32_t> kA = {1, 2, 3, 4}, kB = {5, 6, 7, 8}, kC = {9, 10, 11, 12};

TEST(KvBlockDisk, BlocksComeBackAlsoAfterAReopen) {
  TempDir dir("reopen");
  {
    auto disk = open_disk(options(dir.path));
    ASSERT_TRUE(disk);
    disk->save(11, kA, values(1));
    disk->save(22, kB, values(2));
    EXPECT_TRUE(disk->contains(11, kA));  // queued or written: found either way
    disk->flush();
    EXPECT_TRUE(disk->contains(22, kB));
    EXPECT_FALSE(disk->contains(22, kA));  // the same key with other tokens
    EXPECT_FALSE(disk->contains(33, kC));
    std::vector<uint16_t> got;
    ASSERT_TRUE(disk->load(11, kA, got));
    EXPECT_EQ(got, values(1));
    EXPECT_FALSE(disk->load(11, kB, got));
    const KvBlockDiskStats st = disk->stats();
    EXPECT_EQ(st.files, 2);
    EXPECT_EQ(st.saved, 2);
    EXPECT_EQ(st.loaded, 1);
  }
  auto again = open_disk(options(dir.path));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->stats().files, 2);
  std::vector<uint16_t> got;
  ASSERT_TRUE(again->load(22, kB, got));
  EXPECT_EQ(got, values(2));
  ASSERT_TRUE(again->load(11, kA, got));
  EXPECT_EQ(got, values(1));
}

TEST(KvBlockDisk, AnotherModelsFilesAreLeftAlone) {
  TempDir dir("foreign");
  {
    auto disk = open_disk(options(dir.path, 42));
    disk->save(11, kA, values(1));
  }  // (the destructor writes what is queued)
  const fs::path file = only_file(dir.path);
  auto other = open_disk(options(dir.path, 43));
  ASSERT_TRUE(other);
  EXPECT_EQ(other->stats().files, 0);
  EXPECT_FALSE(other->contains(11, kA));
  EXPECT_TRUE(fs::exists(file));  // not ours to delete
}

TEST(KvBlockDisk, DamagedFilesAreSkippedAndDeleted) {
  for (const char* damage : {"truncated", "flipped", "renamed", "garbage"}) {
    SCOPED_TRACE(damage);
    TempDir dir(damage);
    {
      auto disk = open_disk(options(dir.path));
      disk->save(11, kA, values(1));
    }
    fs::path file = only_file(dir.path);
    const std::string what = damage;
    if (what == "truncated") {
      fs::resize_file(file, fs::file_size(file) - 2);
    } else if (what == "flipped") {  // a value's bit: only the checksum sees it
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(fs::file_size(file) - 3));
      f.put('\x5a');
    } else if (what == "renamed") {  // a file under another block's name
      const fs::path to = file.parent_path() / fmt::format("{:016x}{}", 22, kKvBlockFileSuffix);
      fs::rename(file, to);
      file = to;
    } else {
      std::ofstream(file, std::ios::binary | std::ios::trunc) << "MOEKVBLK but nothing after it";
    }
    auto disk = open_disk(options(dir.path));
    ASSERT_TRUE(disk);
    std::vector<uint16_t> got;
    EXPECT_FALSE(disk->load(11, kA, got));
    EXPECT_FALSE(disk->load(22, kA, got));
    EXPECT_EQ(disk->stats().files, 0);
    if (what != "garbage") {  // (garbage: no header of ours to judge it by)
      EXPECT_FALSE(fs::exists(file));
    }
  }
}

TEST(KvBlockDisk, KeepsToItsBudgetLeastRecentlyUsedFirst) {
  TempDir dir("budget");
  const uint64_t file = sizeof(KvBlockFileHeader) + kRows * sizeof(int32_t) + kBytes;
  auto disk = open_disk(options(dir.path, 42, 2 * file));
  ASSERT_TRUE(disk);
  disk->save(11, kA, values(1));
  disk->save(22, kB, values(2));
  disk->flush();
  std::vector<uint16_t> got;
  ASSERT_TRUE(disk->load(11, kA, got));  // 11 used now: 22 is the oldest
  disk->save(33, kC, values(3));
  disk->flush();
  EXPECT_TRUE(disk->contains(11, kA));
  EXPECT_FALSE(disk->contains(22, kB));
  EXPECT_TRUE(disk->contains(33, kC));
  const KvBlockDiskStats st = disk->stats();
  EXPECT_EQ(st.files, 2);
  EXPECT_EQ(st.bytes, 2 * file);
  EXPECT_EQ(st.dropped, 1);
}

TEST(KvBlockDisk, BadOptionsAndFoldersAreErrors) {
  TempDir dir("bad");
  KvBlockDiskOptions o = options(dir.path);
  o.block_bytes = 3;
  EXPECT_FALSE(KvBlockDisk::open(o).is_ok());
  o = options("/proc/self/no-such-folder");
  const auto bad = KvBlockDisk::open(o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--kv-cache-dir"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace moeserve::runtime
