// Child processes: launching kernels in a new session, signalling them, watching for exit.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <system_error>
#include <vector>

#include <sys/types.h>

namespace kgate {

struct LaunchOptions {
  std::vector<std::string> argv;               // argv[0] is looked up on env's PATH if bare
  std::map<std::string, std::string> env;      // the complete environment of the child
  std::filesystem::path cwd;                   // empty = inherit
  bool die_with_parent = true;                 // PR_SET_PDEATHSIG(SIGKILL) in the child
  int stdout_fd = -1;                          // >= 3: the child's stdout; -1: inherit ours
  int stderr_fd = -1;                          // >= 3: the child's stderr; -1: inherit ours
  int pass_fd = -1;                            // >= 0: becomes the child's fd 3 (inherited)
  int stdin_fd = -1;                           // >= 0: the child's stdin; -1: /dev/null

  // Supervised (docs/dev/readoption.md): `supervisor` (the kgate-supervise binary) is started instead, with
  // a socket to it as its fd 3, and it starts argv as its own child.  The ChildProcess then
  // stands for the kernel (pid(), signals, the exit status) through that socket, and the kernel
  // can outlive this process.  die_with_parent is then the kernel's tie to its supervisor.
  std::filesystem::path supervisor;            // empty: argv is a direct child
  std::string supervisor_name;                 // its abstract socket's name
  std::chrono::milliseconds orphan_timeout{0};    // with no kgate connected to it
  std::chrono::milliseconds terminate_grace{2500};
};

// What ChildProcess::launch throws when the child failed before or at its exec; `stage` says
// where (chdir, stdin, exec, stdout/stderr), so a supervisor can pass it on as it was.
struct LaunchError : std::system_error {
  LaunchError(int err, int stage_, const std::string& what)
      : std::system_error(err, std::generic_category(), what), stage(stage_) {}
  int stage;
};

// A launched child.  Not copyable; the destructor does not kill the process (the owner
// decides), but it closes the pidfd.
class ChildProcess {
 public:
  ChildProcess() = default;
  ChildProcess(ChildProcess&& o) noexcept;
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  // fork+exec in a new session (setsid).  Throws std::system_error when the exec fails
  // (the child reports errno back over a CLOEXEC pipe, so "no such file" is caught here).
  // Supervised, it also blocks until the supervisor reported the kernel's pid (or its failure).
  static ChildProcess launch(const LaunchOptions& opts);

  // A kernel started by an earlier kgate, through a connection `fd` to its supervisor that
  // already answered "pid <pid> <start_time>" (docs/dev/readoption.md), `rest` being what it read after that
  // line.  Takes `fd`.
  static ChildProcess adopt(int fd, pid_t pid, unsigned long long start_time, std::string rest = {});
  // Connects to the supervisor named `name` and reads its "pid" line within `timeout_ms`.
  // Returns the fd, pid and start time; fd -1 (errno-style reason in `why`) when there is no
  // such supervisor any more.  The peer is trusted by its credentials only (SO_PEERCRED): a
  // socket held by another uid, or (with `supervisor_pid` > 0) by another process than the
  // supervisor kgate started, is an impostor: `impostor` is set and nothing is read from it.
  struct SupervisorHello {
    int fd = -1;
    pid_t pid = 0;
    unsigned long long start_time = 0;
    std::string rest;  // read after the pid line: pass it to adopt()
    std::string why;
    bool impostor = false;
    bool no_answer = false;  // the name took no connection in time (a full listen queue): not known to be gone
  };
  static SupervisorHello connect_supervisor(const std::string& name, int timeout_ms, pid_t supervisor_pid = 0);
  // The same over a node launcher's TCP control link (docs/dev/remote-launchers.md): connects to ip:port within
  // `timeout_ms`, answers its challenge with `key`, then reads the "pid" line.
  static SupervisorHello connect_node(const std::string& ip, int port, const std::string& key,
                                      const std::string& kernel_id, int timeout_ms);
  // Reads a supervisor's "pid" line from `fd` (`rest`: what was read past an earlier line).
  // Closes `fd` on failure.
  static SupervisorHello read_hello(int fd, std::string rest, int timeout_ms);
  // A kernel on another host (a node launcher's control link): its pid means nothing here, so
  // nothing is ever signalled locally, even when the link is lost.
  void set_remote() noexcept { remote_ = true; }
  bool remote() const noexcept { return remote_; }
  // Its supervisor's link ended without an exit line (the supervisor died, or the network).
  bool lost() const noexcept { return sup_lost_; }
  // A node launcher (docs/dev/remote-launchers.md) restarts the kernel in place when it next exits ("relaunch"),
  // and then sends a new "pid" line on the same link.
  void request_relaunch() { if (sup_fd_ >= 0 && !reaped_) tell_supervisor("relaunch"); }
  // After the exit of a kernel whose supervisor stays (a relaunch): takes the link out, with
  // what was read past the exit line.  False when there is none (the supervisor is gone).
  bool take_link(int& fd, std::string& rest);

