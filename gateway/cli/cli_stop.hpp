// `kgate stop [--kernels]`: stops the kgate that holds a state directory (docs/dev/readoption.md).  Without
// --kernels its kernels keep running for the next kgate (SIGTERM); with it they stop too (SIGINT).
#pragma once

#include <chrono>
#include <filesystem>
#include <iosfwd>

namespace kgate::gw {

struct StopOptions {
  // The kgate holding this state directory is the one stopped; empty = as `kgate serve` finds
  // it: state_dir in `config` (default kgate.toml, if it exists), else the default.
  std::filesystem::path state_dir;
  std::filesystem::path config;
  bool kernels = false;             // stop its kernels too
  std::chrono::seconds timeout{30};
};

// Finds the kgate by the pid in <state_dir>/kgate.lock (checked to be a running `kgate serve`),
// signals it and waits for it to exit.  Returns 0 once it exited, 1 if none runs there or it did
// not exit in time, 2 if the config cannot be read (the reason on `err`).
int stop_gateway(const StopOptions& o, std::ostream& out, std::ostream& err);

}  // namespace kgate::gw
