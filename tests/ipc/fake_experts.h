// Test doubles for the worker's side: experts whose output is a simple
// function of the input (y = (expert + 1) * x + layer), and a channel over
// memory (what the parent "sent" is a byte string, what the worker wrote is
// collected), so the protocol loop runs without a socket or a model.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "ipc/worker_session.h"

namespace moeserve::ipc::testing {

class FakeExperts final : public WorkerExperts {
 public:
  FakeExperts(uint32_t n_layer, uint32_t n_expert, uint32_t n_embd, std::vector<uint32_t> not_owned = {})
      : n_layer_(n_layer), n_expert_(n_expert), n_embd_(n_embd), not_owned_(std::move(not_owned)) {}
  uint32_t n_layer() const override { return n_layer_; }
  uint32_t n_expert() const override { return n_expert_; }
  uint32_t n_embd() const override { return n_embd_; }
  uint32_t n_ff() const override { return 2 * n_embd_; }
  bool owns(uint32_t layer, uint32_t expert) const override {
    return layer < n_layer_ && expert < n_expert_ &&
           std::find(not_owned_.begin(), not_owned_.end(), expert) == not_owned_.end();
  }
  Status compute(uint32_t layer, std::span<const backend::ExpertJob> jobs) override {
    for (const backend::ExpertJob& j : jobs) {
      for (int64_t i = 0; i < j.n_tokens * int64_t(n_embd_); ++i) j.y[i] = expected(layer, j.expert, j.x[i]);
    }
    calls += 1;
    return Status::ok();
  }
  static float expected(uint32_t layer, int32_t expert, float x) {
    return float(expert + 1) * x + float(layer);
  }
  int calls = 0;

 private:
  uint32_t n_layer_, n_expert_, n_embd_;
  std::vector<uint32_t> not_owned_;
};

class MemoryChannel final : public Channel {
 public:
  explicit MemoryChannel(std::vector<uint8_t> in, size_t ring_bytes = 0)
      : in_(std::move(in)), ring_(ring_bytes) {}
  Status read_exact(std::span<uint8_t> out) override {
    if (in_.size() - at_ < out.size()) {
      at_ = in_.size();
      return Status(StatusCode::kIoError, "the peer closed the connection");
    }
    if (!out.empty()) std::memcpy(out.data(), in_.data() + at_, out.size());
    at_ += out.size();
    return Status::ok();
  }
  Status write_all(std::span<const std::span<const uint8_t>> parts) override {
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return Status::ok();
  }
  Result<std::span<uint8_t>> map_ring(uint64_t bytes) override {
    if (bytes > ring_.size()) return Status(StatusCode::kInvalidArgument, "no ring that large");
    return std::span<uint8_t>(ring_.data(), size_t(bytes));
  }
  std::vector<uint8_t> out;
  std::vector<uint8_t>& ring() { return ring_; }

 private:
  std::vector<uint8_t> in_;
  size_t at_ = 0;
  std::vector<uint8_t> ring_;
};

}  // namespace moeserve::ipc::testing
