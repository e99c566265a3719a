#include "tools/moeserve/bench_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "runtime/generator.h"
#include "spec/drafter_factory.h"

namespace moeserve::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct PromptSet {
  std::string name;
  std::string text;
};

// Built-in prompts: an edit that copies most of its input (where n-gram
// lookup shines), a completion, and a chat question.
std::vector<PromptSet> builtin_prompts() {
  return {
      {"code-editing",
       "### utils.py\n```python\ndef load_users(path):\n    users = []\n    with open(path) as f:\n        "
       "for line in "
       "f:\n            name, age = line.strip().split(',')\n            users.append({'name': name, 'age': "
       "int(age)})\n    return users\n\n\ndef save_users(path, users):\n    with open(path, 'w') as f:\n     "
       "   for "
       "user in users:\n            f.write(f\"{user['name']},{user['age']}\\n\")\n```\n\n### utils.py with "
       "`users` renamed to `people`\n```python\ndef load_users(path):\n    people = []\n"},
      {"code-completion",
       "import numpy as np\n\n\ndef softmax(x, axis=-1):\n    \"\"\"Numerically stable softmax.\"\"\"\n    "
       "shifted = x "
       "- np.max(x, axis=axis, keepdims=True)\n    e = np.exp(shifted)\n    return e / e.sum(axis=axis, "
       "keepdims=True)\n\n\ndef log_softmax(x, axis=-1):\n"},
      {"chat", "User: What are three good habits for writing maintainable code? Answer briefly.\nAssistant:"},
  };
}

Result<std::vector<PromptSet>> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return make_error(StatusCode::kNotFound, "--spec-prompts {}: cannot open the file", path);
  std::vector<PromptSet> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::string text;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == 'n' || line[i + 1] == '\\')) {
        text += line[i + 1] == 'n' ? '\n' : '\\';
        ++i;
      } else {
        text += line[i];
      }
    }
    out.push_back({fmt::format("prompt {}", out.size() + 1), std::move(text)});
  }
  if (out.empty())
    return make_error(StatusCode::kInvalidArgument, "--spec-prompts {}: no prompt in the file", path);
  return out;
}

// One forward of n rows after a 256-token prompt, every row's greedy choice
// computed (as a verify does); the mean of 5 after 4 warm-ups. A GPU runs a
// new shape eagerly first; if that forward grew a workspace, every graph
// recorded with the old buffers is dropped and the next forward is eager
// again; then it captures the shape's graph (capture and instantiation
// cost more than the forward), and only then replays it, as a decode loop
// does. (Timing from the second forward on put a capture in the mean: +0.1
// to +0.2 ms a row count on an H200.)
Result<std::vector<std::pair<int64_t, double>>> verify_curve(runtime::Model& model) {
  const int64_t kPrompt = 256;
  runtime::Generator gen(model, kPrompt + 128);
  MOESERVE_RETURN_IF_ERROR(gen.status());
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(kPrompt);
  for (int32_t& t : prompt) t = int32_t(rng() % uint32_t(model.tokenizer().vocab_size()));
  int32_t next = 0;
  MOESERVE_RETURN_IF_ERROR(gen.prefill_greedy(prompt, 512, &next));
  std::vector<std::pair<int64_t, double>> out;
  for (int64_t rows : {1, 2, 4, 8, 16, 32, 64}) {
    std::vector<int32_t> tokens(static_cast<size_t>(rows)), greedy(static_cast<size_t>(rows));
    for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(model.tokenizer().vocab_size()));
    double total = 0.0;
    constexpr int kWarmUps = 4, kTimed = 5;
    for (int rep = -kWarmUps; rep < kTimed; ++rep) {
      const auto t0 = Clock::now();
      MOESERVE_RETURN_IF_ERROR(gen.verify(tokens, 0, nullptr, greedy.data()));
      if (rep >= 0) total += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    out.push_back({rows, total / kTimed * 1e3});
  }
  return out;
}

struct RunResult {
  std::vector<int32_t> tokens;
  bool reproducible = true;  // every run (the warm-up too) gave the same tokens
  double tok_s = 0.0;
  runtime::SpecCounters spec;
};

