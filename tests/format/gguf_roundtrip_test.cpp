// Writer -> reader round trips, the reader against hand-built bytes, and the
// writer against hand-built bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <cstring>
#include <random>

#include "format/gguf.h"
#include "format/gguf_test_util.h"
#include "format/gguf_writer.h"

namespace moeserve {
namespace {

using testing::RawGguf;
using testing::TempPath;

std::vector<std::pair<std::string, GgufValue>> every_value_type() {
  return {
      {"t.u8", GgufValue::u8(250)},
      {"t.i8", GgufValue::i8(-128)},
      {"t.u16", GgufValue::u16(65535)},
      {"t.i16", GgufValue::i16(-32768)},
      {"t.u32", GgufValue::u32(4000000000u)},
      {"t.i32", GgufValue::i32(-2000000000)},
      {"t.f32", GgufValue::f32(1e-6f)},
      {"t.bool", GgufValue::boolean(true)},
      {"t.string", GgufValue::string("héllo \xe4\xb8\x96\xe7\x95\x8c\n")},
      {"t.empty_string", GgufValue::string("")},
      {"t.u64", GgufValue::u64(std::numeric_limits<uint64_t>::max())},
      {"t.i64", GgufValue::i64(std::numeric_limits<int64_t>::min())},
      {"t.f64", GgufValue::f64(-3.141592653589793)},
      {"a.u8", GgufValue::array(std::vector<uint8_t>{0, 1, 255})},
      {"a.i8", GgufValue::array(std::vector<int8_t>{-1, 127})},
      {"a.u16", GgufValue::array(std::vector<uint16_t>{7})},
      {"a.i16", GgufValue::array(std::vector<int16_t>{-7, 7})},
      {"a.u32", GgufValue::array(std::vector<uint32_t>{1, 2, 3})},
      {"a.i32", GgufValue::array(std::vector<int32_t>{11, 11, 10, 0})},
      {"a.f32", GgufValue::array(std::vector<float>{0.5f, -1.25f})},
      {"a.bool", GgufValue::bool_array({true, false, true})},
      {"a.u64", GgufValue::array(std::vector<uint64_t>{1ull << 40})},
      {"a.i64", GgufValue::array(std::vector<int64_t>{-(1ll << 40)})},
      {"a.f64", GgufValue::array(std::vector<double>{1e300})},
      {"a.string", GgufValue::array(std::vector<std::string>{"", "a b", "Ġthe", "\xe2\x96\x81", ""})},
      {"a.empty", GgufValue::array(std::vector<int32_t>{})},
      {"a.empty_strings", GgufValue::array(std::vector<std::string>{})},
  };
}

GgufFile parse_ok(const std::vector<uint8_t>& bytes, const char* name = "mem.gguf") {
  Result<GgufFile> f = GgufFile::parse_bytes(bytes, name);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  return std::move(f).value();
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = uint8_t(rng());
  return out;
}

TEST(GgufRoundTrip, EveryValueTypeInOrder) {
  GgufWriter w;
  const auto values = every_value_type();
  for (const auto& [key, value] : values) w.set(key, value);
  auto bytes = w.write_to_buffer();
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  GgufFile f = parse_ok(*bytes);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  ASSERT_EQ(f.kvs().size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(f.kvs()[i].key, values[i].first);
    EXPECT_EQ(f.kvs()[i].value.type_name(), values[i].second.type_name()) << values[i].first;
    EXPECT_TRUE(f.kvs()[i].value == values[i].second) << values[i].first;
  }
  EXPECT_EQ(f.get_int("t.i8"), -128);
  EXPECT_EQ(f.get_uint("t.u32"), 4000000000u);
  EXPECT_EQ(f.get_int("t.u64"), std::nullopt);
  EXPECT_EQ(f.get_float("t.f32"), double(1e-6f));
  EXPECT_EQ(f.get_bool("t.bool"), true);
  EXPECT_EQ(f.get_string("t.empty_string"), "");
  ASSERT_NE(f.get_string_array("a.string"), nullptr);
  EXPECT_EQ(f.get_string_array("a.string")->at(2), "Ġthe");
  EXPECT_EQ(f.get_int_array("a.i32"), (std::vector<int64_t>{11, 11, 10, 0}));
  EXPECT_EQ(f.get_float_array("a.f32"), (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(f.get_int("missing"), std::nullopt);
  EXPECT_TRUE(f.tensors().empty());
}

TEST(GgufRoundTrip, RewriteIsByteIdentical) {
  GgufWriter w;
  for (const auto& [key, value] : every_value_type()) w.set(key, value);
  std::vector<uint8_t> data(64 * 4 * 4);
  ASSERT_TRUE(w.add_tensor("w", DType::F32, {64, 4}, data));
  auto first = w.write_to_buffer();
  ASSERT_TRUE(first.is_ok());
  GgufFile f = parse_ok(*first);
  GgufWriter again;
  for (const auto& kv : f.kvs()) again.set(kv.key, kv.value);
  for (const auto& t : f.tensors()) {
    ASSERT_TRUE(again.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.bytes()));
  }
  auto second = again.write_to_buffer();
  ASSERT_TRUE(second.is_ok());
  EXPECT_EQ(*first, *second);
}

TEST(GgufWriterTest, SetTwiceReplacesInPlace) {
  GgufWriter w;
  w.set_u32("a", 1);
  w.set_string("b", "x");
  w.set_u32("c", 3);
  w.set_string("a", "replaced");
  EXPECT_TRUE(w.erase("c"));
  EXPECT_FALSE(w.erase("c"));
  auto bytes = w.write_to_buffer();
  ASSERT_TRUE(bytes.is_ok());
  GgufFile f = parse_ok(*bytes);
  ASSERT_EQ(f.kvs().size(), 2u);
  EXPECT_EQ(f.kvs()[0].key, "a");
  EXPECT_EQ(f.get_string("a"), "replaced");
  EXPECT_EQ(f.kvs()[1].key, "b");
}

struct TensorCase {
  const char* name;
  DType type;
  std::vector<int64_t> shape;
};

class GgufTensorRoundTrip : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufTensorRoundTrip, SeveralDtypesAndShapes) {
  const uint32_t align = GetParam();
  const std::vector<TensorCase> cases = {
      {"token_embd.weight", DType::F32, {4, 3}},  {"blk.0.attn_norm.weight", DType::F16, {7}},
      {"blk.0.bf16", DType::BF16, {2, 2, 2, 2}},  {"blk.0.ffn_up.weight", DType::Q8_0, {64, 2}},
      {"blk.0.q4_0", DType::Q4_0, {32}},          {"blk.0.ffn_gate_exps.weight", DType::Q4_K, {256, 2, 3}},
      {"blk.0.q5_k", DType::Q5_K, {256}},         {"output.weight", DType::Q6_K, {512, 1, 3}},
  };
  GgufWriter w;
  w.set_string("general.architecture", "qwen3moe");
  if (align != 32) w.set_u32("general.alignment", align);
  std::vector<std::vector<uint8_t>> datas;
  for (size_t i = 0; i < cases.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : cases[i].shape) n *= d;
    datas.push_back(random_bytes(dtype_row_bytes(cases[i].type, n), uint32_t(i)));
    ASSERT_TRUE(w.add_tensor(cases[i].name, cases[i].type, cases[i].shape, datas.back()));
  }
  auto bytes = w.write_to_buffer();
  ASSERT_TRUE(bytes.is_ok());
  EXPECT_EQ(bytes->size() % align, 0u);
  GgufFile f = parse_ok(*bytes);
  EXPECT_EQ(f.alignment(), align);
  EXPECT_EQ(f.architecture(), "qwen3moe");
  EXPECT_EQ(f.data_offset() % align, 0u);
  ASSERT_EQ(f.tensors().size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    SCOPED_TRACE(cases[i].name);
    EXPECT_EQ(t.name, cases[i].name);
    EXPECT_EQ(t.type, cases[i].type);
    ASSERT_EQ(t.n_dims, cases[i].shape.size());
    int64_t n = 1;
    for (uint32_t d = 0; d < kGgufMaxDims; ++d) {
      EXPECT_EQ(t.ne[d], d < t.n_dims ? cases[i].shape[d] : 1);
      n *= t.ne[d];
    }
    EXPECT_EQ(t.n_elements(), n);
    EXPECT_EQ(t.nbytes, datas[i].size());
    EXPECT_EQ(t.offset % align, 0u);
    EXPECT_EQ(t.data, bytes->data() + t.offset);
    EXPECT_TRUE(std::equal(datas[i].begin(), datas[i].end(), t.data));
    EXPECT_EQ(f.find_tensor(cases[i].name), &t);
  }
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufTensorRoundTrip, ::testing::Values(32u, 64u, 1u, 4096u));

TEST(GgufRoundTrip, Version2Accepted) {
  GgufWriter w;
  w.set_version(2);
  w.set_string("general.architecture", "qwen3");
  std::vector<uint8_t> data(16 * 2);
  ASSERT_TRUE(w.add_tensor("x", DType::F16, {16}, data));
  auto bytes = w.write_to_buffer();
  ASSERT_TRUE(bytes.is_ok());
  GgufFile f = parse_ok(*bytes);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.tensors().size(), 1u);
}

