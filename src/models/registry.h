// The architectures this engine runs: general.architecture -> the function
// that builds the model from a GGUF file. A new architecture is one file in
// models/ plus one line in registry.cpp.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "format/gguf.h"
#include "models/language_model.h"

namespace moeserve::models {

// Reads hyperparameters and weights (validated; errors name the key or
// tensor), places them on the placement's devices. The file must outlive
// the model when a device uses weights in place.
using ModelFactory = Result<std::unique_ptr<LanguageModel>> (*)(const GgufFile& file, const Placement& placement);

struct Architecture {
  std::string_view name;  // general.architecture
  ModelFactory create;
};

std::span<const Architecture> architectures();
// "qwen3moe, qwen3": for "unsupported architecture" messages.
std::string architecture_names();
Result<std::unique_ptr<LanguageModel>> create_model(const GgufFile& file, const Placement& placement);

}  // namespace moeserve::models
