// The engine as the parity tests drive it: a GGUF's network (any
// architecture of the registry) on one device
// (the CPU, or a GPU), its tokenizer, one sequence's f16 KV cache on that
// device and a workspace; prefill in chunks, decode one token at a time.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_device.h"
#include "backend/devices.h"
#include "format/gguf.h"
#include "models/registry.h"
#include "runtime/kv_cache.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab_gguf.h"

namespace moeserve::models::parity {

inline constexpr int64_t kParityContext = 320;  // longest prompt (224) + 64 generated tokens, with room

struct Engine {
  GgufFile file;
  std::unique_ptr<backend::Device> device;  // owns the weight copies (packed or uploaded)
  std::unique_ptr<LanguageModel> net;
  std::unique_ptr<Workspace> ws;
  std::unique_ptr<tok::Tokenizer> tokenizer;
  runtime::KvCache kv;

  // On the CPU (pack: re-lay-out the weights for this CPU's packed kernels,
  // as runtime::Model does by default; a no-op where the CPU has none), or
  // on `gpu` when it is given.
  static std::unique_ptr<Engine> load(const std::string& path, ThreadPool* pool, bool pack = false,
                                      std::unique_ptr<backend::Device> gpu = nullptr) {
    auto file = GgufFile::open(path);
    EXPECT_TRUE(file.is_ok()) << path << ": " << file.status().to_string();
    if (!file.is_ok()) return nullptr;
    auto e = std::unique_ptr<Engine>(new Engine{std::move(file).value(), nullptr, nullptr, nullptr, nullptr, {}});
    auto vocab = tok::vocab_from_gguf(e->file);
    EXPECT_TRUE(vocab.is_ok()) << vocab.status().to_string();
    if (!vocab.is_ok()) return nullptr;
    auto tk = tok::Tokenizer::create(std::move(vocab).value());
    EXPECT_TRUE(tk.is_ok()) << tk.status().to_string();
    if (!tk.is_ok()) return nullptr;
    e->tokenizer = std::move(tk).value();
    if (gpu != nullptr) {
      e->device = std::move(gpu);
    } else {
      e->device = std::make_unique<backend::CpuDevice>(backend::CpuDeviceOptions{.pool = pool, .pack_weights = pack});
    }
    const Placement placement{.io = e->device.get(), .layers = {}};
    auto net = create_model(e->file, placement);  // the architecture from the registry
    EXPECT_TRUE(net.is_ok()) << net.status().to_string();
    if (!net.is_ok()) return nullptr;
    e->net = std::move(net).value();
    auto kv = runtime::KvCache::allocate(placement, e->net->info(), kParityContext);
    EXPECT_TRUE(kv.is_ok()) << kv.status().to_string();
    if (!kv.is_ok()) return nullptr;
    e->kv = std::move(kv).value();
    e->ws = e->net->create_workspace(1).value();
    return e;
  }

  int64_t n_vocab() const { return net->info().n_vocab; }

  // Runs tokens at positions pos0.. in chunks of n_batch; returns the logits
  // of every token ([n][n_vocab]).
  // pos0 == 0 starts the sequence over (a recurrent model's states too).
  std::vector<float> forward(std::span<const int32_t> tokens, int64_t pos0, size_t n_batch) {
    if (pos0 == 0) kv.clear();
    const size_t V = size_t(n_vocab());
    std::vector<float> logits(tokens.size() * V);
    for (size_t start = 0; start < tokens.size(); start += n_batch) {
      const size_t n = std::min(n_batch, tokens.size() - start);
      std::vector<int64_t> rows(n);
      std::iota(rows.begin(), rows.end(), 0);
      ForwardBatch b;
      b.tokens = tokens.subspan(start, n);
      b.pos0 = pos0 + int64_t(start);
      b.kv = kv.view();
      b.logit_rows = rows;
      b.logits = logits.data() + start * V;
      const Status st = net->forward(b, *ws);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
    }
    return logits;
  }
};

// The first CUDA GPU, or null (with the reason) when this build or machine has none.
inline std::unique_ptr<backend::Device> open_test_gpu(std::string* why) {
  auto choice = backend::choose_device("auto");
  if (!choice.is_ok() || choice->spec.kind != backend::DeviceKind::kCuda) {
    *why = choice.is_ok() ? choice->reason : choice.status().to_string();
    return nullptr;
  }
  auto d = backend::open_cuda_device(choice->spec.index);
  if (!d.is_ok()) {
    *why = d.status().to_string();
    return nullptr;
  }
  return std::move(d).value();
}

}  // namespace moeserve::models::parity
