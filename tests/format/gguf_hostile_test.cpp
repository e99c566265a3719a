// Broken and hostile GGUF files: every one must fail with kInvalidFormat and
// a message naming the file, the key/tensor and the reason; none may crash
// (run this under -DMOESERVE_SANITIZE=ON too).
#include <gtest/gtest.h>

#include <functional>

#include "format/gguf.h"
#include "format/gguf_test_util.h"
#include "format/gguf_writer.h"

namespace moeserve {
namespace {

using testing::RawGguf;

constexpr uint32_t kF32 = 0, kQ8_0 = 8, kTQ1_0 = 34;
constexpr const char* kName = "hostile.gguf";

// Header plus one KV whose key is "k"; the caller appends type and value.
RawGguf one_kv() {
  RawGguf r;
  r.header(0, 1).str("k");
  return r;
}

// Header plus one tensor info named `name`, padded, then `data_bytes` of data.
std::vector<uint8_t> one_tensor(std::initializer_list<int64_t> ne, uint32_t type, uint64_t offset,
                                size_t data_bytes, std::string_view name = "t") {
  RawGguf r;
  r.header(1, 0).tensor(name, ne, type, offset).pad_to(32).zeros(data_bytes);
  return r.bytes;
}

struct HostileCase {
  const char* label;
  std::function<std::vector<uint8_t>()> build;
  std::vector<std::string> words;  // all must appear in the message
};

std::vector<HostileCase> hostile_cases() {
  const uint64_t big = uint64_t(1) << 60;
  return {
      {"empty", [] { return std::vector<uint8_t>{}; }, {"truncated", "magic"}},
      {"short_magic", [] { return RawGguf().raw("GG").bytes; }, {"truncated"}},
      {"wrong_magic", [] { return RawGguf().raw("GGML").u32(3).u64(0).u64(0).bytes; }, {"bad magic", "'GGML'"}},
      {"version_1", [] { return RawGguf().header(0, 0, 1).bytes; }, {"version 1", "not supported"}},
      {"version_4", [] { return RawGguf().header(0, 0, 4).bytes; }, {"version 4", "not supported"}},
      {"big_endian", [] { return RawGguf().header(0, 0, 0x03000000).bytes; }, {"big-endian"}},
      {"truncated_header", [] { return RawGguf().raw("GGUF").u32(3).u32(0).bytes; }, {"truncated", "tensor count"}},
      {"absurd_kv_count", [=] { return RawGguf().header(0, big).bytes; }, {"kv count", "truncated or corrupt"}},
      {"absurd_tensor_count", [=] { return RawGguf().header(big, 0).bytes; }, {"tensor count", "truncated or corrupt"}},
      {"kv_count_past_data", [] { return RawGguf().header(0, 2).kv_u32("a", 1).bytes; }, {"kv count 2"}},
      {"unknown_value_type", [] { return one_kv().u32(13).u32(0).bytes; }, {"key 'k'", "unknown value type 13"}},
      {"nested_array", [] { return one_kv().u32(9).u32(9).u64(0).bytes; }, {"key 'k'", "nested"}},
      {"unknown_array_type", [] { return one_kv().u32(9).u32(99).u64(0).bytes; },
       {"key 'k'", "unknown array element type 99"}},
      {"absurd_array_count", [=] { return one_kv().u32(9).u32(5).u64(big).bytes; }, {"key 'k'", "does not fit"}},
      {"absurd_string_array_count", [=] { return one_kv().u32(9).u32(8).u64(big).u64(0).bytes; },
       {"key 'k'", "does not fit"}},
      {"string_past_end", [] { return one_kv().u32(8).u64(1000).raw("abc").bytes; },
       {"key 'k'", "truncated", "string value needs 1000 bytes"}},
      {"array_string_past_end", [] { return one_kv().u32(9).u32(8).u64(2).str("ok").u64(99).bytes; },
       {"key 'k'", "truncated", "array string"}},
      {"key_length_past_end", [] { return RawGguf().header(0, 1).u64(uint64_t(1) << 63).zeros(16).bytes; },
       {"truncated", "key"}},
      {"bool_value_2", [] { return one_kv().u32(7).u8(2).bytes; }, {"key 'k'", "bool value is 2"}},
      {"bool_array_element_5", [] { return one_kv().u32(9).u32(7).u64(2).u8(1).u8(5).bytes; },
       {"key 'k'", "bool element 1 is 5"}},
      {"duplicate_key", [] { return RawGguf().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).bytes; },
       {"key 'k'", "duplicate key"}},
      {"empty_key", [] { return RawGguf().header(0, 1).kv_u32("", 1).bytes; }, {"empty key"}},
      {"key_too_long", [] { return RawGguf().header(0, 1).kv_u32(std::string(2000, 'k'), 1).bytes; },
       {"key", "longer than the limit"}},
      {"alignment_string", [] { return RawGguf().header(0, 1).kv_string("general.alignment", "32").bytes; },
       {"key 'general.alignment'", "has type string, expected u32"}},
      {"alignment_u64", [] { return RawGguf().header(0, 1).str("general.alignment").u32(10).u64(32).bytes; },
       {"general.alignment", "expected u32"}},
      {"alignment_zero", [] { return RawGguf().header(0, 1).kv_u32("general.alignment", 0).bytes; },
       {"general.alignment", "power of two"}},
      {"alignment_48", [] { return RawGguf().header(0, 1).kv_u32("general.alignment", 48).bytes; },
       {"general.alignment", "alignment 48 is not a power of two"}},
      {"n_dims_0", [] { return one_tensor({}, kF32, 0, 32); }, {"tensor 't'", "n_dims is 0"}},
      {"n_dims_5", [] { return one_tensor({1, 1, 1, 1, 1}, kF32, 0, 32); }, {"tensor 't'", "n_dims is 5"}},
      {"dimension_0", [] { return one_tensor({4, 0}, kF32, 0, 32); }, {"tensor 't'", "dimension 1 is 0"}},
      {"dimension_negative", [] { return one_tensor({-4}, kF32, 0, 32); }, {"tensor 't'", "dimension 0 is -4"}},
      {"unsupported_tq1_0", [] { return one_tensor({256}, kTQ1_0, 0, 128); },
       {"tensor 't'", "tq1_0", "not supported", "supported: f32", "q6_K"}},
      {"unknown_type_77", [] { return one_tensor({4}, 77, 0, 32); }, {"tensor 't'", "type 77", "not supported"}},
      {"ne0_not_block_multiple", [] { return one_tensor({33}, kQ8_0, 0, 64); },
       {"tensor 't'", "ne[0] = 33", "not a multiple", "q8_0", "32"}},
      {"element_count_overflow", [] { return one_tensor({int64_t(1) << 32, int64_t(1) << 32}, kF32, 0, 32); },
       {"tensor 't'", "element count", "overflows"}},
      {"byte_size_overflow", [] { return one_tensor({int64_t(1) << 62}, kF32, 0, 32); },
       {"tensor 't'", "byte size", "overflows"}},
      {"data_past_end", [] { return one_tensor({16}, kF32, 0, 32); }, {"tensor 't'", "runs past the end"}},
      {"offset_past_end", [] { return one_tensor({8}, kF32, uint64_t(1) << 63, 32); },
       {"tensor 't'", "runs past the end"}},
      {"offset_max", [] { return one_tensor({8}, kF32, ~uint64_t(31), 32); }, {"tensor 't'", "runs past the end"}},
      {"misaligned_offset", [] { return one_tensor({4}, kF32, 4, 32); }, {"tensor 't'", "not aligned to 32"}},
      {"overlapping_tensors",
       [] {
         RawGguf r;
         r.header(2, 0).tensor("a", {16}, kF32, 0).tensor("b", {16}, kF32, 32).pad_to(32).zeros(96);
         return r.bytes;
       },
       {"'a'", "'b'", "overlap"}},
      {"duplicate_tensor",
       [] {
         RawGguf r;
         r.header(2, 0).tensor("a", {8}, kF32, 0).tensor("a", {8}, kF32, 32).pad_to(32).zeros(64);
         return r.bytes;
       },
       {"tensor 'a'", "duplicate tensor name"}},
      {"empty_tensor_name", [] { return one_tensor({8}, kF32, 0, 32, ""); }, {"empty tensor name"}},
      {"tensor_name_too_long", [] { return one_tensor({8}, kF32, 0, 32, std::string(1025, 'n')); },
       {"tensor name of 1025 bytes", "longer than the limit"}},
      {"binary_name_is_escaped", [] { return one_tensor({0}, kF32, 0, 32, std::string("a\nb\x01", 4)); },
       {"tensor 'a\\nb\\x01'", "dimension 0 is 0"}},
  };
}

class GgufHostile : public ::testing::TestWithParam<HostileCase> {};

TEST_P(GgufHostile, FailsWithNamedReason) {
  const HostileCase& c = GetParam();
  const std::vector<uint8_t> bytes = c.build();
  Result<GgufFile> f = GgufFile::parse_bytes(bytes, kName);
  ASSERT_FALSE(f.is_ok()) << c.label << " parsed";
  const Status& st = f.status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidFormat) << st.to_string();
  EXPECT_EQ(st.message().rfind(std::string(kName) + ": ", 0), 0u) << st.message();
  for (const std::string& word : c.words) {
    EXPECT_NE(st.message().find(word), std::string::npos) << "missing '" << word << "' in: " << st.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GgufHostile, ::testing::ValuesIn(hostile_cases()),
                         [](const ::testing::TestParamInfo<HostileCase>& info) { return info.param.label; });

// general.alignment 1 lets a tensor start at any byte: one whose data would
// be misaligned for its type is refused, naming the tensor and the fix.
TEST(GgufHostileExtra, TensorMisalignedForItsTypeIsRefused) {
  for (uint64_t rel : {0, 1, 2, 3}) {
    RawGguf r;
    r.header(1, 1).kv_u32("general.alignment", 1).tensor("t", {4}, kF32, rel);
    const size_t data_start = r.bytes.size();
    r.zeros(16 + rel);
    Result<GgufFile> f = GgufFile::parse_bytes(r.bytes, "m.gguf");
    // parse_bytes reads from the vector's storage (16-byte aligned), so the
    // file offset decides.
    if ((data_start + rel) % 4 == 0) {
      EXPECT_TRUE(f.is_ok()) << rel << ": " << f.status().to_string();
    } else {
      ASSERT_FALSE(f.is_ok()) << rel;
      EXPECT_NE(f.status().message().find("tensor 't'"), std::string::npos) << f.status().message();
      EXPECT_NE(f.status().message().find("not aligned to the 4 bytes a f32 tensor needs"), std::string::npos)
          << f.status().message();
    }
  }
}

TEST(GgufHostileExtra, LongTensorNameIsAcceptedWithWarning) {
  const std::string name(100, 'n');
  const std::vector<uint8_t> bytes = one_tensor({8}, kF32, 0, 32, name);
  Result<GgufFile> f = GgufFile::parse_bytes(bytes, kName);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  ASSERT_EQ(f->warnings().size(), 1u);
  EXPECT_NE(f->warnings()[0].find("llama.cpp"), std::string::npos);
  EXPECT_NE(f->find_tensor(name), nullptr);
}

TEST(GgufHostileExtra, MinimalFilesParse) {
  // The hostile cases above fail for their stated reason, not for something
  // the builders always get wrong: the same shapes with sane values parse.
  EXPECT_TRUE(GgufFile::parse_bytes(RawGguf().header(0, 0).bytes, kName).is_ok());
  EXPECT_TRUE(GgufFile::parse_bytes(one_kv().u32(7).u8(1).bytes, kName).is_ok());
  EXPECT_TRUE(GgufFile::parse_bytes(one_tensor({8}, kF32, 0, 32), kName).is_ok());
  EXPECT_TRUE(GgufFile::parse_bytes(one_tensor({32}, kQ8_0, 0, 34), kName).is_ok());
  RawGguf adjacent;
  adjacent.header(2, 0).tensor("a", {8}, kF32, 0).tensor("b", {16}, kF32, 32).pad_to(32).zeros(96);
  EXPECT_TRUE(GgufFile::parse_bytes(adjacent.bytes, kName).is_ok());
}

TEST(GgufHostileExtra, TensorCountPastMetadataNamesNoKey) {
  // The header bound passes (a long string makes room) but no tensor infos follow.
  RawGguf r;
  r.header(3, 2).kv_u32("general.alignment", 32).kv_string("general.name", std::string(120, 'x'));
  Result<GgufFile> f = GgufFile::parse_bytes(r.bytes, kName);
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().message().rfind("hostile.gguf: tensor count 3 is more than the 0 bytes after the metadata", 0),
            0u)
      << f.status().message();
}

