// A conversation rendered with the model file's own chat template, ending
// with the assistant's turn (the prompt `generate --chat` and `calibrate`
// feed the model).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"
#include "runtime/model.h"

namespace moeserve::runtime {

// messages: [{"role": ..., "content": ...}, ...]. kNotFound when the file has
// no chat template (the message says how to go on without one).
Result<std::string> render_chat_prompt(const Model& model, const nlohmann::ordered_json& messages);

}  // namespace moeserve::runtime
