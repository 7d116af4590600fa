// kgate-supervise: the small process that holds one kernel as its child, so the kernel can
// outlive the kgate that started it (docs/dev/readoption.md "Supervisors").
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
//   supervisor -> kgate   "pid <pid> <starttime> link <version>"
//                                                   on connect (starttime: /proc/<pid>/stat field 22;
//                                                   version: kSupervisorLinkVersion)
//                         "error <stage> <errno>"   the kernel could not be started (then it exits)
//                         "exit <wait status>"      the kernel ended (then it exits)
//   kgate -> supervisor   "signal <n> group" | "signal <n> pid"
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace kgate {

struct SuperviseOptions {
  std::string name;                          // the abstract socket's name (no leading NUL)
  int control_fd = 3;                        // the connection to the kgate that started it
  std::chrono::milliseconds orphan_timeout{0};  // with no kgate connected; 0 = at once
  std::chrono::milliseconds terminate_grace{2500};  // SIGTERM -> SIGKILL of the kernel's group
  std::filesystem::path cwd;                 // the kernel's; empty = the supervisor's
  std::vector<std::string> argv;             // the kernel's; its env is the supervisor's

  // The node launcher's (docs/dev/remote-launchers.md): a listening TCP socket for kgate's control link, which
  // authenticates both ways, the launcher first.  A peer is sent "challenge2 <cN>"; it must send
  // "prove <cK>" (its own challenge) and is answered "proof <control_link_proof(auth_key,
  // kernel_id, cK, cN)>"; then it must send "auth <control_link_answer(auth_key, kernel_id, cN)>"
  // within 5 s of connecting, before it hears the "pid" line.  Anything else closes it.  Peers
  // that have not answered are bounded (kMaxUnanswered in all, kMaxUnansweredPerPeer from one
  // address): past a bound the oldest is closed, never the newcomer, so squatters cannot lock
  // kgate out.
  int tcp_listen_fd = -1;
  std::string auth_key, kernel_id;
  // The kernel, started already by the caller (the node launcher, which waits for its ports
  // before it registers); argv is still what a relaunch runs.
  class ChildProcess* prelaunched = nullptr;
  // Runs once the kernel started (before the loop); false stops the kernel (as a SIGTERM would).
  std::function<bool(int pid, unsigned long long start_time)> on_started;
};

// The version of the protocol above.  A kgate adopts, or starts a kernel with, no supervisor
// that speaks a newer one (docs/service.md, "The formats, and their versions").  Version 1 is
// also what a supervisor from before the field was (its pid line ended after the start time).
inline constexpr unsigned kSupervisorLinkVersion = 1;

struct SupervisorPidLine {
  pid_t pid = 0;
  unsigned long long start_time = 0;
  unsigned version = 0;
};
// "pid <pid> <starttime> link <version>", as this supervisor sends it.
std::string supervisor_pid_line(pid_t pid, unsigned long long start_time);
// A pid line: "pid <pid> <starttime>" (version 1) or "pid <pid> <starttime> link <version>";
// nullopt for anything else, a pid of 0 or a version of 0.
std::optional<SupervisorPidLine> parse_supervisor_pid_line(const std::string& line);

// Runs the supervisor until the kernel has ended.  Returns the process exit code.
int supervise(const SuperviseOptions& opts);

// The control link's challenge answer: HMAC-SHA256(key, "kgate-control" | kernel id | challenge)
// in hex; the supervisor compares it in constant time.
std::string control_link_answer(const std::string& key, const std::string& kernel_id,
                                const std::string& challenge);
bool control_link_check(const std::string& key, const std::string& kernel_id,
                        const std::string& challenge, const std::string& answer);
// The launcher's proof to kgate: HMAC-SHA256(key, "kgate-control-launcher" | kernel id |
// kgate's challenge | the launcher's own), so no answer of one side serves as the other's.
std::string control_link_proof(const std::string& key, const std::string& kernel_id,
                               const std::string& kgate_challenge, const std::string& node_challenge);
bool control_link_proof_check(const std::string& key, const std::string& kernel_id, const std::string& kgate_challenge,
                              const std::string& node_challenge, const std::string& proof);

// The abstract socket name of kernel `id`'s supervisor, for this user.
std::string supervisor_socket_name(const std::string& kernel_id);

}  // namespace kgate
