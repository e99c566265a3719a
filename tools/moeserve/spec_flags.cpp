#include "tools/moeserve/spec_flags.h"

#include <fmt/format.h>

namespace moeserve::tools {

void add_spec_flags(CLI::App* cmd, SpecCliOptions* o) {
  cmd->add_option(
         "--spec", o->mode,
         "Speculative decoding: none; ngram (drafts copied from the prompt and the text so far: code "
         "edits, quoting); auto (today n-gram drafts too); dflash (a draft model, --draft; not "
         "implemented yet). Output is the same as without; drafting stops by itself when it "
         "would be slower")
      ->capture_default_str();
  cmd->add_option("--spec-max", o->max_draft, "Tokens drafted per step at most, along one path (1..63)")
      ->capture_default_str();
  cmd->add_option("--spec-tree", o->tree_nodes,
                  "Draft-tree node budget (0: a chain; 1..63: several continuations verified at once)")
      ->capture_default_str();
  cmd->add_option("--spec-ngram-min", o->ngram_min, "n-gram drafts: the shortest suffix that may match")
      ->capture_default_str();
  cmd->add_option("--spec-ngram-max", o->ngram_max, "n-gram drafts: the longest suffix, tried first")
      ->capture_default_str();
  cmd->add_option("--draft", o->draft_path, "Draft model for --spec dflash (safetensors directory or GGUF)");
}

Result<runtime::SpecConfig> resolve_spec_flags(const SpecCliOptions& o) {
  runtime::SpecConfig c;
  MOESERVE_ASSIGN_OR_RETURN(c.mode, runtime::parse_spec_mode(o.mode));
  c.max_draft = o.max_draft;
  c.tree_nodes = o.tree_nodes;
  c.ngram_min = o.ngram_min;
  c.ngram_max = o.ngram_max;
  if (c.mode == runtime::SpecMode::kDflash && o.draft_path.empty()) {
    return make_error(StatusCode::kInvalidArgument, "--spec dflash needs a draft model: add --draft FILE");
  }
  if (!o.draft_path.empty() && c.mode != runtime::SpecMode::kDflash && c.mode != runtime::SpecMode::kAuto) {
    return make_error(StatusCode::kInvalidArgument, "--draft is for --spec dflash or auto, not --spec {}",
                      o.mode);
  }
  if (!o.draft_path.empty()) {
    return make_error(StatusCode::kUnsupported,
                      "--draft {}: DFlash draft models are not implemented yet; use --spec ngram or auto",
                      o.draft_path);
  }
  MOESERVE_RETURN_IF_ERROR(runtime::validate_spec_config(c));
  return c;
}

std::string spec_summary_line(runtime::SpecMode mode, const runtime::SpecCounters& c) {
  const double rate = c.drafted > 0 ? 100.0 * double(c.accepted) / double(c.drafted) : 0.0;
  return fmt::format(
      "speculative ({}): {} steps with a draft, {} drafted, {} accepted ({:.1f}%), mean acceptance length "
      "{:.2f} "
      "tokens a step, {} rollbacks | draft {:.1f} ms, verify {:.1f} ms",
      runtime::spec_mode_name(mode), c.steps, c.drafted, c.accepted, rate, c.mean_acceptance_length(),
      c.replays, c.draft_seconds * 1e3, c.verify_seconds * 1e3);
}

}  // namespace moeserve::tools
