// Request grammars compiled once: GBNF text (a request's `grammar`, or what
// its JSON schema became) -> the grammar the constraint runs. Clients send
// the same schema request after request; the same text gets the same
// compiled grammar, so the token-mask cache (keyed by the grammar) keeps
// serving it.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "runtime/grammar/grammar.h"

namespace moeserve::server::api {

// Compiles `gbnf` (or returns the copy compiled before). An error is the
// parser's: "grammar line L, column C: ...".
Result<std::shared_ptr<const runtime::grammar::Grammar>> compiled_grammar(const std::string& gbnf);

}  // namespace moeserve::server::api
