// Child processes: fork/exec in a new session with an exec-error pipe, pidfds, signalling, reaping.
#include "kgate/process/process.hpp"

#include "kgate/jupyter/connection.hpp"
#include "kgate/process/supervisor.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace kgate {

namespace {

// "link version 2, this kgate version 1"
std::string link_versions(unsigned theirs) {
  return "link version " + std::to_string(theirs) + ", this kgate version " + std::to_string(kSupervisorLinkVersion);
}

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
      status_(std::exchange(o.status_, 0)),
      start_time_(std::exchange(o.start_time_, 0)),
      sup_fd_(std::exchange(o.sup_fd_, -1)),
      sup_pid_(std::exchange(o.sup_pid_, -1)),
      sup_lost_(std::exchange(o.sup_lost_, false)),
      remote_(std::exchange(o.remote_, false)),
      sup_in_(std::move(o.sup_in_)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    close_fd(pidfd_);
    close_fd(sup_fd_);
    pid_ = std::exchange(o.pid_, -1);
    pidfd_ = std::exchange(o.pidfd_, -1);
    reaped_ = std::exchange(o.reaped_, false);
    status_ = std::exchange(o.status_, 0);
    start_time_ = std::exchange(o.start_time_, 0);
    sup_fd_ = std::exchange(o.sup_fd_, -1);
    sup_pid_ = std::exchange(o.sup_pid_, -1);
    sup_lost_ = std::exchange(o.sup_lost_, false);
    remote_ = std::exchange(o.remote_, false);
    sup_in_ = std::move(o.sup_in_);
  }
  return *this;
}

// A supervisor still running keeps its kernel: closing the socket only tells it that this kgate
// is gone (its orphan timeout starts).
ChildProcess::~ChildProcess() {
  close_fd(pidfd_);
  close_fd(sup_fd_);
}

namespace {

std::string launch_failure(const std::string& argv0, const std::string& cwd, int stage) {
  std::string what = "cannot launch " + argv0;
  switch (stage) {
    case kStageChdir: what += " (chdir to " + cwd + ")"; break;
    case kStageStdin: what += " (/dev/null as stdin)"; break;
    case kStageStdout: what += " (its stdout or stderr)"; break;
    case kStageExec: break;
    default: what += " (child setup)"; break;
  }
  return what;
}

// An fd of `fd`'s file at 10 or above (close-on-exec), closing `fd`: keeps it clear of the fds a
// child is about to set (0-3).
bool raise_fd(int& fd) {
  if (fd >= 10) return true;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  if (moved < 0) return false;
  ::close(fd);
  fd = moved;
  return true;
}

// Reads from `fd` into `buf` until it holds a whole line, for up to `timeout_ms`, and moves that
// line (without its newline) into `line`; what follows it stays in `buf`.  False on timeout, end
// of file, or 4 KiB without a newline (a supervisor's lines are short).
bool read_line(int fd, std::string& buf, std::string& line, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (auto nl = buf.find('\n'); nl != std::string::npos) {
      line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      return true;
    }
    if (buf.size() > 4096) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    const int r = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char chunk[512];
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    buf.append(chunk, static_cast<std::size_t>(n));
  }
}

}  // namespace

namespace {
// The soft RLIMIT_NOFILE a child starts with, when raise_fd_limit raised this process's.
std::atomic<bool> g_child_fd_limit_set{false};
rlimit g_child_fd_limit{};
}  // namespace

void scrub_environment(const char* name) {
  const std::size_t n = std::strlen(name);
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, name, n) == 0 && (*e)[n] == '=') ::explicit_bzero(*e + n + 1, std::strlen(*e + n + 1));
  ::unsetenv(name);
}

std::pair<unsigned long, unsigned long> raise_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return {0, 0};
  const rlimit old = rl;
  if (rl.rlim_cur >= rl.rlim_max) return {old.rlim_cur, old.rlim_cur};
  rl.rlim_cur = rl.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return {old.rlim_cur, old.rlim_cur};
  g_child_fd_limit = old;
  g_child_fd_limit_set = true;
  return {old.rlim_cur, rl.rlim_cur};
}

