// Source positions and located error messages shared by the lexer, parser and
// interpreter: every error names the template and the line:column it came from,
// e.g. "chat template line 12:5: unsupported statement 'include'".
#pragma once

#include <string>

#include "core/status.h"

namespace moeserve::chat::jinja {

struct SourcePos {
  int line = 1;
  int column = 1;
};

struct SourceInfo {
  std::string name = "chat template";
};

inline Status located_error(StatusCode code, const SourceInfo& info, SourcePos pos,
                            const std::string& message) {
  return Status(code, fmt::format("{} line {}:{}: {}", info.name, pos.line, pos.column, message));
}

}  // namespace moeserve::chat::jinja