TEST(GgufRoundTrip, DeferredTensorIsFilledAtWriteTime) {
  GgufWriter w;
  size_t calls = 0;
  ASSERT_TRUE(w.add_tensor_deferred("d", DType::F32, {8, 2}, [&](std::span<uint8_t> out) {
    ++calls;
    EXPECT_EQ(out.size(), 64u);
    for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(i * 3);
    return Status::ok();
  }));
  EXPECT_EQ(calls, 0u);
  auto bytes = w.write_to_buffer();
  ASSERT_TRUE(bytes.is_ok());
  EXPECT_EQ(calls, 1u);
  GgufFile f = parse_ok(*bytes);
  const GgufTensorInfo* t = f.find_tensor("d");
  ASSERT_NE(t, nullptr);
  for (size_t i = 0; i < t->nbytes; ++i) ASSERT_EQ(t->data[i], uint8_t(i * 3));
}

TEST(GgufRoundTrip, OpenFromDiskViaTmpAndRename) {
  TempPath path("open");
  GgufWriter w;
  w.set_string("general.architecture", "qwen35moe");
  const auto data = random_bytes(34 * 2, 9);  // two q8_0 blocks
  ASSERT_TRUE(w.add_tensor("blk.0.w", DType::Q8_0, {64}, data));
  ASSERT_TRUE(w.write(path.str()));
  EXPECT_FALSE(std::filesystem::exists(path.str() + ".tmp"));
  Result<GgufFile> f = GgufFile::open(path.str());
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->name(), path.str());
  EXPECT_EQ(f->architecture(), "qwen35moe");
  EXPECT_EQ(f->arch_key("block_count"), "qwen35moe.block_count");
  const GgufTensorInfo* t = f->find_tensor("blk.0.w");
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), t->data));
}