ChildProcess ChildProcess::launch(const LaunchOptions& opts) {
  if (opts.argv.empty()) {
    throw std::system_error(EINVAL, std::generic_category(), "cannot launch: empty argv");
  }
  if (!opts.supervisor.empty()) return launch_supervised(opts);
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
  const int pass_fd = opts.pass_fd;
  const int in_fd = opts.stdin_fd;
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
  // Keep the error pipe clear of fds 0-3, which the child is about to overwrite.
  for (int& fd : pipefd) {
    if (!raise_fd(fd)) {
      const int err = errno;
      ::close(pipefd[0]);
      ::close(pipefd[1]);
      throw std::system_error(err, std::generic_category(), "cannot launch " + argv0 + " (pipe)");
    }
  }
  const int err_w = pipefd[1];

  const bool restore_fd_limit = g_child_fd_limit_set.load();
  const rlimit fd_limit = g_child_fd_limit;
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
    if (restore_fd_limit) ::setrlimit(RLIMIT_NOFILE, &fd_limit);  // the limit kgate started with
    // Nothing else the daemon holds open should leak into the kernel.
    ::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
    if (pass_fd == 3) {
      if (::fcntl(3, F_SETFD, 0) != 0) child_fail(err_w, kStageStdout);
    } else if (pass_fd >= 0 && ::dup2(pass_fd, 3) < 0) {
      child_fail(err_w, kStageStdout);
    }
    if (do_chdir && ::chdir(cwd.c_str()) != 0) child_fail(err_w, kStageChdir);
    const int devnull = in_fd >= 0 ? in_fd : ::open("/dev/null", O_RDONLY);
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
    const int stage = got == sizeof ce ? ce.stage : 0;
    throw LaunchError(err, stage, launch_failure(argv0, cwd, stage));
  }

  ChildProcess child;
  child.pid_ = pid;
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  child.pidfd_ = fd >= 0 ? static_cast<int>(fd) : -1;
  return child;
}

ChildProcess ChildProcess::launch_supervised(const LaunchOptions& opts) {
  const std::string& argv0 = opts.argv.front();
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::system_error(errno, std::generic_category(), "cannot launch " + argv0 + " (socketpair)");
  for (int& fd : sv) {
    if (!raise_fd(fd)) {
      const int err = errno;
      ::close(sv[0]);
      ::close(sv[1]);
      throw std::system_error(err, std::generic_category(), "cannot launch " + argv0 + " (socketpair)");
    }
  }
  LaunchOptions so;
  so.argv = {opts.supervisor.string(),
             "--name", opts.supervisor_name,
             "--orphan-timeout-ms", std::to_string(opts.orphan_timeout.count()),
             "--grace-ms", std::to_string(opts.terminate_grace.count())};
  if (!opts.cwd.empty()) {
    so.argv.push_back("--cwd");
    so.argv.push_back(opts.cwd.string());
  }
  so.argv.push_back("--");
  so.argv.insert(so.argv.end(), opts.argv.begin(), opts.argv.end());
  so.env = opts.env;
  so.cwd = "/";
  so.die_with_parent = false;  // it is what outlives us
  so.stdout_fd = opts.stdout_fd;
  so.stderr_fd = opts.stderr_fd;
  so.pass_fd = sv[1];
  ChildProcess sup;
  try {
    sup = launch(so);
  } catch (...) {
    ::close(sv[0]);
    ::close(sv[1]);
    throw;
  }
  ::close(sv[1]);
  ChildProcess c;
  c.sup_fd_ = sv[0];
  c.sup_pid_ = std::exchange(sup.pid_, -1);
  // Its first line: the kernel's pid, or why it could not be started.
  std::string line;
  read_line(c.sup_fd_, c.sup_in_, line, 10000);
  auto reap_supervisor = [&](bool kill_it) {
    if (kill_it) ::kill(c.sup_pid_, SIGKILL);
    int st = 0;
    while (::waitpid(c.sup_pid_, &st, 0) < 0 && errno == EINTR) {
    }
    c.sup_pid_ = -1;
  };
  int stage = 0, err = 0;
  const auto hello = parse_supervisor_pid_line(line);
  if (hello && hello->version <= kSupervisorLinkVersion) {
    c.pid_ = hello->pid;
    c.start_time_ = hello->start_time;
    return c;
  }
  if (!hello && std::sscanf(line.c_str(), "error %d %d", &stage, &err) == 2) {
    reap_supervisor(false);
    throw LaunchError(err, stage, launch_failure(argv0, opts.cwd.string(), stage));
  }
  reap_supervisor(true);  // a newer one's kernel too: this kgate could not speak to it
  throw std::system_error(
      line.empty() ? ETIMEDOUT : EPROTO, std::generic_category(),
      "cannot launch " + argv0 + " (its supervisor " + opts.supervisor.string() +
          (line.empty() ? " did not report the kernel's pid within 10 s)"
           : hello      ? " speaks " + link_versions(hello->version) +
                         "; restart kgate, so that it and its kgate-supervise are of one release)"
                        : " said: " + line + ")"));
}

