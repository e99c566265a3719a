#include "tools/moeserve/commands.h"

#include <fmt/format.h>

#include "core/cpu_features.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/gpu_api.h"

namespace moeserve::tools {
namespace {
int g_exit_code = 0;
}

std::string version_string() {
  return fmt::format("moeserve 0.1.0 (cpu: {}, cuda: {})", cpu_features().summary(),
                     gpu::built_with_cuda() ? "built" : "not built");
}

void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

void report_status(const Status& status) {
  if (status.is_ok()) return;
  fmt::print(stderr, "error: {}\n", status.to_string());
  set_exit_code(1);
}

void register_all_commands(CLI::App& app) {
  register_inspect(app);
  register_tokenize(app);
  register_sysinfo(app);
  register_make_model(app);
  register_convert(app);
  register_quantize(app);
  register_generate(app);
  register_serve(app);
  register_bench(app);
  register_calibrate(app);
  register_place(app);
  register_worker(app);
  register_shard(app);
  register_draft_worker(app);
  register_perplexity(app);
  register_imatrix(app);
}

}  // namespace moeserve::tools