  pid_t pid() const noexcept { return pid_; }
  // The kgate-supervise process launch() started for it (its child), or -1.
  pid_t supervisor_pid() const noexcept { return sup_pid_; }
  // A pollable fd that becomes readable when the process exits (pidfd_open, or the
  // supervisor's socket); -1 if the kernel has none, in which case callers poll try_reap() on a
  // timer.
  int exit_fd() const noexcept { return sup_fd_ >= 0 ? sup_fd_ : pidfd_; }
  bool supervised() const noexcept { return sup_fd_ >= 0; }
  // The kernel's start time (/proc/<pid>/stat), with its pid the key that a reused pid never matches.
  unsigned long long start_time() const noexcept { return start_time_; }
  bool running() const noexcept { return pid_ > 0 && !reaped_; }
  // waitpid(WNOHANG).  Returns true once the process has exited (and records the status).
  bool try_reap();
  // Blocks up to `timeout_ms` for exit; returns true if it exited.
  bool wait_for_exit(int timeout_ms);
  // Sends `sig` to the process group (falls back to the pid).  No-op once reaped.
  void signal_group(int sig);
  // Sends `sig` to the process only.
  void signal(int sig);
  // The exit status as from waitpid (valid after try_reap() returned true).
  int status() const noexcept { return status_; }
  // "exited with code N" / "killed by signal SIGKILL".
  std::string describe_exit() const;

 private:
  static ChildProcess launch_supervised(const LaunchOptions& opts);
  // Supervised: reads what the supervisor sent; true once the kernel's end is known.
  bool read_supervisor(int timeout_ms);
  void tell_supervisor(const std::string& line);

  pid_t pid_ = -1;
  int pidfd_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  unsigned long long start_time_ = 0;
  // Supervised: the socket to the supervisor, the supervisor itself (a child of ours until it
  // is reaped), and whether it went away without reporting the kernel's end.
  int sup_fd_ = -1;
  pid_t sup_pid_ = -1;
  bool sup_lost_ = false;
  bool remote_ = false;
  std::string sup_in_;
};

// Running a program to its end: every short-lived child of kgate (an interpreter probe, systemctl)
// goes through run(), never through a shell.  Kernels, which live on, are ChildProcess::launch()ed.
struct RunOptions {
  std::vector<std::string> argv;               // argv[0] absolute, or a bare name found on env's PATH
  std::map<std::string, std::string> env;      // the child's whole environment
  std::filesystem::path cwd = "/";
  std::chrono::milliseconds timeout{60000};    // then its process group is killed (SIGKILL)
  bool capture = true;                         // false: it writes to our stdout and stderr
  std::filesystem::path stdin_file;            // the child's stdin ("" = /dev/null)
  std::size_t max_stdout = 1 << 20;            // past it, stdout is dropped and out_overflow set
  // Once the child has exited, a grandchild that holds the pipes open gets this long, no more.
  std::chrono::milliseconds exit_grace{200};
};

struct RunResult {
  int spawn_errno = 0;      // not 0: it did not start (as from exec: ENOENT, EACCES, ...)
  std::string spawn_error;  // then: strerror of it
  bool timed_out = false;
  int status = 0;           // as from waitpid
  std::string out;
  bool out_overflow = false;
  std::string err_head, err_tail;  // the first 1 KiB and the last 2 KiB of stderr
  bool started() const { return spawn_errno == 0; }
};

// Runs opts.argv in opts.cwd, in a session and process group of its own, stdin /dev/null, until
// it exits and its pipes close, or until the deadline.  The group is then SIGKILLed (whatever the
// child left behind) and the child reaped, always: nothing outlives the call.  Blocks the caller.
RunResult run(const RunOptions& opts);

// Finds a bare program name on PATH (as given in env, else the process's).  Returns the
// name unchanged when it contains a slash or is not found.
std::string find_program(const std::string& name, const std::map<std::string, std::string>& env);

// Raises this process's soft RLIMIT_NOFILE to its hard limit (a daemon holds a descriptor per
// connection and a dozen per kernel; systemd's default soft limit is 1,024), and has every child
// launched from now on start with the soft limit it had: a kernel gets what it would have got
// without kgate.  Returns {the old soft limit, the new one}; equal when nothing changed.
std::pair<unsigned long, unsigned long> raise_fd_limit();

// Removes `name` from the environment, and first overwrites its value where it lies, so that
// the start-up copy /proc/<pid>/environ shows holds it no more (unsetenv alone leaves it there,
// readable by every process of this uid: a kernel's code included).
void scrub_environment(const char* name);

// The current process environment as a map.
std::map<std::string, std::string> current_environment();

// Blocks, in the calling thread, every signal that is not a fault (SIGSEGV, SIGBUS, SIGFPE,
// SIGILL, SIGTRAP, SIGABRT, SIGSYS).  A worker thread calls it first thing: a process-directed
// signal (SIGTERM, SIGHUP, a profiler's or fuzzer's SIGALRM) then goes to a thread that is
// ready for it, and never interrupts the worker's blocking calls with EINTR.  Children
// launched from the thread start with an empty mask (launch resets it).
void block_async_signals_in_this_thread();

}  // namespace kgate
