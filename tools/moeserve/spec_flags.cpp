#include "tools/moeserve/spec_flags.h"

#include <fmt/format.h>

#include <filesystem>

#include "backend/devices.h"
#include "core/log.h"
#include "format/gguf.h"
#include "models/dflash_weights.h"

namespace moeserve::tools {

void add_spec_flags(CLI::App* cmd, SpecCliOptions* o) {
  cmd->add_option(
         "--spec", o->mode,
         "Speculative decoding: none; ngram (drafts copied from the prompt and the text so far: code "
         "edits, quoting); dflash (a DFlash draft model, --draft FILE); auto (with --draft, n-gram or "
         "the draft each step, by what each keeps for the request; n-gram drafts otherwise). Output is "
         "the same as without; drafting stops by itself when it would be slower")
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
  cmd->add_flag("--spec-fixed", o->fixed,
                "Draft --spec-max tokens (or the --spec-tree budget) every step, even when drafting does not "
                "pay (for measurements; default: the adaptive policy decides each step)");
  cmd->add_option(
      "--draft", o->draft_path,
      "DFlash draft model (GGUF; `moeserve convert` makes one from a DFlash checkpoint directory) "
      "for --spec dflash or auto");
  cmd->add_option("--device-draft,--draft-device", o->draft_device,
                  "Where the DFlash draft computes: cpu or cuda:N (default: the device of the target's "
                  "embedding). A second GPU takes the draft's weights and work off the target's; the target's "
                  "embedding and output head are copied there");
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
  MOESERVE_RETURN_IF_ERROR(runtime::validate_spec_config(c));
  if (!o.draft_device.empty()) {
    if (o.draft_path.empty()) {
      return make_error(StatusCode::kInvalidArgument, "--device-draft places a DFlash draft: add --draft FILE");
    }
    Result<backend::DeviceSpec> d = backend::parse_device_spec(o.draft_device);
    if (!d.is_ok()) return make_error(d.status().code(), "--device-draft: {}", d.status().message());
  }
  if (!o.draft_path.empty()) MOESERVE_RETURN_IF_ERROR(check_draft_file(o.draft_path));
  return c;
}

Status check_draft_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return make_error(
        StatusCode::kInvalidArgument,
        "--draft {} is a directory: convert the checkpoint first (moeserve convert {} draft.gguf) "
        "and pass the GGUF file",
        path, path);
  }
  MOESERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
  MOESERVE_ASSIGN_OR_RETURN(models::DflashHParams hp, models::load_dflash_hparams(file));
  (void)hp;
  return Status::ok();
}

Result<std::shared_ptr<spec::DflashModel>> load_draft_model(const SpecCliOptions& o,
                                                            const models::LanguageModel& target) {
  if (o.draft_path.empty()) return std::shared_ptr<spec::DflashModel>();
  Result<std::shared_ptr<spec::DflashModel>> m = spec::DflashModel::load(o.draft_path, target, o.draft_device);
  if (!m.is_ok()) return make_error(m.status().code(), "--draft {}: {}", o.draft_path, m.status().message());
  MOESERVE_LOG_INFO("{}", (*m)->description());
  return m;
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
