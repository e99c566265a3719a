// One prefix-cache entry as a file: the disk tier's format (prefix_disk.h).
//
// Layout, in the host's byte order (little-endian on every machine moeserve
// builds for; the magic would not match on another):
//   PrefixFileHeader (72 bytes)
//   int32  tokens[n_tokens]
//   uint16 rows[n_rows]      per attention layer: K rows [n][kv_dim], then V rows
//   float  states[n_states]  the recurrent layers' states at state_position
// `checksum` is hash64 over everything after the header, so a torn write,
// a truncated copy or a flipped bit is caught when the entry is loaded; the
// start-up scan reads only the header and the tokens and checks the sizes
// against the file's size.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/kv_cache.h"

namespace moeserve::runtime {

inline constexpr char kPrefixFileMagic[8] = {'M', 'O', 'E', 'K', 'V', 'P', 'F', 'X'};
inline constexpr uint32_t kPrefixFileVersion = 1;
inline constexpr const char* kPrefixFileSuffix = ".kvpc";

struct PrefixFileHeader {
  char magic[8] = {};
  uint32_t version = 0;
  uint32_t flags = 0;        // kPrefixFileRecurrent
  uint64_t fingerprint = 0;  // kv_fingerprint() of the model that computed the rows
  int64_t kv_dim = 0;
  int64_t n_tokens = 0;
  uint64_t n_rows = 0;    // uint16 values
  uint64_t n_states = 0;  // float values
  int64_t state_position = 0;
  uint64_t checksum = 0;
};
static_assert(sizeof(PrefixFileHeader) == 72, "the header is written as it is laid out");
inline constexpr uint32_t kPrefixFileRecurrent = 1;

// What a file holds after its header.
struct PrefixFileEntry {
  std::vector<int32_t> tokens;
  std::vector<uint16_t> rows;
  CacheSnapshot states;
};

// A 64-bit hash of `bytes` continuing from `seed`: one multiply and a
// shift-xor per 8-byte word. Every step is a bijection of the state, so a
// change confined to one word always changes the result; other changes
// collide with probability about 2^-64. Fast enough (several GB/s) that
// verifying a large entry costs less than reading it.
uint64_t hash64(const void* data, size_t bytes, uint64_t seed = 0x6a09e667f3bcc909ULL);

// The checksum of a file's contents after its header.
uint64_t prefix_file_checksum(std::span<const int32_t> tokens, std::span<const uint16_t> rows,
                              std::span<const float> states);

// "<16 hex digits of hash64(tokens)>.kvpc".
std::string prefix_file_name(std::span<const int32_t> tokens);

// The size the header's counts imply (0: they overflow).
uint64_t prefix_file_bytes(const PrefixFileHeader& h);

struct PrefixFileWrite {
  uint64_t fingerprint = 0;
  int64_t kv_dim = 0;
  bool recurrent = false;
  std::span<const int32_t> tokens;
  std::span<const uint16_t> rows;
  const CacheSnapshot* states = nullptr;  // null: none
};

// Writes `w` to `path` atomically: a temporary name in the same folder,
// then a rename over `path` (readers see the old file or the whole new one).
Status write_prefix_file(const std::string& path, const PrefixFileWrite& w);

// The header (magic and version checked: kUnsupported otherwise; too short:
// kInvalidFormat) and the file's size. Nothing else is checked.
struct PrefixFileHead {
  PrefixFileHeader header;
  uint64_t file_bytes = 0;
};
Result<PrefixFileHead> read_prefix_header(const std::string& path);

// The tokens of a file whose header was read (the start-up index).
Result<std::vector<int32_t>> read_prefix_tokens(const std::string& path, const PrefixFileHeader& h);

// The whole entry with its header (into `header`): kInvalidFormat when the
// sizes do not match the file's or the checksum does not match the contents.
// The caller checks the fingerprint and the layout against its own.
Result<PrefixFileEntry> read_prefix_file(const std::string& path, PrefixFileHeader* header);

}  // namespace moeserve::runtime