ChildProcess ChildProcess::adopt(int fd, pid_t pid, unsigned long long start_time, std::string rest) {
  ChildProcess c;
  c.sup_fd_ = fd;
  c.sup_in_ = std::move(rest);  // what came after the pid line (an exit, if it was that quick)
  c.pid_ = pid;
  c.start_time_ = start_time;
  return c;
}

namespace {
// How long connect_supervisor tries a supervisor's name whose listen queue is full.
constexpr std::chrono::milliseconds kSupervisorConnectWait{300};
}  // namespace

ChildProcess::SupervisorHello ChildProcess::connect_supervisor(const std::string& name, int timeout_ms,
                                                               pid_t supervisor_pid) {
  SupervisorHello h;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof a.sun_path) {
    h.why = "no supervisor name";
    return h;
  }
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  // Non-blocking: a name another user bound and listens on with a full backlog would hold a
  // blocking connect() for as long as they like, and every kernel behind it.  A Unix connect
  // that cannot complete at once fails with EAGAIN; it is tried again for a short while.
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 || !raise_fd(fd)) {
    h.why = std::string("socket: ") + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return h;
  }
  const auto deadline = std::chrono::steady_clock::now() + kSupervisorConnectWait;
  for (;;) {
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), len) == 0) break;
    const int err = errno;
    if ((err == EAGAIN || err == EINTR) && std::chrono::steady_clock::now() < deadline) {
      ::usleep(20000);
      continue;
    }
    h.no_answer = err == EAGAIN;
    h.why = err == ECONNREFUSED ? "its supervisor is gone"
            : err == EAGAIN     ? "its supervisor's socket did not accept a connection within " +
                                  std::to_string(kSupervisorConnectWait.count()) +
                                  " ms (its listen queue is full: another process may hold the name)"
                                : std::string("connect: ") + std::strerror(err);
    ::close(fd);
    return h;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // the link is read as before
  // An abstract name is anyone's to bind: who answers is known only from the kernel's record
  // of the peer, never from what it says.
  ucred cred{};
  socklen_t clen = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
    h.why = std::string("SO_PEERCRED: ") + std::strerror(errno);
    ::close(fd);
    return h;
  }
  if (cred.uid != ::geteuid() || (supervisor_pid > 0 && cred.pid != supervisor_pid)) {
    h.impostor = true;
    h.why = "its supervisor's socket is held by pid " + std::to_string(cred.pid) + " of uid " +
            std::to_string(cred.uid) + ", not by the kgate-supervise of uid " + std::to_string(::geteuid()) +
            (supervisor_pid > 0 ? " (pid " + std::to_string(supervisor_pid) + ")" : std::string()) +
            " that kgate started; refused";
    ::close(fd);
    return h;
  }
  return read_hello(fd, {}, timeout_ms);
}

