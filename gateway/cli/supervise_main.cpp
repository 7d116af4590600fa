// kgate-supervise: holds one kernel as its child for kgate (docs/dev/readoption.md).  kgate starts it; it is
// not meant to be run by hand.  main() parses the options; kgate::supervise() does the work.
#include <chrono>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kgate/process/supervisor.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kgate-supervise: holds one kernel for kgate (started by kgate, not by hand)"};
  kgate::SuperviseOptions o;
  long long orphan_ms = 0, grace_ms = 2500;
  std::string cwd;
  app.add_option("--name", o.name, "The abstract socket's name")->required();
  app.add_option("--orphan-timeout-ms", orphan_ms, "With no kgate connected this long, stop the kernel")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grace-ms", grace_ms, "SIGTERM to SIGKILL of the kernel's process group")->check(CLI::NonNegativeNumber);
  app.add_option("--cwd", cwd, "The kernel's working directory");
  app.add_option("argv", o.argv, "The kernel's command line, after --")->required();
  CLI11_PARSE(app, argc, argv);
  o.orphan_timeout = std::chrono::milliseconds(orphan_ms);
  o.terminate_grace = std::chrono::milliseconds(grace_ms);
  o.cwd = cwd;
  return kgate::supervise(o);
}
