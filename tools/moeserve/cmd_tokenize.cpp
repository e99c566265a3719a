// PLACEHOLDER
#include "tools/moeserve/commands.h"
namespace moeserve::tools {
void register_tokenize(CLI::App& app) { (void)app; }
}  // namespace moeserve::tools
