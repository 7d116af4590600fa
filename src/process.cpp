// Child processes: fork/exec in a new session with an exec-error pipe, pidfds, signalling, reaping.
#include "kgate/process.hpp"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace kgate {

namespace {

// What the child was doing when it failed; sent to the parent ahead of errno.
enum ChildStage : int { kStageChdir = 1, kStageStdin = 2, kStageExec = 3, kStageStdout = 4 };

struct ChildError {
  int stage;
  int err;
};

void close_fd(int& fd) noexcept {
  if (fd >= 0) {
    ::close(fd);
    fd = -1;
  }
}

// Async-signal-safe: only used between fork and exec.
[[noreturn]] void child_fail(int fd, int stage) noexcept {
  ChildError e{stage, errno};
  const char* p = reinterpret_cast<const char*>(&e);
  std::size_t left = sizeof e;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  ::_exit(127);
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  if (!S_ISREG(st.st_mode)) return false;
  return ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

ChildProcess::ChildProcess(ChildProcess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      pidfd_(std::exchange(o.pidfd_, -1)),
      reaped_(std::exchange(o.reaped_, false)),
      status_(std::exchange(o.status_, 0)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    close_fd(pidfd_);
    pid_ = std::exchange(o.pid_, -1);
    pidfd_ = std::exchange(o.pidfd_, -1);
    reaped_ = std::exchange(o.reaped_, false);
    status_ = std::exchange(o.status_, 0);
  }
  return *this;
}

ChildProcess::~ChildProcess() { close_fd(pidfd_); }

ChildProcess ChildProcess::launch(const LaunchOptions& opts) {
  if (opts.argv.empty()) {
    throw std::system_error(EINVAL, std::generic_category(), "cannot launch: empty argv");
  }
  const std::string& argv0 = opts.argv.front();

  // Everything the child needs is prepared here: no allocation happens after fork.
  const std::string exec_path = find_program(argv0, opts.env);
  if (exec_path.find('/') == std::string::npos) {
    // A bare name not found on PATH: do not let execve resolve it against the cwd.
    throw std::system_error(ENOENT, std::generic_category(),
                            "cannot launch " + argv0 + " (not found on PATH)");
  }

  std::vector<char*> argv_ptrs;
  argv_ptrs.reserve(opts.argv.size() + 1);
  for (const auto& a : opts.argv) argv_ptrs.push_back(const_cast<char*>(a.c_str()));
  argv_ptrs.push_back(nullptr);

  std::vector<std::string> env_strings;
  env_strings.reserve(opts.env.size());
  for (const auto& [k, v] : opts.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  const std::string cwd = opts.cwd.string();
  const bool do_chdir = !cwd.empty();
  const bool die_with_parent = opts.die_with_parent;
  const pid_t parent_pid = ::getpid();
  const int out_fd = opts.stdout_fd;
  const int errfd = opts.stderr_fd;
  for (int fd : {out_fd, errfd}) {
    if (fd >= 0 && fd <= 2)
      throw std::system_error(EINVAL, std::generic_category(), "cannot launch " + argv0 + " (an output fd below 3)");
  }

  sigset_t empty_mask;
  sigemptyset(&empty_mask);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);

  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "cannot launch " + argv0 + " (pipe)");
  }
  // Keep the error pipe clear of fds 0-2, which the child is about to overwrite.
  for (int& fd : pipefd) {
    if (fd <= 2) {
      const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
      if (moved < 0) {
        const int err = errno;
        ::close(pipefd[0]);
        ::close(pipefd[1]);
        throw std::system_error(err, std::generic_category(), "cannot launch " + argv0 + " (pipe)");
      }
      ::close(fd);
      fd = moved;
    }
  }
  const int err_w = pipefd[1];

  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    throw std::system_error(err, std::generic_category(), "cannot launch " + argv0 + " (fork)");
  }

  if (pid == 0) {
    // Child: async-signal-safe calls only.
    ::setsid();
    if (die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent_pid) ::_exit(127);  // the parent already died
    }
    ::sigprocmask(SIG_SETMASK, &empty_mask, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD, SIGHUP, SIGQUIT}) ::sigaction(sig, &dfl, nullptr);
    // Nothing else the daemon holds open should leak into the kernel.
    ::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
    if (do_chdir && ::chdir(cwd.c_str()) != 0) child_fail(err_w, kStageChdir);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull < 0) child_fail(err_w, kStageStdin);
    if (devnull != STDIN_FILENO) {
      if (::dup2(devnull, STDIN_FILENO) < 0) child_fail(err_w, kStageStdin);
      ::close(devnull);
    }
    if (out_fd >= 0 && ::dup2(out_fd, STDOUT_FILENO) < 0) child_fail(err_w, kStageStdout);
    if (errfd >= 0 && ::dup2(errfd, STDERR_FILENO) < 0) child_fail(err_w, kStageStdout);
    ::execve(exec_path.c_str(), argv_ptrs.data(), envp.data());
    child_fail(err_w, kStageExec);
  }

  // Parent.
  ::close(pipefd[1]);
  ChildError ce{0, 0};
  std::size_t got = 0;
  char* buf = reinterpret_cast<char*>(&ce);
  while (got < sizeof ce) {
    const ssize_t n = ::read(pipefd[0], buf + got, sizeof ce - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(pipefd[0]);

  if (got > 0) {
    // The child failed before or at execve.
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    const int err = got == sizeof ce ? ce.err : EIO;
    std::string what = "cannot launch " + argv0;
    switch (got == sizeof ce ? ce.stage : 0) {
      case kStageChdir: what += " (chdir to " + cwd + ")"; break;
      case kStageStdin: what += " (/dev/null as stdin)"; break;
      case kStageStdout: what += " (its stdout or stderr)"; break;
      case kStageExec: break;
      default: what += " (child setup)"; break;
    }
    throw std::system_error(err, std::generic_category(), what);
  }

  ChildProcess child;
  child.pid_ = pid;
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  child.pidfd_ = fd >= 0 ? static_cast<int>(fd) : -1;
  return child;
}

bool ChildProcess::try_reap() {
  if (pid_ <= 0) return false;
  if (reaped_) return true;
  int st = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &st, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    reaped_ = true;
    status_ = st;
    return true;
  }
  if (r < 0 && errno == ECHILD) {
    // Someone else reaped it (or SIGCHLD is ignored): it is gone, the status is unknown.
    reaped_ = true;
    status_ = 0;
    return true;
  }
  return false;
}

