#include "tools/moeserve/spec_flags.h"

#include <fmt/format.h>

#include <filesystem>

#include "backend/devices.h"
#include "core/log.h"
#include "format/gguf.h"
#include "ipc/draft_client.h"
#include "ipc/frame.h"
#include "ipc/worker_process.h"
#include "models/dflash_weights.h"
#include "moe/moe_shape.h"

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
                  "embedding and output head are copied there. proc:cpu or proc:cuda:N: in a process of its own "
                  "(`moeserve draft-worker`, started here); if it dies, requests decode without drafts");
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
    const std::string_view where = std::string_view(o.draft_device).starts_with("proc:")
                                       ? std::string_view(o.draft_device).substr(5)
                                       : std::string_view(o.draft_device);
    Result<backend::DeviceSpec> d = backend::parse_device_spec(std::string(where));
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

Result<std::shared_ptr<runtime::DraftSource>> load_draft_model(const SpecCliOptions& o,
                                                               const models::LanguageModel& target,
                                                               const std::string& target_path) {
  if (o.draft_path.empty()) return std::shared_ptr<runtime::DraftSource>();
  if (o.draft_device.starts_with("proc:")) {
    ipc::DraftProcessOptions po;
    MOESERVE_ASSIGN_OR_RETURN(po.exe, ipc::self_executable());
    po.target_path = target_path;
    po.draft_path = o.draft_path;
    po.device = o.draft_device.substr(5);
    MOESERVE_ASSIGN_OR_RETURN(GgufFile target_file, GgufFile::open(target_path));
    MOESERVE_ASSIGN_OR_RETURN(GgufFile draft_file, GgufFile::open(o.draft_path));
    po.target_fingerprint = ipc::fingerprint_value(moe::model_fingerprint(target_file));
    po.draft_fingerprint = ipc::fingerprint_value(moe::model_fingerprint(draft_file));
    MOESERVE_LOG_INFO("starting the DFlash draft's process on {}...", po.device);
    Result<std::shared_ptr<ipc::DraftProcess>> p = ipc::DraftProcess::start(po);
    if (!p.is_ok())
      return make_error(p.status().code(), "--device-draft {}: {}", o.draft_device, p.status().message());
    MOESERVE_LOG_INFO("{}", (*p)->description());
    return std::shared_ptr<runtime::DraftSource>(std::move(*p));
  }
  Result<std::shared_ptr<spec::DflashModel>> m = spec::DflashModel::load(o.draft_path, target, o.draft_device);
  if (!m.is_ok()) return make_error(m.status().code(), "--draft {}: {}", o.draft_path, m.status().message());
  MOESERVE_LOG_INFO("{}", (*m)->description());
  return std::shared_ptr<runtime::DraftSource>(std::move(*m));
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
