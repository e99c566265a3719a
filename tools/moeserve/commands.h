#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/progress.h"
#include "core/status.h"

namespace moeserve::tools {

std::string version_string();
void register_all_commands(CLI::App& app);

// Subcommands run from their CLI11 callback and record their exit code here
// (0 ok, 1 error: bad input or a failure that was reported to stderr).
void set_exit_code(int code);
int exit_code();
// A command's result: on failure "error: ..." on stderr and exit code 1.
void report_status(const Status& status);

// The --progress / --no-progress flag pair as a progress-bar mode (neither: auto, on a terminal).
inline ProgressOptions::Mode progress_mode(bool force_on, bool off) {
  return off        ? ProgressOptions::Mode::kOff
         : force_on ? ProgressOptions::Mode::kForceOn
                    : ProgressOptions::Mode::kAuto;
}

void register_inspect(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_sysinfo(CLI::App& app);
void register_make_model(CLI::App& app);
void register_convert(CLI::App& app);
void register_quantize(CLI::App& app);
void register_generate(CLI::App& app);
void register_bench(CLI::App& app);
void register_serve(CLI::App& app);
void register_place(CLI::App& app);
void register_calibrate(CLI::App& app);
void register_worker(CLI::App& app);
void register_shard(CLI::App& app);
void register_draft_worker(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_imatrix(CLI::App& app);

}  // namespace moeserve::tools
