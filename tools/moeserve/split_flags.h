// --layer-split SPEC, shared by generate, bench and serve (and inspect,
// which prints the plan): split/layer_split.h says what SPEC is.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/status.h"
#include "runtime/model.h"

namespace moeserve::tools {

void add_layer_split_flag(CLI::App* cmd, std::string* spec);
// Plans SPEC for the model file into `load` (nothing when SPEC is empty).
// `device` is the --device flag: a split names its devices itself.
Status apply_layer_split(const std::string& model_path, const std::string& spec, const std::string& device,
                         runtime::ModelLoadOptions* load);

}  // namespace moeserve::tools
