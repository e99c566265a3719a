// moeserve: one binary, one subcommand per job. Each subcommand lives in its
// own cmd_*.cpp and registers itself through commands.h.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "tools/moeserve/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"moeserve — Mixture-of-Experts inference server"};
  app.require_subcommand(1);
  app.set_version_flag("--version", moeserve::tools::version_string());
  moeserve::tools::register_all_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return moeserve::tools::exit_code();
}
