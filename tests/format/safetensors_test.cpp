#include "format/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace moeserve {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::vector<SafetensorsWriteTensor> sample_tensors() {
  return {
      {"a.weight", DType::F32, {2, 3}, bytes_of({1, 2, 3, 4, 5, 6})},
      {"b.bias", DType::F16, {4}, std::vector<uint8_t>{0x00, 0x3c, 0x00, 0x40, 0x00, 0xc0, 0x00, 0x00}},
      {"c", DType::BF16, {1, 2}, std::vector<uint8_t>{0x80, 0x3f, 0x00, 0x40}},
  };
}

std::vector<uint8_t> sample_file() {
  auto bytes = write_safetensors(sample_tensors(), {{"format", "pt"}});
  EXPECT_TRUE(bytes.is_ok());
  return bytes.value();
}

// A file from a raw header text and `data_bytes` zero bytes of data.
std::vector<uint8_t> raw_file(const std::string& header, size_t data_bytes, uint64_t header_len_override = 0) {
  const uint64_t len = header_len_override ? header_len_override : header.size();
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(len >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

Result<SafetensorsFile> parse(const std::vector<uint8_t>& bytes) { return SafetensorsFile::parse_bytes(bytes, "t.safetensors"); }

TEST(Safetensors, RoundTripsWrittenTensors) {
  const std::vector<uint8_t> bytes = sample_file();
  auto file = parse(bytes);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  ASSERT_EQ(file->tensors().size(), 3u);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  for (const SafetensorsWriteTensor& want : sample_tensors()) {
    const SafetensorsTensor* got = file->find(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->type, want.type);
    EXPECT_EQ(got->shape, want.shape);
    ASSERT_EQ(got->nbytes, want.data.size());
    EXPECT_EQ(std::memcmp(got->data, want.data.data(), got->nbytes), 0);
  }
  EXPECT_EQ(file->find("a.weight")->shape_string(), "[2, 3]");
  EXPECT_EQ(file->find("nope"), nullptr);
  // Tensors come back in data order.
  EXPECT_EQ(file->tensors()[0].name, "a.weight");
  EXPECT_EQ(file->tensors()[2].name, "c");
}

TEST(Safetensors, EveryTruncationFailsCleanly) {
  const std::vector<uint8_t> bytes = sample_file();
  for (size_t len = 0; len < bytes.size(); ++len) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + long(len));
    auto file = parse(cut);
    EXPECT_FALSE(file.is_ok()) << "length " << len;
  }
  EXPECT_TRUE(parse(bytes).is_ok());
}

struct HostileCase {
  const char* what;
  std::vector<uint8_t> bytes;
  StatusCode code;
  const char* message_part;
};

TEST(Safetensors, HostileHeadersGiveClearErrors) {
  const std::string ok_entry = R"("w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  const std::vector<HostileCase> cases = {
      {"absurd header length", raw_file("{}", 0, uint64_t(1) << 62), StatusCode::kInvalidFormat, "byte limit"},
      {"header past EOF", raw_file("{}", 0, 100), StatusCode::kInvalidFormat, "past the end"},
      {"invalid json", raw_file("{\"w\": ", 8), StatusCode::kInvalidFormat, "not valid JSON"},
      {"not an object", raw_file("[1, 2]", 8), StatusCode::kInvalidFormat, "not a JSON object"},
      {"offsets outside", raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4),
       StatusCode::kInvalidFormat, "run past the data area"},
      {"size mismatch", raw_file(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 16),
       StatusCode::kInvalidFormat, "needs 12"},
      {"overlap", raw_file("{" + ok_entry + R"(, "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 16),
       StatusCode::kInvalidFormat, "overlaps"},
      {"duplicate", raw_file("{" + ok_entry + ", " + ok_entry + "}", 8), StatusCode::kInvalidFormat, "appears twice"},
      {"negative dim", raw_file(R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8),
       StatusCode::kInvalidFormat, "not a non-negative integer"},
      {"float dim", raw_file(R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})", 8),
       StatusCode::kInvalidFormat, "not a non-negative integer"},
      {"overflow", raw_file(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", 8),
       StatusCode::kInvalidFormat, "overflows"},
      {"huge offsets", raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [18446744073709551615, 8]}})", 8),
       StatusCode::kInvalidFormat, "non-negative integers"},
      {"reversed offsets", raw_file(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}})", 8),
       StatusCode::kInvalidFormat, "end before"},
      {"unsupported dtype", raw_file(R"({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8),
       StatusCode::kUnsupported, "tensor 'w': dtype I64 is not supported"},
      {"unknown dtype", raw_file(R"({"w": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 8]}})", 8),
       StatusCode::kInvalidFormat, "unknown dtype 'Q9'"},
      {"missing shape", raw_file(R"({"w": {"dtype": "F32", "data_offsets": [0, 8]}})", 8), StatusCode::kInvalidFormat,
       "'shape'"},
      {"bad offsets", raw_file(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", 8),
       StatusCode::kInvalidFormat, "data_offsets"},
      {"entry not object", raw_file(R"({"w": 5})", 8), StatusCode::kInvalidFormat, "not an object"},
      {"metadata value", raw_file(R"({"__metadata__": {"k": 1}})", 0), StatusCode::kInvalidFormat, "not a string"},
      {"deep nesting", raw_file(std::string(10000, '[') + std::string(10000, ']'), 0), StatusCode::kInvalidFormat,
       "nests deeper"},
      {"too short", std::vector<uint8_t>{1, 2, 3}, StatusCode::kInvalidFormat, "too short"},
  };
  for (const HostileCase& c : cases) {
    auto file = parse(c.bytes);
    ASSERT_FALSE(file.is_ok()) << c.what;
    EXPECT_EQ(file.status().code(), c.code) << c.what << ": " << file.status().to_string();
    EXPECT_NE(file.status().message().find(c.message_part), std::string::npos) << c.what << ": " << file.status().to_string();
    EXPECT_NE(file.status().message().find("t.safetensors"), std::string::npos) << c.what;
  }
}

