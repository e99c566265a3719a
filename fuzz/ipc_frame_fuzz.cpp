// libFuzzer target for the expert worker protocol (src/ipc, docs/IPC.md).
// The input is what a hostile or broken parent sends a worker: the worker's
// session reads it as its byte stream (a shared ring of 64 KiB is there for
// the shm transport, filled from the input's tail), computing with small
// fake experts. It must end with ok or an error, never crash, read out of
// bounds or allocate without bound, and every frame it writes back must be
// a well-formed frame. The same bytes also go through the parent's decoders
// (welcome, result head, error), which must refuse or accept without harm.
// The same bytes go to a layer shard's session too (shard_session.h; a fake
// range of layers 2:4 that checks every call it gets), and through the
// shard frames' decoders.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ipc/frame.h"
#include "ipc/shard_frames.h"
#include "ipc/shard_session.h"
#include "ipc/worker_session.h"

namespace {

using namespace moeserve;
using namespace moeserve::ipc;

class Experts final : public WorkerExperts {
 public:
  uint32_t n_layer() const override { return 3; }
  uint32_t n_expert() const override { return 8; }
  uint32_t n_embd() const override { return 8; }
  uint32_t n_ff() const override { return 16; }
  bool owns(uint32_t layer, uint32_t expert) const override { return layer < 3 && expert < 8 && expert != 5; }
  Status compute(uint32_t layer, std::span<const backend::ExpertJob> jobs) override {
    for (const backend::ExpertJob& j : jobs) {
      if (j.expert == 7) return Status(StatusCode::kInternal, "expert 7 always fails");
      for (int64_t i = 0; i < j.n_tokens * 8; ++i) j.y[i] = j.x[i] * float(j.expert + 1) + float(layer);
    }
    return Status::ok();
  }
};

class BytesChannel final : public ipc::Channel {
 public:
  BytesChannel(const uint8_t* data, size_t size) : in_(data), size_(size), ring_(64 * 1024) {
    const size_t tail = std::min(size, ring_.size());
    if (tail > 0) std::memcpy(ring_.data(), data + size - tail, tail);
  }
  Status read_exact(std::span<uint8_t> out) override {
    if (size_ - at_ < out.size()) return Status(StatusCode::kIoError, "closed");
    if (!out.empty()) std::memcpy(out.data(), in_ + at_, out.size());
    at_ += out.size();
    return Status::ok();
  }
  Status write_all(std::span<const std::span<const uint8_t>> parts) override {
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return Status::ok();
  }
  Result<std::span<uint8_t>> map_ring(uint64_t bytes) override {
    if (bytes > ring_.size()) return Status(StatusCode::kInvalidArgument, "ring too large");
    return std::span<uint8_t>(ring_.data(), size_t(bytes));
  }
  std::vector<uint8_t> out;

