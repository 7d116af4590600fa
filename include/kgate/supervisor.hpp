// kgate-supervise: the small process that holds one kernel as its child, so the kernel can
// outlive the kgate that started it (DEV.md §4d "Supervisors").
//
// kgate starts `kgate-supervise` with a connected socket as fd 3; the supervisor starts the
// kernel (in a session of its own, PR_SET_PDEATHSIG on the supervisor), reports its pid, runs
// the signals kgate asks for on its own, never-reaped-behind-its-back child, and reports the
// exit status.  Any later kgate of the same user may connect to its abstract Unix socket (the
// kernel id in the name, peers checked with SO_PEERCRED) and take over.  With no kgate
// connected for `orphan_timeout`, it stops the kernel (SIGTERM to its group, SIGKILL after the
// grace) and exits.
//
// The protocol is lines of ASCII:
//   supervisor -> kgate   "pid <pid> <starttime>"   on connect (starttime: /proc/<pid>/stat field 22)
//                         "error <stage> <errno>"   the kernel could not be started (then it exits)
//                         "exit <wait status>"      the kernel ended (then it exits)
//   kgate -> supervisor   "signal <n> group" | "signal <n> pid"
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace kgate {

struct SuperviseOptions {
  std::string name;                          // the abstract socket's name (no leading NUL)
  int control_fd = 3;                        // the connection to the kgate that started it
  std::chrono::milliseconds orphan_timeout{0};  // with no kgate connected; 0 = at once
  std::chrono::milliseconds terminate_grace{2500};  // SIGTERM -> SIGKILL of the kernel's group
  std::filesystem::path cwd;                 // the kernel's; empty = the supervisor's
  std::vector<std::string> argv;             // the kernel's; its env is the supervisor's
};

// Runs the supervisor until the kernel has ended.  Returns the process exit code.
int supervise(const SuperviseOptions& opts);

// The abstract socket name of kernel `id`'s supervisor, for this user.
std::string supervisor_socket_name(const std::string& kernel_id);

}  // namespace kgate
