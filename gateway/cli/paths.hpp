// Where this kgate runs from, and where its helper program is: beside it in a build folder
// (build/gateway/kgate-supervise), or in lib/kgate/ of the prefix it is installed in
// (/usr/bin/kgate: /usr/lib/kgate/kgate-supervise, as `cmake --install` and the package put it).
#pragma once

#include <filesystem>

namespace kgate::gw {

struct SelfPaths {
  std::filesystem::path exe;         // this kgate, absolute
  std::filesystem::path supervisor;  // kgate-supervise; empty when there is none to run
  // A build folder's binary (its CMakeCache.txt is in the folder above): a service that runs
  // it breaks when the folder is rebuilt or removed.
  bool build_tree = false;
};

// For the binary at `exe` (tests pass their own).
SelfPaths self_paths(const std::filesystem::path& exe);
// For this process (/proc/self/exe; " (deleted)" after an upgrade replaced the file is dropped).
SelfPaths self_paths();

}  // namespace kgate::gw