bool ChildProcess::wait_for_exit(int timeout_ms) {
  if (pid_ <= 0) return false;
  if (try_reap()) return true;
  using clock = std::chrono::steady_clock;
  const bool forever = timeout_ms < 0;
  const auto deadline = clock::now() + std::chrono::milliseconds(forever ? 0 : timeout_ms);
  auto remaining_ms = [&]() -> int {
    if (forever) return -1;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    return left > 0 ? static_cast<int>(left) : 0;
  };

  if (pidfd_ >= 0) {
    for (;;) {
      pollfd p{pidfd_, POLLIN, 0};
      const int r = ::poll(&p, 1, remaining_ms());
      if (r > 0) return try_reap();
      if (r == 0) return try_reap();  // timed out
      if (errno != EINTR) break;      // fall back to the sleep loop
    }
  }
  for (;;) {
    if (try_reap()) return true;
    const int left = remaining_ms();
    if (left == 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(left < 0 || left > 10 ? 10 : left));
  }
}

void ChildProcess::signal_group(int sig) {
  if (!running()) return;
  if (::killpg(pid_, sig) != 0 && (errno == ESRCH || errno == EPERM)) ::kill(pid_, sig);
}

void ChildProcess::signal(int sig) {
  if (!running()) return;
  ::kill(pid_, sig);
}

std::string ChildProcess::describe_exit() const {
  if (pid_ <= 0) return "not started";
  if (!reaped_) return "still running";
  if (WIFEXITED(status_)) return "exited with code " + std::to_string(WEXITSTATUS(status_));
  if (WIFSIGNALED(status_)) {
    const int sig = WTERMSIG(status_);
    const char* abbrev = ::sigabbrev_np(sig);
    std::string s = "killed by signal ";
    s += abbrev ? std::string("SIG") + abbrev : std::to_string(sig);
    return s;
  }
  return "ended with status " + std::to_string(status_);
}

namespace {

constexpr std::size_t kStderrHead = 1024;
constexpr std::size_t kStderrTail = 2048;

// A CLOEXEC pipe whose ends are both >= 3 (a daemon started with a closed stdio gets low fds).
bool output_pipe(int (&p)[2]) {
  if (::pipe2(p, O_CLOEXEC) != 0) return false;
  for (int& fd : p) {
    if (fd > 2) continue;
    const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    ::close(fd);
    fd = moved;
    if (moved < 0) return false;
  }
  return true;
}

}  // namespace

