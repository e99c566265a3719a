// Helpers the per-architecture forward tests share: a make-model tiny file
// (f32, optionally edited), loading it, random tokens, running a sequence in
// chunks and comparing logits.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "convert/make_model.h"
#include "runtime/model.h"
#include "temp_dir.h"

namespace moeserve::testing {

inline std::string tiny_model_path(convert::ModelArch arch, const std::function<void(GgufWriter&)>& edit = {},
                                   convert::FileType type = convert::FileType::kF32) {
  namespace fs = std::filesystem;
  const fs::path dir =
      process_temp_dir("forward_test");  // a copy: GCC 13 takes the reference for a dangling one
  static int counter = 0;
  const std::string path =
      (dir / (std::string(convert::arch_name(arch)) + std::to_string(counter++) + ".gguf")).string();
  convert::MakeModelOptions o;
  o.shape = convert::model_preset(arch, "tiny").value();
  o.file_type = type;
  o.seed = 7;
  o.n_threads = 2;
  GgufWriter w;
  EXPECT_TRUE(convert::add_synthetic_model(o, w).is_ok());
  if (edit) edit(w);
  EXPECT_TRUE(w.write(path).is_ok());
  return path;
}

inline std::unique_ptr<runtime::Model> load_model(const std::string& path,
                                                  const std::string& device = "cpu") {
  runtime::ModelLoadOptions o;
  o.n_threads = 2;
  o.device = device;
  Result<std::unique_ptr<runtime::Model>> m = runtime::Model::load(path, o);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m.is_ok() ? std::move(m).value() : nullptr;
}

inline std::vector<int32_t> random_tokens(int64_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = int32_t(rng() % uint32_t(n_vocab));
  return t;
}

// Logits of every row of `tokens` fed in chunks of `chunk` (one sequence).
inline std::vector<float> run_chunks(runtime::Model& m, std::span<const int32_t> tokens, int64_t chunk,
                                     runtime::KvCache& kv, int64_t pos0 = 0) {
  const int64_t V = m.info().n_vocab;
  std::vector<float> out(tokens.size() * size_t(V));
  auto ws = m.new_workspace(chunk).value();
  for (size_t s = 0; s < tokens.size(); s += size_t(chunk)) {
    const auto part = tokens.subspan(s, std::min(tokens.size() - s, size_t(chunk)));
    std::vector<int64_t> rows(part.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = int64_t(i);
    models::ForwardBatch b;
    b.tokens = part;
    b.pos0 = pos0 + int64_t(s);
    b.kv = kv.view();
    b.logit_rows = rows;
    b.logits = out.data() + s * size_t(V);
    Status st = m.net().forward(b, *ws);
    EXPECT_TRUE(st.is_ok()) << st.message();
    kv.set_used(pos0 + int64_t(s + part.size()));
  }
  return out;
}

inline double max_abs(std::span<const float> a) {
  double m = 0;
  for (float x : a) m = std::max(m, double(std::fabs(x)));
  return m;
}

// max |a - b| / max |a|.
inline double rel_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d / std::max(max_abs(a), 1e-30);
}

}  // namespace moeserve::testing
