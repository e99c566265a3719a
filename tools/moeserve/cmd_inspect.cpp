// PLACEHOLDER
#include "tools/moeserve/commands.h"
namespace moeserve::tools {
void register_inspect(CLI::App& app) { (void)app; }
}  // namespace moeserve::tools
