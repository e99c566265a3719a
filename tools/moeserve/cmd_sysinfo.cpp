// moeserve sysinfo: what this machine offers the engine (CPU features, the
// kernel level that will run, GPUs).
#include <fmt/format.h>

#include "core/cpu_features.h"
#include "kernels/cpu/cpu_kernels.h"
#include "backend/devices.h"
#include "kernels/gpu_api.h"
#include "tools/moeserve/commands.h"

namespace moeserve::tools {

void register_sysinfo(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("sysinfo", "Show CPU features, the chosen kernel level and GPUs");
  cmd->callback([] {
    const CpuFeatures& f = cpu_features();
    fmt::print("cpu:          {}\n", f.brand);
    fmt::print("cores:        {} physical, {} logical\n", f.physical_cores, f.logical_cores);
    fmt::print("features:     {}\n", f.summary());
    fmt::print("cpu kernels:  {}\n", cpu::simd_level_name(cpu::cpu_kernels().level));
    fmt::print("cuda:         {}\n", gpu::built_with_cuda() ? "built" : "not built");
    auto devices = gpu::list_devices();
    if (!devices) {
      fmt::print("gpus:         error: {}\n", devices.status().message());
      return;
    }
    for (const auto& d : devices.value()) {
      fmt::print("gpu {}:        {} (sm_{}{}, {} SMs, {:.1f} GiB)\n", d.index, d.name, d.cc_major, d.cc_minor,
                 d.sm_count, double(d.total_bytes) / (1 << 30));
    }
    auto choice = backend::choose_device("auto");
    if (choice.is_ok()) {
      fmt::print("default:      --device {} ({})\n", choice->spec.to_string(), choice->reason);
    }
  });
}

}  // namespace moeserve::tools
