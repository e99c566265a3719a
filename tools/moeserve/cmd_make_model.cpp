// PLACEHOLDER: replaced by the real subcommand.
#include "tools/moeserve/commands.h"
namespace moeserve::tools {
void register_make_model(CLI::App& app) { (void)app; }
}  // namespace moeserve::tools
