#include "tools/moeserve/bench_hybrid.h"

#include <fmt/format.h>

#include <algorithm>

#include "moe/moe_shape.h"

namespace moeserve::tools {

void HybridHits::start() {
  const auto& splits = model_.expert_splits();
  if (splits.empty()) return;
  for (auto* v : {&local_, &host_, &copied_, &cold_, &local0_, &host0_, &copied0_, &cold0_})
    v->resize(splits.size());
  for (size_t l = 0; l < splits.size(); ++l) {
    local0_[l] = splits[l] ? splits[l]->local_pairs.load() : 0;
    host0_[l] = splits[l] ? splits[l]->host_pairs.load() : 0;
    copied0_[l] = splits[l] ? splits[l]->copied_pairs.load() : 0;
    cold0_[l] = splits[l] ? splits[l]->cold_experts_seen.load() : 0;
  }
}

void HybridHits::stop() {
  const auto& splits = model_.expert_splits();
  for (size_t l = 0; l < local_.size(); ++l) {
    local_[l] += (splits[l] ? splits[l]->local_pairs.load() : 0) - local0_[l];
    host_[l] += (splits[l] ? splits[l]->host_pairs.load() : 0) - host0_[l];
    copied_[l] += (splits[l] ? splits[l]->copied_pairs.load() : 0) - copied0_[l];
    cold_[l] += (splits[l] ? splits[l]->cold_experts_seen.load() : 0) - cold0_[l];
  }
}

void HybridHits::print_prefill(double pp_tok_s, int64_t n_prompt, int runs) const {
  if (local_.empty()) return;
  int64_t local = 0, host = 0, copied = 0;
  for (size_t l = 0; l < local_.size(); ++l) local += local_[l], host += host_[l], copied += copied_[l];
  fmt::print(
      "prefill experts: hot-hit {:.1f}% of the selections of split layers; of the cold ones {:.1f}% computed "
      "on "
      "the GPU after copying their weights, the rest on the CPU\n",
      100.0 * double(local) / double(std::max<int64_t>(local + host, 1)),
      100.0 * double(copied) / double(std::max<int64_t>(host, 1)));
  // The copy bound: every distinct cold expert a prompt selected, copied.
  Result<moe::MoeShape> shape = moe::moe_shape(model_.file());
  const auto& splits = model_.expert_splits();
  double bytes = 0.0, pcie = 0.0;
  for (size_t l = 0; shape.is_ok() && l < cold_.size() && l < shape->expert_bytes.size(); ++l) {
    bytes += double(cold_[l]) * double(shape->expert_bytes[l]);
    if (splits[l] != nullptr && splits[l]->cost() != nullptr)
      pcie = std::max(pcie, splits[l]->cost()->inputs().pcie_bytes_per_s);
  }
  if (runs <= 0 || bytes <= 0.0 || pcie <= 0.0 || n_prompt <= 0) return;
  bytes /= double(runs);
  const double bound = double(n_prompt) / (bytes / pcie);
  fmt::print(
      "hybrid prefill copy bound: {:.2f} GB of cold experts selected a prompt, {:.1f} ms at {:.1f} GB/s -> "
      "{:.0f} "
      "tok/s if all were copied; pp is {:.1f}% of it (the CPU computed {:.1f}% of the cold selections)\n",
      bytes / 1e9, 1e3 * bytes / pcie, pcie / 1e9, bound, 100.0 * pp_tok_s / bound,
      100.0 - 100.0 * double(copied) / double(std::max<int64_t>(host, 1)));
}

void HybridHits::print(double hbm_gb_s, double dram_gb_s, double tg_tok_s) const {
  if (local_.empty()) return;
  Result<moe::MoeShape> shape = moe::moe_shape(model_.file());
  if (!shape.is_ok()) return;
  const auto& splits = model_.expert_splits();
  const double K = double(shape->n_expert_used);
  // Tokens decoded: a layer counted by its splits saw K selections a token.
  int64_t tokens = 0;
  for (size_t l = 0; l < local_.size(); ++l)
    tokens = std::max<int64_t>(tokens, (local_[l] + host_[l]) / int64_t(K));
  if (tokens == 0) return;
  double gpu_expert = 0.0, cpu_expert = 0.0, all_expert = 0.0;
  int64_t hits = 0, misses = 0;
  for (size_t l = 0; l < splits.size(); ++l) {
    const double eb = double(shape->expert_bytes[l]);
    all_expert += K * eb;
    if (splits[l] == nullptr || splits[l]->all_local()) {
      gpu_expert += K * eb;
      hits += int64_t(K) * tokens;
      continue;
    }
    gpu_expert += double(local_[l]) / double(tokens) * eb;
    cpu_expert += double(host_[l]) / double(tokens) * eb;
    hits += local_[l], misses += host_[l];
  }
  const double dense = std::max(0.0, double(model_.info().active_bytes_per_token) - all_expert);
  const double gpu_gb = (dense + gpu_expert) / 1e9, cpu_gb = cpu_expert / 1e9;
  int64_t copied = 0;
  for (int64_t c : copied_) copied += c;
  fmt::print(
      "experts: hot-hit {:.1f}% of the decode selections ({} on the GPU, {} cold over {} tokens, {} of those "
      "copied to the GPU)\n",
      100.0 * double(hits) / double(std::max<int64_t>(hits + misses, 1)), hits, misses, tokens, copied);
  if (hbm_gb_s <= 0.0 || dram_gb_s <= 0.0) return;
  const double roof = 1.0 / std::max(gpu_gb / hbm_gb_s, cpu_gb / dram_gb_s);
  fmt::print(
      "hybrid decode roofline: GPU {:.3f} GB/token at {:.0f} GB/s, CPU {:.3f} GB/token at {:.1f} GB/s (the "
      "better of the reads before and after the runs): "
      "max -> {:.0f} tok/s{}",
      gpu_gb, hbm_gb_s, cpu_gb, dram_gb_s, roof, tg_tok_s > 0.0 ? "" : "\n");
  if (tg_tok_s > 0.0) fmt::print(", tg is {:.1f}% of it\n", 100.0 * tg_tok_s / roof);
}

}  // namespace moeserve::tools
