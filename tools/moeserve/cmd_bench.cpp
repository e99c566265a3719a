// PLACEHOLDER: replaced by the real subcommand.
#include "tools/moeserve/commands.h"
namespace moeserve::tools {
void register_bench(CLI::App& app) { (void)app; }
}  // namespace moeserve::tools
