// `moeserve bench --spec MODE`: speculative decoding measured against plain
// decoding on the same model, device and placement:
//  - the verify cost curve: one forward of 1, 2, 4, ... 64 rows after a
//    prompt, in ms and as a multiple of a one-row decode step;
//  - per prompt set (code editing, code completion, chat; or the lines of
//    --spec-prompts FILE): plain and speculative tokens/s, the speed-up,
//    the mean acceptance length, and whether the outputs are identical (they
//    must be: greedy speculation is lossless).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/model.h"
#include "runtime/speculation.h"

namespace moeserve::tools {

struct SpecBenchOptions {
  runtime::SpecConfig spec;
  runtime::DrafterFactory make_drafter;  // spec::drafter_factory(the --draft model)
  bool adaptive = true;                  // false: --spec-fixed
  int64_t n_gen = 128;       // tokens generated per prompt
  int repetitions = 1;       // timed runs of each prompt (after one warm-up)
  std::string prompts_path;  // one prompt a line (\n for a newline, \\ for a backslash); empty: the built-in sets
  bool json = false;
};

// One prompt set's result.
struct SpecBenchRow {
  std::string name;
  double plain_tok_s = 0.0, spec_tok_s = 0.0;
  double acceptance_length = 0.0, accepted_share = 0.0;
  bool identical = true;
  // Plain decoding gave the same tokens on every run. Where it does not (a
  // hybrid placement's prefill splits experts between the CPU and the GPU
  // by measured speed, and their rounding differs), "identical" cannot be judged.
  bool plain_reproducible = true;
};

struct SpecBenchResult {
  std::vector<std::pair<int64_t, double>> verify_ms;  // rows -> ms of one forward
  std::vector<SpecBenchRow> rows;
};

Result<SpecBenchResult> bench_speculative(runtime::Model& model, const SpecBenchOptions& o);
void print_spec_bench(const SpecBenchResult& r, const runtime::SpecConfig& spec);

}  // namespace moeserve::tools