TEST(GgufRoundTrip, MissingFileIsIoError) {
  Result<GgufFile> f = GgufFile::open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.status().code(), StatusCode::kIoError);
  EXPECT_NE(f.status().message().find("/nonexistent/dir/model.gguf"), std::string::npos);
}

TEST(GgufReaderTest, HandBuiltFileParses) {
  // Independent of GgufWriter: header, 2 kvs, 2 tensors, alignment 64.
  RawGguf raw;
  raw.header(2, 2).kv_u32("general.alignment", 64).kv_string("general.architecture", "qwen3moe");
  raw.tensor("a", {32, 2}, 1, 0).tensor("b", {32}, 8, 128);
  raw.pad_to(64);
  const size_t data_start = raw.bytes.size();
  raw.zeros(128 + 34);
  raw.bytes[data_start] = 0xAB;
  raw.bytes[data_start + 128] = 0xCD;
  GgufFile f = parse_ok(raw.bytes);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset(), data_start);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].nbytes, 128u);
  EXPECT_EQ(f.tensors()[0].data[0], 0xAB);
  EXPECT_EQ(f.tensors()[1].type, DType::Q8_0);
  EXPECT_EQ(f.tensors()[1].nbytes, 34u);
  EXPECT_EQ(f.tensors()[1].offset, data_start + 128);
  EXPECT_EQ(f.tensors()[1].data[0], 0xCD);
  EXPECT_EQ(f.tensors()[1].shape_string(), "[32]");
}

TEST(GgufWriterTest, MatchesHandBuiltBytes) {
  GgufWriter w;
  w.set_string("general.architecture", "x");
  std::vector<uint8_t> data(8, 0x11);
  ASSERT_TRUE(w.add_tensor("t", DType::F32, {2}, data));
  RawGguf raw;
  raw.header(1, 1).kv_string("general.architecture", "x").tensor("t", {2}, 0, 0).pad_to(32);
  raw.bytes.insert(raw.bytes.end(), data.begin(), data.end());
  raw.pad_to(32);
  auto bytes = w.write_to_buffer();
  ASSERT_TRUE(bytes.is_ok());
  EXPECT_EQ(*bytes, raw.bytes);
}