Result<RunResult> run_prompt(runtime::Generator& gen, const std::vector<int32_t>& prompt, int64_t n_gen,
                             runtime::Drafter* drafter, const runtime::SpecConfig& spec, int repetitions,
                             bool adaptive = true) {
  runtime::GenerateOptions go;
  go.spec_adaptive = adaptive;
  go.max_tokens = n_gen;
  go.sampling.temperature = 0.0f;
  go.stop_at_eos = false;  // the same number of tokens every run
  go.drafter = drafter;
  go.spec = spec;
  RunResult out;
  double tokens = 0.0, seconds = 0.0;
  for (int rep = -1; rep < repetitions; ++rep) {
    MOESERVE_ASSIGN_OR_RETURN(runtime::GenerateResult r, gen.generate(prompt, go));
    if (rep > -1 && r.tokens != out.tokens) out.reproducible = false;
    out.tokens = r.tokens;
    if (rep < 0) continue;
    // Decode alone (the first token comes from prefill, the same either way).
    tokens += double(r.tokens.size() > 0 ? r.tokens.size() - 1 : 0);
    seconds += r.decode_seconds;
    out.spec += r.spec;
  }
  out.tok_s = seconds > 0.0 ? tokens / seconds : 0.0;
  return out;
}

}  // namespace

Result<SpecBenchResult> bench_speculative(runtime::Model& model, const SpecBenchOptions& o) {
  SpecBenchResult result;
  MOESERVE_ASSIGN_OR_RETURN(result.verify_ms, verify_curve(model));
  std::vector<PromptSet> sets = builtin_prompts();
  if (!o.prompts_path.empty()) {
    MOESERVE_ASSIGN_OR_RETURN(sets, read_prompts(o.prompts_path));
  }
  std::unique_ptr<runtime::Drafter> drafter = o.make_drafter ? o.make_drafter(o.spec) : nullptr;
  if (drafter == nullptr) {
    return make_error(StatusCode::kUnsupported, "bench --spec {}: no drafter for this mode",
                      runtime::spec_mode_name(o.spec.mode));
  }
  for (const PromptSet& set : sets) {
    const std::vector<int32_t> prompt = model.tokenizer().encode(set.text);
    if (prompt.empty()) continue;
    runtime::Generator gen(model, int64_t(prompt.size()) + o.n_gen + 1);
    MOESERVE_RETURN_IF_ERROR(gen.status());
    MOESERVE_ASSIGN_OR_RETURN(RunResult plain, run_prompt(gen, prompt, o.n_gen, nullptr, {}, o.repetitions));
    MOESERVE_ASSIGN_OR_RETURN(
        RunResult fast, run_prompt(gen, prompt, o.n_gen, drafter.get(), o.spec, o.repetitions, o.adaptive));
    SpecBenchRow row;
    row.name = set.name;
    row.plain_tok_s = plain.tok_s;
    row.spec_tok_s = fast.tok_s;
    row.acceptance_length = fast.spec.mean_acceptance_length();
    row.accepted_share = fast.spec.drafted > 0 ? double(fast.spec.accepted) / double(fast.spec.drafted) : 0.0;
    // Plain once more: a hybrid placement's prefill splits experts between
    // the CPU and the GPU by speed measured as it runs, and the two round
    // differently, so plain decoding itself may change between runs.
    MOESERVE_ASSIGN_OR_RETURN(RunResult again, run_prompt(gen, prompt, o.n_gen, nullptr, {}, 0));
    row.identical = plain.tokens == fast.tokens || again.tokens == fast.tokens;
    row.plain_reproducible = plain.reproducible && again.tokens == plain.tokens;
    result.rows.push_back(row);
  }
  return result;
}

void print_spec_bench(const SpecBenchResult& r, const runtime::SpecConfig& spec) {
  const double one = r.verify_ms.empty() ? 0.0 : r.verify_ms.front().second;
  fmt::print("\nverify cost (one forward of n rows after a 256-token prompt):\n| rows |");
  for (const auto& [rows, ms] : r.verify_ms) fmt::print(" {} |", rows);
  fmt::print("\n|---|");
  for (size_t i = 0; i < r.verify_ms.size(); ++i) fmt::print("---:|");
  fmt::print("\n| ms |");
  for (const auto& [rows, ms] : r.verify_ms) fmt::print(" {:.2f} |", ms);
  fmt::print("\n| x decode step |");
  for (const auto& [rows, ms] : r.verify_ms) fmt::print(" {:.2f} |", one > 0 ? ms / one : 0.0);
  fmt::print("\n\nspeculative decoding ({}, up to {} tokens a step), greedy:\n",
             runtime::spec_mode_name(spec.mode), spec.max_draft);
  fmt::print(
      "| prompt | plain tok/s | speculative tok/s | speed-up | acceptance length | drafts kept | identical "
      "|\n");
  fmt::print("|---|---:|---:|---:|---:|---:|---|\n");
  for (const SpecBenchRow& row : r.rows) {
    fmt::print("| {} | {:.1f} | {:.1f} | {:.2f}x | {:.2f} | {:.0f}% | {} |\n", row.name, row.plain_tok_s,
               row.spec_tok_s, row.plain_tok_s > 0 ? row.spec_tok_s / row.plain_tok_s : 0.0,
               row.acceptance_length, 100.0 * row.accepted_share, row.identical ? "yes" : "NO");
  }
}

}  // namespace moeserve::tools