// The "pid <pid> <start>" line a supervisor sends a kgate it accepted; `rest` is what was read
// past an earlier line.  Closes `fd` on failure.
ChildProcess::SupervisorHello ChildProcess::read_hello(int fd, std::string rest, int timeout_ms) {
  ChildProcess::SupervisorHello h;
  h.rest = std::move(rest);
  std::string line;
  if (!read_line(fd, h.rest, line, timeout_ms)) {
    h.why = "its supervisor did not answer";
    ::close(fd);
    return h;
  }
  const auto hello = parse_supervisor_pid_line(line);
  if (!hello || hello->version > kSupervisorLinkVersion) {
    // A newer kgate started it, or a node runs a newer kgate-supervise (remote-launchers.md).
    h.why = hello ? "its supervisor speaks " + link_versions(hello->version) +
                        " (a newer kgate or kgate-supervise started it)"
                  : "its supervisor said: " + line;
    ::close(fd);
    return h;
  }
  h.fd = fd;
  h.pid = hello->pid;
  h.start_time = hello->start_time;
  return h;
}

ChildProcess::SupervisorHello ChildProcess::connect_node(const std::string& ip, int port,
                                                       const std::string& key,
                                                       const std::string& kernel_id, int timeout_ms) {
  SupervisorHello h;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (port <= 0 || port > 65535 || ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) {
    h.why = "not an IPv4 address and port: " + ip + ":" + std::to_string(port);
    return h;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 || !raise_fd(fd)) {
    h.why = std::string("socket: ") + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return h;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Keepalive: a node that vanishes (power, network) is noticed without a write.
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  int idle = 30, intvl = 10, cnt = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    h.why = std::string("connect: ") + std::strerror(errno);
    ::close(fd);
    return h;
  }
  pollfd p{fd, POLLOUT, 0};
  int err = 0;
  socklen_t elen = sizeof err;
  if (::poll(&p, 1, timeout_ms) != 1 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err != 0) {
    h.why = "connect: " + std::string(err ? std::strerror(err) : "timed out");
    ::close(fd);
    return h;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string rest, line;
  auto send_line = [fd](const std::string& l) {
    const std::string msg = l + "\n";
    return ::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(msg.size());
  };
  auto refuse = [&h, fd](std::string why) {
    h.why = std::move(why);
    ::close(fd);
    return h;
  };
  if (!read_line(fd, rest, line, timeout_ms))
    return refuse("the node launcher did not send its challenge");
  if (line.rfind("challenge ", 0) == 0)
    return refuse("the node launcher speaks the one-way control link of an older kgate (it never proves it "
                  "holds the kernel's key); refused");
  if (line.rfind("challenge2 ", 0) != 0) return refuse("the node launcher did not send its challenge");
  const std::string node_challenge = line.substr(11);
  // The launcher proves it holds the key before kgate answers anything: whoever took the node's
  // port (or a dropped ssh -L port) learns nothing and gets nothing.
  const std::string mine = random_hex(16);
  if (!send_line("prove " + mine)) return refuse(std::string("send: ") + std::strerror(errno));
  if (!read_line(fd, rest, line, timeout_ms)) return refuse("the node launcher did not answer kgate's challenge");
  if (line.rfind("proof ", 0) != 0 || !control_link_proof_check(key, kernel_id, mine, node_challenge, line.substr(6)))
    return refuse("the control link's peer failed kgate's challenge: it is not the kernel's node launcher; refused");
  if (!send_line("auth " + control_link_answer(key, kernel_id, node_challenge)))
    return refuse(std::string("send: ") + std::strerror(errno));
  // What came after the challenge (nothing, normally) goes before the hello.
  SupervisorHello hello = read_hello(fd, std::move(rest), timeout_ms);
  if (hello.fd < 0 && hello.why == "its supervisor did not answer") hello.why = "the node launcher refused the control link's answer";
  return hello;
}

void ChildProcess::tell_supervisor(const std::string& line) {
  std::string msg = line + "\n";
  const char* p = msg.data();
  std::size_t left = msg.size();
  while (left > 0) {  // a few bytes into an empty socket buffer: never blocks in practice
    const ssize_t n = ::send(sup_fd_, p, left, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the supervisor is gone: read_supervisor() will say so
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

bool ChildProcess::read_supervisor(int timeout_ms) {
  if (reaped_) return true;
  pollfd p{sup_fd_, POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return false;
  bool eof = false;
  for (;;) {
    char buf[512];
    const ssize_t n = ::recv(sup_fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      eof = errno != EAGAIN;
      break;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    sup_in_.append(buf, static_cast<std::size_t>(n));
    if (sup_in_.size() > 4096) sup_in_.erase(0, sup_in_.size() - 4096);  // bounded: lines are short
  }
  for (auto nl = sup_in_.find('\n'); nl != std::string::npos; nl = sup_in_.find('\n')) {
    std::string line = sup_in_.substr(0, nl);
    sup_in_.erase(0, nl + 1);
    int st = 0;
    if (std::sscanf(line.c_str(), "exit %d", &st) == 1) {
      reaped_ = true;
      status_ = st;
      break;  // what follows (a node launcher's relaunch: a new "pid" line) is take_link()'s
    }
  }
  if (!reaped_ && eof) {
    // The supervisor died without a word (SIGKILL, OOM): its kernel dies with it
    // (PR_SET_PDEATHSIG), and is killed here too if it is still the same process.
    sup_lost_ = true;
    reaped_ = true;
    status_ = 0;
    if (!remote_ && start_time_ != 0 && process_start_time(pid_) == start_time_) ::killpg(pid_, SIGKILL);
  }
  if (reaped_ && sup_pid_ > 0) {  // it exits right after its last line: collect it
    int st = 0;
    for (int i = 0; i < 200; ++i) {
      const pid_t w = ::waitpid(sup_pid_, &st, WNOHANG);
      if (w == sup_pid_ || (w < 0 && errno == ECHILD)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    sup_pid_ = -1;
  }
  return reaped_;
}

bool ChildProcess::take_link(int& fd, std::string& rest) {
  if (sup_fd_ < 0 || !reaped_ || sup_lost_) return false;
  fd = sup_fd_;
  rest = std::move(sup_in_);
  sup_in_.clear();
  sup_fd_ = -1;
  return true;
}

bool ChildProcess::try_reap() {
  if (sup_fd_ >= 0) return read_supervisor(0);
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
  if (sup_fd_ >= 0) {
    const auto until = clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
    for (;;) {
      int left = -1;
      if (timeout_ms >= 0) {
        left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now()).count());
        if (left <= 0) return try_reap();
      }
      if (read_supervisor(left)) return true;
    }
  }
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
  if (sup_fd_ >= 0) return tell_supervisor("signal " + std::to_string(sig) + " group");
  if (remote_) return;  // its pid is another host's
  if (::killpg(pid_, sig) != 0 && (errno == ESRCH || errno == EPERM)) ::kill(pid_, sig);
}

void ChildProcess::signal(int sig) {
  if (!running()) return;
  if (sup_fd_ >= 0) return tell_supervisor("signal " + std::to_string(sig) + " pid");
  if (remote_) return;
  ::kill(pid_, sig);
}

std::string ChildProcess::describe_exit() const {
  if (pid_ <= 0) return "not started";
  if (!reaped_) return "still running";
  if (sup_lost_) return "ended with its supervisor (which was killed; the kernel's own status is unknown)";
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
  int in_fd = -1;
  if (!opts.stdin_file.empty()) {
    in_fd = ::open(opts.stdin_file.c_str(), O_RDONLY | O_CLOEXEC);
    if (in_fd < 0) {
      r.spawn_errno = errno;
      r.spawn_error = opts.stdin_file.string() + ": " + std::strerror(errno);
      close_all();
      return r;
    }
    lo.stdin_fd = in_fd;
  }
  struct CloseIn {
    int& fd;
    ~CloseIn() { close_fd(fd); }
  } close_in{in_fd};
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