RunResult run(const RunOptions& opts) {
  RunResult r;
  int outp[2] = {-1, -1}, errp[2] = {-1, -1};
  auto close_all = [&] {
    for (int* fd : {&outp[0], &outp[1], &errp[0], &errp[1]}) close_fd(*fd);
  };
  if (opts.capture && (!output_pipe(outp) || !output_pipe(errp))) {
    r.spawn_errno = errno ? errno : EMFILE;
    r.spawn_error = std::string("pipe: ") + std::strerror(r.spawn_errno);
    close_all();
    return r;
  }
  LaunchOptions lo;
  lo.argv = opts.argv;
  lo.env = opts.env;
  lo.cwd = opts.cwd;
  lo.die_with_parent = true;
  lo.stdout_fd = outp[1];
  lo.stderr_fd = errp[1];
  ChildProcess child;
  try {
    child = ChildProcess::launch(lo);
  } catch (const std::system_error& e) {
    r.spawn_errno = e.code().value() ? e.code().value() : EIO;
    r.spawn_error = std::strerror(r.spawn_errno);
    close_all();
    return r;
  }
  close_fd(outp[1]);
  close_fd(errp[1]);
  const pid_t pid = child.pid();
  const int pidfd = child.exit_fd();  // -1: poll for the exit instead
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + opts.timeout;
  std::optional<clock::time_point> exited_at;
  // WNOWAIT: the child stays unreaped until the group is killed below.
  auto child_exited = [pid] {
    siginfo_t info{};
    return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
  };
  // Read both pipes until both are at EOF and the child has exited, or the deadline.
  char buf[8192];
  for (;;) {
    const bool pipes_open = outp[0] >= 0 || errp[0] >= 0;
    if (!exited_at && (pidfd < 0 || !pipes_open) && child_exited()) exited_at = clock::now();
    if (!pipes_open && exited_at) break;
    const auto now = clock::now();
    if (!exited_at && now >= deadline) {
      r.timed_out = true;
      break;
    }
    if (exited_at && now >= *exited_at + opts.exit_grace) break;
    const auto until = exited_at ? *exited_at + opts.exit_grace : deadline;
    auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1;
    if (pidfd < 0 && !exited_at) wait_ms = std::min<long long>(wait_ms, 20);
    pollfd pfds[3];
    nfds_t n = 0;
    int out_i = -1, err_i = -1, pid_i = -1;
    if (outp[0] >= 0) {
      out_i = static_cast<int>(n);
      pfds[n++] = {outp[0], POLLIN, 0};
    }
    if (errp[0] >= 0) {
      err_i = static_cast<int>(n);
      pfds[n++] = {errp[0], POLLIN, 0};
    }
    if (pidfd >= 0 && !exited_at) {
      pid_i = static_cast<int>(n);
      pfds[n++] = {pidfd, POLLIN, 0};
    }
    const int pr = ::poll(n ? pfds : nullptr, n, static_cast<int>(wait_ms));
    if (pr < 0 && errno != EINTR) {
      r.timed_out = !exited_at;  // cannot wait any more: treat as the deadline
      break;
    }
    if (pr <= 0) continue;
    if (out_i >= 0 && pfds[out_i].revents) {
      const ssize_t got = ::read(outp[0], buf, sizeof buf);
      if (got > 0) {
        if (r.out.size() + static_cast<std::size_t>(got) > opts.max_stdout) {
          r.out_overflow = true;
        } else {
          r.out.append(buf, static_cast<std::size_t>(got));
        }
      } else if (got == 0 || errno != EINTR) {
        close_fd(outp[0]);
      }
    }
    if (err_i >= 0 && pfds[err_i].revents) {
      const ssize_t got = ::read(errp[0], buf, sizeof buf);
      if (got > 0) {
        const std::string_view chunk(buf, static_cast<std::size_t>(got));
        if (r.err_head.size() < kStderrHead) r.err_head.append(chunk.substr(0, kStderrHead - r.err_head.size()));
        r.err_tail.append(chunk);
        if (r.err_tail.size() > kStderrTail) r.err_tail.erase(0, r.err_tail.size() - kStderrTail);
      } else if (got == 0 || errno != EINTR) {
        close_fd(errp[0]);
      }
    }
    if (pid_i >= 0 && pfds[pid_i].revents) exited_at = clock::now();
  }
  close_all();
  // The child is unreaped (at worst a zombie), so its pid, and with it the group id, cannot have
  // been reused: this reaches only what it started.
  ::killpg(pid, SIGKILL);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  r.status = st;
  return r;
}

std::string find_program(const std::string& name, const std::map<std::string, std::string>& env) {
  if (name.empty() || name.find('/') != std::string::npos) return name;
  std::string path;
  if (auto it = env.find("PATH"); it != env.end() && !it->second.empty()) {
    path = it->second;
  } else if (const char* p = std::getenv("PATH"); p && *p) {
    path = p;
  } else {
    path = "/usr/bin:/bin";
  }
  std::size_t start = 0;
  for (;;) {
    const std::size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir;
    if (candidate.back() != '/') candidate += '/';
    candidate += name;
    if (is_executable_file(candidate)) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return name;
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> out;
  if (!environ) return out;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    out.emplace(std::string(*e, static_cast<std::size_t>(eq - *e)), std::string(eq + 1));
  }
  return out;
}

void block_async_signals_in_this_thread() {
  sigset_t set;
  sigfillset(&set);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS}) sigdelset(&set, sig);
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace kgate
