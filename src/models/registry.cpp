#include "models/registry.h"

#include "format/model_keys.h"
#include "models/laguna.h"
#include "models/qwen3.h"
#include "models/qwen35.h"

namespace moeserve::models {

namespace {
constexpr Architecture kArchitectures[] = {
    {"qwen3moe", create_qwen3},
    {"qwen3", create_qwen3},
    {"qwen35moe", create_qwen35},
    {"qwen35", create_qwen35},
    {"laguna", create_laguna},
};
}  // namespace

std::span<const Architecture> architectures() { return kArchitectures; }

std::string architecture_names() {
  std::string out;
  for (const Architecture& a : kArchitectures) out += (out.empty() ? "" : ", ") + std::string(a.name);
  return out;
}

Result<std::unique_ptr<LanguageModel>> create_model(const GgufFile& file, const Placement& placement) {
  if (placement.io == nullptr) return make_error(StatusCode::kInvalidArgument, "create_model: no device given");
  if (!file.has(keys::kArchitecture)) {
    return make_error(StatusCode::kNotFound, "{}: required key '{}' is missing", file.name(), keys::kArchitecture);
  }
  const std::string_view arch = file.architecture();
  if (arch == "dflash") {
    return make_error(StatusCode::kUnsupported,
                      "{} is a DFlash draft model, not a model to run: load its target with -m and pass this "
                      "file with --spec dflash --draft",
                      file.name());
  }
  for (const Architecture& a : kArchitectures) {
    if (a.name == arch) return a.create(file, placement);
  }
  return make_error(StatusCode::kUnsupported, "{}: unsupported architecture '{}' (supported: {})", file.name(), arch,
                    architecture_names());
}

}  // namespace moeserve::models