TEST(GgufWriterTest, RejectsBadTensors) {
  GgufWriter w;
  std::vector<uint8_t> data(64);
  EXPECT_EQ(w.add_tensor("a", DType::F32, {8}, data).code(), StatusCode::kInvalidArgument);  // 32 bytes needed
  EXPECT_EQ(w.add_tensor("a", DType::F32, {}, data).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("a", DType::F32, {1, 1, 1, 2, 8}, data).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("a", DType::F32, {0, 16}, data).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("a", DType::Q8_0, {16}, data).code(), StatusCode::kInvalidArgument);  // not a block
  EXPECT_EQ(w.add_tensor(std::string(64, 'n'), DType::F32, {16}, data).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor_deferred("a", DType::F32, {16}, nullptr).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.add_tensor("a", DType::F32, {16}, data));
  const Status dup = w.add_tensor("a", DType::F32, {16}, data);
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("duplicate"), std::string::npos);
  EXPECT_EQ(w.tensor_count(), 1u);
}

TEST(GgufWriterTest, RejectsBadAlignment) {
  for (GgufValue v : {GgufValue::u32(48), GgufValue::u32(0), GgufValue::u64(64), GgufValue::u32(1u << 31)}) {
    GgufWriter w;
    w.set("general.alignment", v);
    auto bytes = w.write_to_buffer();
    ASSERT_FALSE(bytes.is_ok());
    EXPECT_NE(bytes.status().message().find("general.alignment"), std::string::npos);
  }
}

TEST(GgufWriterTest, FailedFillLeavesNoFile) {
  TempPath path("fail");
  GgufWriter w;
  ASSERT_TRUE(w.add_tensor_deferred("bad", DType::F32, {4}, [](std::span<uint8_t>) {
    return make_error(StatusCode::kIoError, "source went away");
  }));
  const Status st = w.write(path.str());
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("'bad'"), std::string::npos);
  EXPECT_NE(st.message().find("source went away"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path.str()));
  EXPECT_FALSE(std::filesystem::exists(path.str() + ".tmp"));
}

TEST(GgufWriterTest, UnwritableDirectoryIsIoError) {
  GgufWriter w;
  const Status st = w.write("/nonexistent/dir/out.gguf");
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("/nonexistent/dir/out.gguf.tmp"), std::string::npos);
}

TEST(GgufAccessors, RequireNamesFileKeyAndTypes) {
  GgufWriter w;
  w.set_string("general.name", "m");
  w.set_u32("x.count", 5);
  w.set_i32("x.neg", -1);
  w.set_u64("x.huge", std::numeric_limits<uint64_t>::max());
  w.set_f32("x.eps", 1e-6f);
  auto bytes = w.write_to_buffer();
  ASSERT_TRUE(bytes.is_ok());
  GgufFile f = parse_ok(*bytes, "model.gguf");
  EXPECT_EQ(f.require_int("x.count").value(), 5);
  EXPECT_EQ(f.require_uint("x.count").value(), 5u);
  EXPECT_EQ(f.require_string("general.name").value(), "m");
  EXPECT_FLOAT_EQ(float(f.require_float("x.eps").value()), 1e-6f);

  auto missing = f.require_int("x.missing");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "model.gguf: key 'x.missing' is missing");

  auto wrong = f.require_int("general.name");
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidFormat);
  EXPECT_EQ(wrong.status().message(), "model.gguf: key 'general.name' has type string, expected an integer");

  EXPECT_EQ(f.require_uint("x.neg").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.require_int("x.huge").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(f.require_float("x.count").status().code(), StatusCode::kInvalidFormat);
  EXPECT_EQ(f.require_bool("x.count").status().code(), StatusCode::kInvalidFormat);
  EXPECT_EQ(f.require_string_array("x.count").status().code(), StatusCode::kInvalidFormat);
  EXPECT_EQ(f.require_tensor("w").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

TEST(GgufRoundTrip, F32NanPayloadKeepsItsBits) {
  const uint32_t signaling_nan = 0x7f800001u;
  float f;
  std::memcpy(&f, &signaling_nan, sizeof f);
  GgufWriter w;
  w.set_f32("x.nan", f);
  auto bytes = w.write_to_buffer();
  ASSERT_TRUE(bytes.is_ok());
  GgufFile parsed = parse_ok(*bytes);
  const std::optional<float> back = parsed.find("x.nan")->as_f32();
  ASSERT_TRUE(back.has_value());
  uint32_t bits;
  std::memcpy(&bits, &*back, sizeof bits);
  EXPECT_EQ(bits, signaling_nan);
}

}  // namespace
}  // namespace moeserve
