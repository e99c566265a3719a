// libFuzzer target for the expert worker protocol (src/ipc, docs/IPC.md).
// The input is what a hostile or broken parent sends a worker: the worker's
// session reads it as its byte stream (a shared ring of 64 KiB is there for
// the shm transport, filled from the input's tail), computing with small
// fake experts. It must end with ok or an error, never crash, read out of
// bounds or allocate without bound, and every frame it writes back must be
// a well-formed frame. The same bytes also go through the parent's decoders
// (welcome, result head, error), which must refuse or accept without harm.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ipc/frame.h"
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
  return 0;
}