 private:
  const uint8_t* in_;
  size_t size_, at_ = 0;
  std::vector<uint8_t> ring_;
};

// Layers 2:4 of a 4-layer model of width 8, vocabulary 16: every call it
// gets must already have been checked against these sizes by the session.
class Layers final : public backend::RemoteLayers {
 public:
  std::string name() const override { return "fuzz"; }
  Status forward(const backend::RemoteForward& f) override {
    if (f.begin != 2 || f.end != 4 || f.hidden_in == nullptr || f.tokens.empty() || f.tokens.size() > 64)
      __builtin_trap();
    const size_t T = f.tokens.size();
    for (size_t i = 0; i < T * 8; ++i) (void)f.hidden_in[i];
    for (int64_t r : f.logit_rows) {
      if (r < 0 || size_t(r) >= T) __builtin_trap();
    }
    if (f.logits != nullptr && !f.logit_rows.empty()) std::memset(f.logits, 0, f.logit_rows.size() * 16 * sizeof(float));
    if (f.greedy != nullptr && !f.logit_rows.empty()) std::memset(f.greedy, 0, f.logit_rows.size() * sizeof(int32_t));
    if (f.captured != nullptr) std::memset(f.captured, 0, f.capture_layers.size() * T * 8 * sizeof(float));
    if (!f.tokens.empty() && f.tokens[0] == 7) return Status(StatusCode::kInternal, "token 7 always fails");
    return Status::ok();
  }
  Status open_cache(uint64_t, int64_t capacity) override {
    return capacity > 0 && capacity <= 256 ? Status::ok() : Status(StatusCode::kInternal, "capacity");
  }
  void close_cache(uint64_t) override {}
  Status truncate(uint64_t, int64_t, int64_t) override { return Status::ok(); }
  Status read_rows(uint64_t, int64_t layer, int64_t n, uint16_t* k, uint16_t* v) override {
    if (layer < 2 || layer >= 4 || n < 0 || n > 256) __builtin_trap();
    if (n > 0) std::memset(k, 0, size_t(n) * 4 * 2), std::memset(v, 0, size_t(n) * 4 * 2);
    return Status::ok();
  }
  Status write_rows(uint64_t, int64_t layer, int64_t n, const uint16_t*, const uint16_t*) override {
    if (layer < 2 || layer >= 4 || n < 0 || n > 256) __builtin_trap();
    return Status::ok();
  }
  Status read_states(uint64_t, float* s) override {
    std::memset(s, 0, 6 * sizeof(float));
    return Status::ok();
  }
  Status write_states(uint64_t, const float*) override { return Status::ok(); }
  int64_t state_floats() const override { return 6; }
  Status reserve_tree_nodes(uint64_t, int64_t n) override {
    if (n < 0 || n > 64) __builtin_trap();
    return Status::ok();
  }
  Status accept_tree(uint64_t, int64_t, std::span<const int32_t> path) override {
    if (path.empty() || path.size() > 64) __builtin_trap();
    return Status::ok();
  }
};

// Every frame the worker wrote parses, and its body is the announced size.
void check_output(const std::vector<uint8_t>& out) {
  size_t at = 0;
  while (at < out.size()) {
    if (out.size() - at < kHeaderBytes) __builtin_trap();
    auto h = decode_header(std::span(out).subspan(at, kHeaderBytes), uint64_t(1) << 31);
    if (!h.is_ok()) __builtin_trap();
    at += kHeaderBytes;
    if (out.size() - at < h->body_bytes) __builtin_trap();
    const auto body = std::span(out).subspan(at, h->body_bytes);
    if (h->type == FrameType::kError && !decode_error(body).is_ok()) __builtin_trap();
    if (h->type == FrameType::kWelcome && !decode_welcome(body).is_ok()) __builtin_trap();
    at += h->body_bytes;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Experts experts;
  SessionOptions o;
  o.experts = &experts;
  o.model_fingerprint = 0x1122334455667788ull;
  o.placement_fingerprint = 0x99;
  o.kernel_id = 2;
  o.max_rows = 64;
  o.max_jobs = 16;
  BytesChannel ch(data, size);
  (void)serve_session(ch, o);
  check_output(ch.out);

  // The parent's decoders on the same bytes.
  const std::span<const uint8_t> in(data, size);
  (void)decode_header(in, 1 << 20);
  if (size >= kResultFixedBytes) {
    (void)decode_result(in.first(kResultFixedBytes), uint32_t(size), size > 16 ? data[16] & 1u : 0u, data[0],
                        PayloadType(data[1] % 3), 8);
  }
  (void)decode_welcome(in);
  (void)decode_error(in);
  (void)decode_hello(in);
  Limits l;
  l.n_layer = 3, l.n_expert = 8, l.n_embd = 8, l.max_rows = 64, l.max_jobs = 16, l.ring_bytes = 4096;
  (void)decode_compute(in, size > 0 ? data[0] & 1u : 0u, l);

  // A layer shard's session, and its frames' decoders.
  Layers layers;
  ShardSessionOptions so;
  so.layers = &layers;
  so.model_fingerprint = 0x1122334455667788ull;
  so.limits = {.begin = 2, .end = 4, .n_layer = 4, .n_embd = 8, .n_vocab = 16, .kv_dim = 4, .state_floats = 6,
               .max_rows = 64, .max_capacity = 256};
  BytesChannel shard_ch(data, size);
  (void)serve_shard_session(shard_ch, so);
  check_output(shard_ch.out);
  (void)decode_shard_hello(in);
  (void)decode_shard_welcome(in);
  (void)decode_shard_call(in, so.limits);
  (void)decode_forward(in, so.limits);
  return 0;
}
