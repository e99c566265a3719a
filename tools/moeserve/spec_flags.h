// The speculative decoding flags shared by generate, bench and serve:
// --spec none|ngram|dflash|auto, --spec-max N, --spec-tree N,
// --spec-ngram-min N, --spec-ngram-max N, --draft FILE.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/status.h"
#include "models/language_model.h"
#include "runtime/speculation.h"
#include "spec/dflash_drafter.h"

namespace moeserve::tools {

struct SpecCliOptions {
  std::string mode = "none";
  int max_draft = 8;
  int tree_nodes = 0;
  int ngram_min = 2, ngram_max = 4;
  std::string draft_path;
  std::string draft_device;  // --device-draft: where the DFlash draft computes (empty: the target's)
  bool fixed = false;  // --spec-fixed: no adaptive policy (measurements)
};

void add_spec_flags(CLI::App* cmd, SpecCliOptions* o);
// The flags as a checked configuration; an error names the flag and what
// to do (call before loading anything, so a bad flag starts nothing).
Result<runtime::SpecConfig> resolve_spec_flags(const SpecCliOptions& o);
// The --draft file exists and is a DFlash draft (checked before the target loads).
Status check_draft_file(const std::string& path);
// The --draft model for `target` (null without --draft): loaded here, or
// in a draft process (--device-draft proc:DEVICE) started with the target
// file `target_path`; errors name the flag.
Result<std::shared_ptr<runtime::DraftSource>> load_draft_model(const SpecCliOptions& o,
                                                               const models::LanguageModel& target,
                                                               const std::string& target_path);
// "speculative (ngram): 42 steps, 120 drafted, 80 accepted (66.7%), mean
// acceptance length 2.90 tokens a step | draft 0.3 ms, verify 812 ms".
std::string spec_summary_line(runtime::SpecMode mode, const runtime::SpecCounters& c);

}  // namespace moeserve::tools