TEST(Safetensors, AcceptsZeroSizedTensorsAndEmptyHeader) {
  EXPECT_TRUE(parse(raw_file("{}", 0)).is_ok());
  auto file = parse(raw_file(R"({"e": {"dtype": "BF16", "shape": [0, 4], "data_offsets": [0, 0]}})", 0));
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ(file->find("e")->n_elements(), 0);
}

class SafetensorsDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moeserve_st_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::vector<SafetensorsWriteTensor>& tensors) {
    auto bytes = write_safetensors(tensors);
    ASSERT_TRUE(bytes.is_ok());
    std::ofstream(dir_ / name, std::ios::binary).write(reinterpret_cast<const char*>(bytes->data()), long(bytes->size()));
  }
  void write_text(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  fs::path dir_;
};

SafetensorsWriteTensor f32_tensor(std::string name, float v) { return {std::move(name), DType::F32, {1}, bytes_of({v})}; }

TEST_F(SafetensorsDir, ReadsAnIndexedModel) {
  write("part-1.safetensors", {f32_tensor("x", 1)});
  write("part-2.safetensors", {f32_tensor("y", 2), f32_tensor("z", 3)});
  write_text("model.safetensors.index.json",
             R"({"metadata": {}, "weight_map": {"x": "part-1.safetensors", "y": "part-2.safetensors", "z": "part-2.safetensors"}})");
  auto model = SafetensorsModel::open_dir(dir_.string());
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  EXPECT_EQ(model->tensor_count(), 3u);
  ASSERT_NE(model->find("z"), nullptr);
  float z;
  std::memcpy(&z, model->find("z")->data, 4);
  EXPECT_EQ(z, 3.0f);
  EXPECT_NE(model->find("z")->file.find("part-2"), std::string::npos);
}

TEST_F(SafetensorsDir, IndexErrorsNameTheTensor) {
  write("part-1.safetensors", {f32_tensor("x", 1), f32_tensor("extra", 1)});
  write_text("model.safetensors.index.json", R"({"weight_map": {"x": "part-1.safetensors"}})");
  auto model = SafetensorsModel::open_dir(dir_.string());
  ASSERT_FALSE(model.is_ok());
  EXPECT_NE(model.status().message().find("'extra'"), std::string::npos) << model.status().to_string();

  write_text("model.safetensors.index.json", R"({"weight_map": {"x": "part-1.safetensors", "extra": "part-1.safetensors", "gone": "part-1.safetensors"}})");
  model = SafetensorsModel::open_dir(dir_.string());
  ASSERT_FALSE(model.is_ok());
  EXPECT_NE(model.status().message().find("'gone'"), std::string::npos) << model.status().to_string();

  write_text("model.safetensors.index.json", R"({"weight_map": {"x": "../evil.safetensors"}})");
  model = SafetensorsModel::open_dir(dir_.string());
  ASSERT_FALSE(model.is_ok());
  EXPECT_NE(model.status().message().find("not a file name"), std::string::npos) << model.status().to_string();
}

TEST_F(SafetensorsDir, ReadsSingleOrSeveralFilesWithoutIndex) {
  write("a.safetensors", {f32_tensor("x", 1)});
  write("b.safetensors", {f32_tensor("y", 2)});
  auto model = SafetensorsModel::open_dir(dir_.string());
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  EXPECT_EQ(model->tensor_count(), 2u);
  EXPECT_EQ(model->all_tensors().size(), 2u);

  write("model.safetensors", {f32_tensor("only", 1)});  // preferred over the others
  model = SafetensorsModel::open_dir(dir_.string());
  ASSERT_TRUE(model.is_ok());
  EXPECT_EQ(model->tensor_count(), 1u);
  EXPECT_NE(model->find("only"), nullptr);
}

TEST_F(SafetensorsDir, DuplicateAcrossFilesAndEmptyDirAreErrors) {
  EXPECT_EQ(SafetensorsModel::open_dir(dir_.string()).status().code(), StatusCode::kNotFound);
  write("a.safetensors", {f32_tensor("x", 1)});
  write("b.safetensors", {f32_tensor("x", 2)});
  auto model = SafetensorsModel::open_dir(dir_.string());
  ASSERT_FALSE(model.is_ok());
  EXPECT_NE(model.status().message().find("'x' is also in"), std::string::npos) << model.status().to_string();
}

}  // namespace
}  // namespace moeserve