// Cut a rich valid file at every length: each cut before the end of the last
// tensor's data must fail cleanly; cuts inside the trailing padding are fine.
TEST(GgufHostileExtra, TruncatedAtEveryLength) {
  GgufWriter w;
  w.set_string("general.architecture", "qwen3moe");
  w.set_u32("general.alignment", 64);
  w.set_u32("qwen3moe.block_count", 48);
  w.set_f32("qwen3moe.rope.freq_base", 1e6f);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  w.set_string_array("tokenizer.ggml.tokens", {"a", "", "Ġb", "<|im_end|>"});
  w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 3});
  w.set_f32_array("x.f", {1.0f, 2.0f});
  w.set_u64("x.u64", 7);
  w.set_bool_array("x.b", {true});
  std::vector<uint8_t> f32(16 * 4, 1), q8(34 * 2, 2);
  ASSERT_TRUE(w.add_tensor("a.weight", DType::F32, {16}, f32));
  ASSERT_TRUE(w.add_tensor("b.weight", DType::Q8_0, {32, 2}, q8));
  auto bytes = w.write_to_buffer();
  ASSERT_TRUE(bytes.is_ok());
  Result<GgufFile> full = GgufFile::parse_bytes(*bytes, kName);
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  size_t data_end = 0;
  for (const auto& t : full->tensors()) data_end = std::max<size_t>(data_end, t.offset + t.nbytes);
  ASSERT_LT(data_end, bytes->size());  // the last tensor is padded: some cuts must pass

  for (size_t len = 0; len < bytes->size(); ++len) {
    Result<GgufFile> f = GgufFile::parse_bytes(std::span<const uint8_t>(bytes->data(), len), kName);
    if (len < data_end) {
      ASSERT_FALSE(f.is_ok()) << "cut at " << len << " parsed";
      ASSERT_EQ(f.status().code(), StatusCode::kInvalidFormat) << f.status().to_string();
    } else {
      ASSERT_TRUE(f.is_ok()) << "cut at " << len << ": " << f.status().to_string();
    }
  }
}

}  // namespace
}  // namespace moeserve
