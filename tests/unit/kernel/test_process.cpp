// Unit tests for child-process launching: exec errors, cwd, env, sessions, signals, pidfds, PDEATHSIG,
// and the signal mask of kgate's worker thread.
#include "kgate/process/process.hpp"
#include "kgate/process/supervisor.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <system_error>
#include <thread>

#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kgate/jupyter/connection.hpp"
#include "kgate/kernel/kernel.hpp"
#include "support.hpp"

namespace kgate {
namespace {

namespace fs = std::filesystem;

const std::map<std::string, std::string> kMinimalEnv{{"PATH", "/usr/bin:/bin"}};

using kgate::test::read_file;
using kgate::test::TempDir;

// Kills (the group of) a child still running at the end of a test, so failures leave no strays.
struct KillOnExit {
  ChildProcess& child;
  ~KillOnExit() {
    if (child.running()) {
      child.signal_group(SIGKILL);
      child.wait_for_exit(2000);
    }
  }
};

ChildProcess launch(std::vector<std::string> argv,
                    std::map<std::string, std::string> env = kMinimalEnv, fs::path cwd = {}) {
  LaunchOptions o;
  o.argv = std::move(argv);
  o.env = std::move(env);
  o.cwd = std::move(cwd);
  return ChildProcess::launch(o);
}

// True while `pid` exists and is not a zombie (orphans may be reaped late, or never, by pid 1).
bool alive(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state != 'Z' && state != 'X';
}

bool wait_dead(pid_t pid, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (alive(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Waits for `path` to hold a complete line and returns it without the newline.
std::string wait_line(const fs::path& path, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const std::string s = read_file(path);
    if (!s.empty() && s.back() == '\n') return s.substr(0, s.size() - 1);
    if (std::chrono::steady_clock::now() > deadline) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// The hex mask of a "SigBlk:"/"SigIgn:" line of /proc/<pid>/status.
unsigned long long status_mask(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1), nullptr, 16);
  }
  ADD_FAILURE() << "no " << key << " in /proc/" << pid << "/status";
  return ~0ULL;
}

unsigned long long sigbit(int sig) { return 1ULL << (sig - 1); }

TEST(Launch, ExitCode) {
  ChildProcess c = launch({"/bin/sh", "-c", "exit 3"});
  EXPECT_GT(c.pid(), 0);
  ASSERT_TRUE(c.wait_for_exit(5000));
  EXPECT_FALSE(c.running());
  EXPECT_TRUE(WIFEXITED(c.status()));
  EXPECT_EQ(WEXITSTATUS(c.status()), 3);
  EXPECT_EQ(c.describe_exit(), "exited with code 3");
  EXPECT_TRUE(c.try_reap());  // idempotent
}

TEST(Launch, NonexistentProgramThrowsEnoent) {
  for (const std::string prog : {"/nonexistent/kgate-no-such-prog", "kgate-no-such-prog-xyz"}) {
    try {
      launch({prog});
      ADD_FAILURE() << "expected std::system_error for " << prog;
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code().value(), ENOENT) << e.what();
      EXPECT_NE(std::string(e.what()).find("cannot launch " + prog), std::string::npos) << e.what();
    }
  }
}

TEST(Launch, NotExecutableThrowsEacces) {
  TempDir t{"kgate-proc", TempDir::canonical};
  const fs::path f = t.path() / "plain";
  std::ofstream(f) << "#!/bin/sh\nexit 0\n";
  try {
    launch({f.string()});
    ADD_FAILURE() << "expected std::system_error";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), EACCES) << e.what();
  }
}

TEST(Launch, EmptyArgvThrows) { EXPECT_THROW(launch({}), std::system_error); }

TEST(Launch, Cwd) {
  TempDir t{"kgate-proc", TempDir::canonical};
  ChildProcess c = launch({"/bin/sh", "-c", "/bin/pwd -P > out.txt"}, kMinimalEnv, t.path());
  ASSERT_TRUE(c.wait_for_exit(5000));
  EXPECT_EQ(c.describe_exit(), "exited with code 0");
  EXPECT_EQ(read_file(t.path() / "out.txt"), t.path().string() + "\n");
}

TEST(Launch, BadCwdThrows) {
  try {
    launch({"/bin/true"}, kMinimalEnv, "/nonexistent/kgate/dir");
    ADD_FAILURE() << "expected std::system_error";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT) << e.what();
    EXPECT_NE(std::string(e.what()).find("/nonexistent/kgate/dir"), std::string::npos) << e.what();
  }
}

TEST(Launch, EnvironmentIsExactlyTheGivenOne) {
  TempDir t{"kgate-proc", TempDir::canonical};
  const std::map<std::string, std::string> env{
      {"PATH", "/usr/bin:/bin"}, {"KGATE_A", "alpha beta"}, {"KGATE_EMPTY", ""}, {"LC_ALL", "C"}};
  const fs::path out = t.path() / "env.txt";
  ChildProcess d = launch({"/bin/sh", "-c", "exec /usr/bin/env -0 > \"$0\"", out.string()}, env);
  KillOnExit k{d};
  ASSERT_TRUE(d.wait_for_exit(5000));
  ASSERT_EQ(d.describe_exit(), "exited with code 0");
  std::set<std::string> got;
  const std::string text = read_file(out);
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t z = text.find('\0', i);
    got.insert(text.substr(i, z - i));
    i = z == std::string::npos ? text.size() : z + 1;
  }
  got.erase("PWD=" + fs::current_path().string());  // a shell may export PWD; nothing else
  got.erase("PWD=" + fs::canonical(fs::current_path()).string());
  got.erase("SHLVL=1");
  std::set<std::string> want;
  for (const auto& [k2, v] : env) want.insert(k2 + "=" + v);
  EXPECT_EQ(got, want);
}

TEST(Launch, EnvironmentSeenInProcEnviron) {
  const std::map<std::string, std::string> env{{"PATH", "/usr/bin:/bin"}, {"KGATE_X", "1=2"}};
  ChildProcess c = launch({"sleep", "10"}, env);
  KillOnExit k{c};
  const std::string raw = read_file("/proc/" + std::to_string(c.pid()) + "/environ");
  EXPECT_EQ(raw, std::string("KGATE_X=1=2\0PATH=/usr/bin:/bin\0", 31));
}

TEST(Launch, BareNameResolvedOnEnvPath) {
  TempDir t{"kgate-proc", TempDir::canonical};
  const fs::path prog = t.path() / "kgate-test-prog";
  std::ofstream(prog) << "#!/bin/sh\nexit 7\n";
  fs::permissions(prog, fs::perms::owner_all);
  ChildProcess c = launch({"kgate-test-prog"}, {{"PATH", t.path().string()}});
  ASSERT_TRUE(c.wait_for_exit(5000));
  EXPECT_EQ(c.describe_exit(), "exited with code 7");
}

TEST(Launch, StdinIsDevNull) {
  TempDir t{"kgate-proc", TempDir::canonical};
  ChildProcess c = launch({"/bin/sh", "-c", "readlink /proc/self/fd/0 > in.txt"}, kMinimalEnv,
                          t.path());
  ASSERT_TRUE(c.wait_for_exit(5000));
  EXPECT_EQ(read_file(t.path() / "in.txt"), "/dev/null\n");
}

TEST(Launch, OwnSessionAndGroup) {
  ChildProcess c = launch({"sleep", "10"});
  KillOnExit k{c};
  EXPECT_EQ(::getsid(c.pid()), c.pid());
  EXPECT_EQ(::getpgid(c.pid()), c.pid());
  EXPECT_NE(::getsid(c.pid()), ::getsid(0));
}

TEST(Launch, SignalStateIsReset) {
  sigset_t block, old_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &block, &old_mask), 0);
  struct sigaction ign {}, old_term{}, old_pipe{};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGTERM, &ign, &old_term);
  ::sigaction(SIGPIPE, &ign, &old_pipe);

  ChildProcess c = launch({"sleep", "10"});

  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);

  KillOnExit k{c};
  EXPECT_EQ(status_mask(c.pid(), "SigBlk"), 0ULL);
  const unsigned long long ignored = status_mask(c.pid(), "SigIgn");
  EXPECT_EQ(ignored & (sigbit(SIGINT) | sigbit(SIGTERM) | sigbit(SIGPIPE)), 0ULL) << std::hex
                                                                                    << ignored;
}

TEST(Launch, NoLeakedDescriptors) {
  const int fd = ::open("/dev/null", O_RDONLY);  // not CLOEXEC
  ASSERT_GE(fd, 3);
  ChildProcess c = launch({"sleep", "10"});
  ::close(fd);
  KillOnExit k{c};
  EXPECT_FALSE(fs::exists("/proc/" + std::to_string(c.pid()) + "/fd/" + std::to_string(fd)));
}

TEST(Signal, GroupKillsSleepAndGrandchild) {
  TempDir t{"kgate-proc", TempDir::canonical};
  const fs::path pidfile = t.path() / "gc.pid";
  ChildProcess c = launch({"/bin/sh", "-c", "sleep 30 & echo $! > \"$0\"; wait", pidfile.string()});
  KillOnExit k{c};
  const std::string gc = wait_line(pidfile, 3000);
  ASSERT_FALSE(gc.empty());
  const pid_t grandchild = std::stoi(gc);
  EXPECT_TRUE(alive(grandchild));
  c.signal_group(SIGKILL);
  ASSERT_TRUE(c.wait_for_exit(2000));
  EXPECT_EQ(c.describe_exit(), "killed by signal SIGKILL");
  EXPECT_TRUE(wait_dead(grandchild, 2000));
  c.signal_group(SIGKILL);  // no-op once reaped
  c.signal(SIGKILL);
}

TEST(Signal, SignalOnlyTheProcess) {
  ChildProcess c = launch({"sleep", "10"});
  KillOnExit k{c};
  EXPECT_FALSE(c.wait_for_exit(30));
  EXPECT_TRUE(c.running());
  EXPECT_EQ(c.describe_exit(), "still running");
  c.signal(SIGTERM);
  ASSERT_TRUE(c.wait_for_exit(2000));
  EXPECT_EQ(c.describe_exit(), "killed by signal SIGTERM");
}

TEST(Signal, TryReapPollsWithoutBlocking) {
  ChildProcess c = launch({"sleep", "10"});
  KillOnExit k{c};
  EXPECT_FALSE(c.try_reap());
  c.signal(SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!c.try_reap() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_FALSE(c.running());
  EXPECT_EQ(c.describe_exit(), "killed by signal SIGKILL");
}

TEST(Pidfd, BecomesReadableOnExit) {
  ChildProcess c = launch({"sleep", "10"});
  KillOnExit k{c};
  ASSERT_GE(c.exit_fd(), 0);
  EXPECT_NE(::fcntl(c.exit_fd(), F_GETFD) & FD_CLOEXEC, 0);
  pollfd p{c.exit_fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0);
  c.signal(SIGKILL);
  p.revents = 0;
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  EXPECT_TRUE(p.revents & POLLIN);
  EXPECT_TRUE(c.try_reap());
}

TEST(Move, TransfersOwnership) {
  ChildProcess a = launch({"/bin/sh", "-c", "exit 5"});
  const pid_t pid = a.pid();
  const int fd = a.exit_fd();
  ChildProcess b(std::move(a));
  EXPECT_EQ(a.pid(), -1);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(a.exit_fd(), -1);
  EXPECT_FALSE(a.running());
  EXPECT_FALSE(a.try_reap());
  EXPECT_EQ(b.pid(), pid);
  EXPECT_EQ(b.exit_fd(), fd);
  ChildProcess c;
  c = std::move(b);
  EXPECT_EQ(b.pid(), -1);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(c.pid(), pid);
  ASSERT_TRUE(c.wait_for_exit(5000));
  EXPECT_EQ(c.describe_exit(), "exited with code 5");
}

TEST(Move, DestructorClosesPidfdButDoesNotKill) {
  pid_t pid;
  int fd;
  {
    ChildProcess c = launch({"sleep", "10"});
    pid = c.pid();
    fd = c.exit_fd();
  }
  EXPECT_TRUE(alive(pid));
  if (fd >= 0) {
    EXPECT_EQ(::fcntl(fd, F_GETFD), -1);
  }
  ::kill(pid, SIGKILL);
  int st = 0;
  EXPECT_EQ(::waitpid(pid, &st, 0), pid);
}

// Forks an intermediate process (a copy of this test) that launches `sleep 60` with the given
// die_with_parent, SIGKILLs and reaps the intermediate, and returns the grandchild's pid.
pid_t orphan_a_grandchild(bool die_with_parent) {
  int p[2];
  if (::pipe(p) != 0) return -1;
  const pid_t mid = ::fork();
  if (mid < 0) return -1;
  if (mid == 0) {
    ::close(p[0]);
    pid_t gc = -1;
    try {
      LaunchOptions o;
      o.argv = {"sleep", "60"};
      o.env = kMinimalEnv;
      o.die_with_parent = die_with_parent;
      ChildProcess c = ChildProcess::launch(o);
      gc = c.pid();
    } catch (...) {
    }
    if (::write(p[1], &gc, sizeof gc) != static_cast<ssize_t>(sizeof gc)) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(p[1]);
  pid_t grandchild = -1;
  if (::read(p[0], &grandchild, sizeof grandchild) != static_cast<ssize_t>(sizeof grandchild)) {
    grandchild = -1;
  }
  ::close(p[0]);
  if (grandchild > 0 && !alive(grandchild)) ADD_FAILURE() << "grandchild not running";
  ::kill(mid, SIGKILL);
  ::waitpid(mid, nullptr, 0);
  return grandchild;
}

TEST(DeathSignal, GrandchildDiesWithItsParent) {
  const pid_t grandchild = orphan_a_grandchild(true);
  ASSERT_GT(grandchild, 0);
  const bool died = wait_dead(grandchild, 2000);
  if (!died) ::kill(grandchild, SIGKILL);
  EXPECT_TRUE(died);
}

TEST(DeathSignal, WithoutItTheGrandchildSurvives) {
  const pid_t grandchild = orphan_a_grandchild(false);
  ASSERT_GT(grandchild, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(alive(grandchild));
  ::kill(grandchild, SIGKILL);
  EXPECT_TRUE(wait_dead(grandchild, 2000));
}

// ---------------------------------------------------------------------------------------
// Supervised launches (kgate-supervise, docs/dev/readoption.md): the ChildProcess stands for the kernel

int g_sup_seq = 0;

LaunchOptions supervised(std::vector<std::string> argv, std::chrono::milliseconds orphan = std::chrono::milliseconds(0)) {
  LaunchOptions o;
  o.argv = std::move(argv);
  o.env = kMinimalEnv;
  o.supervisor = kgate::test::supervise_bin();
  o.supervisor_name = "kgate-unit-test/" + std::to_string(::getpid()) + "/" + std::to_string(++g_sup_seq);
  o.orphan_timeout = orphan;
  o.terminate_grace = std::chrono::milliseconds(500);
  return o;
}

// The parent of `pid`, from /proc/<pid>/stat (0 when gone).
pid_t parent_of(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  char state = 0;
  int ppid = 0;
  if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2) return 0;
  return ppid;
}

// A connection to a supervisor's abstract socket, as a later kgate makes.
int connect_supervisor(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string read_line_from(int fd, int timeout_ms) {
  std::string s;
  char c;
  while (s.empty() || s.back() != '\n') {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1 || ::read(fd, &c, 1) != 1) return s;
    s += c;
  }
  s.pop_back();
  return s;
}

TEST(Supervised, PidIsTheKernelsAndItsParentTheSupervisor) {
  ChildProcess c = ChildProcess::launch(supervised({"/bin/sh", "-c", "sleep 0.2; exit 7"}));
  KillOnExit k{c};
  EXPECT_TRUE(c.supervised());
  ASSERT_GT(c.pid(), 0);
  const pid_t sup = parent_of(c.pid());
  EXPECT_NE(sup, ::getpid());
  EXPECT_NE(read_file("/proc/" + std::to_string(sup) + "/cmdline").find("kgate-supervise"), std::string::npos);
  EXPECT_EQ(c.start_time(), process_start_time(c.pid()));
  EXPECT_GE(c.exit_fd(), 0);
  ASSERT_TRUE(c.wait_for_exit(5000));
  EXPECT_EQ(c.describe_exit(), "exited with code 7");
  EXPECT_TRUE(wait_dead(sup, 2000)) << "the supervisor outlived its kernel";
}

TEST(Supervised, LaunchFailuresAreReportedAsForADirectChild) {
  try {
    ChildProcess::launch(supervised({"/nonexistent/kgate-test-prog"}));
    FAIL() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT) << e.what();
  }
  TempDir d("kgate-sup");
  const auto f = d.path() / "not-exec";
  std::ofstream(f) << "#!/bin/sh\n";
  try {
    ChildProcess::launch(supervised({f.string()}));
    FAIL() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), EACCES) << e.what();
  }
  auto o = supervised({"/bin/true"});
  o.cwd = d.path() / "missing";
  try {
    ChildProcess::launch(o);
    FAIL() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), ENOENT);
    EXPECT_NE(std::string(e.what()).find("chdir to"), std::string::npos) << e.what();
  }
}

TEST(Supervised, RunsInCwdWithTheGivenEnvironment) {
  TempDir d("kgate-sup");
  auto o = supervised({"/bin/sh", "-c", "pwd > out; echo \"$KGATE_X\" >> out; echo \"$JPY_PARENT_PID $PPID\" >> out"});
  o.cwd = d.path();
  o.env["KGATE_X"] = "value with spaces";
  ChildProcess c = ChildProcess::launch(o);
  ASSERT_TRUE(c.wait_for_exit(5000));
  const std::string out = read_file(d.path() / "out");
  const std::string head = d.path().string() + "\nvalue with spaces\n";
  ASSERT_EQ(out.substr(0, head.size()), head);
  // JPY_PARENT_PID names the kernel's parent, the supervisor (ipykernel's parent poller watches it).
  int jpy = 0, ppid = 0;
  ASSERT_EQ(std::sscanf(out.c_str() + head.size(), "%d %d", &jpy, &ppid), 2) << out;
  EXPECT_EQ(jpy, ppid);
  EXPECT_NE(jpy, ::getpid());
}

TEST(Supervised, SignalsGoThroughTheSupervisor) {
  ChildProcess c = ChildProcess::launch(supervised({"sleep", "30"}));
  KillOnExit k{c};
  c.signal(SIGTERM);
  ASSERT_TRUE(c.wait_for_exit(5000));
  EXPECT_EQ(c.describe_exit(), "killed by signal SIGTERM");

  TempDir d("kgate-sup");
  ChildProcess g = ChildProcess::launch(supervised({"/bin/sh", "-c", "sleep 30 & echo $! > " + (d.path() / "gc").string() + "; wait"}));
  KillOnExit kg{g};
  const std::string gc = wait_line(d.path() / "gc", 5000);
  ASSERT_FALSE(gc.empty());
  g.signal_group(SIGKILL);
  ASSERT_TRUE(g.wait_for_exit(5000));
  EXPECT_TRUE(wait_dead(std::stoi(gc), 2000)) << "the group signal missed the grandchild";
}

TEST(Supervised, WithoutAKgateTheKernelEndsAfterTheOrphanTimeout) {
  pid_t pid;
  {
    ChildProcess c = ChildProcess::launch(supervised({"sleep", "30"}, std::chrono::milliseconds(700)));
    pid = c.pid();
  }  // this "kgate" goes: the supervisor keeps the kernel for the orphan timeout
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(alive(pid)) << "the kernel ended before the orphan timeout";
  EXPECT_TRUE(wait_dead(pid, 5000)) << "the kernel outlived the orphan timeout";
  {
    ChildProcess c = ChildProcess::launch(supervised({"sleep", "30"}));
    pid = c.pid();
  }  // orphan timeout 0: at once, as a direct child with PR_SET_PDEATHSIG
  EXPECT_TRUE(wait_dead(pid, 2000));
}

TEST(Supervised, ALaterKgateTakesOverBySocket) {
  auto o = supervised({"sleep", "30"}, std::chrono::milliseconds(500));
  pid_t pid;
  unsigned long long start;
  int fd;
  {
    ChildProcess c = ChildProcess::launch(o);
    pid = c.pid();
    start = c.start_time();
    fd = connect_supervisor(o.supervisor_name);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(read_line_from(fd, 2000), "pid " + std::to_string(pid) + " " + std::to_string(start) + " link " +
                                            std::to_string(kSupervisorLinkVersion));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_TRUE(alive(pid)) << "a connected kgate did not keep the kernel";
  ASSERT_EQ(::write(fd, "signal 15 pid\n", 14), 14);
  EXPECT_EQ(read_line_from(fd, 5000), "exit " + std::to_string(SIGTERM));  // a wait status
  EXPECT_EQ(read_line_from(fd, 2000), "");  // then the supervisor is gone
  ::close(fd);
  EXPECT_TRUE(wait_dead(pid, 2000));
  EXPECT_EQ(connect_supervisor(o.supervisor_name), -1);
}

// The supervisor link's version (docs/service.md): the pid line says it; a supervisor from before
// the field is version 1.
TEST(SupervisorLink, PidLinesOfEachVersionAreReadAndNothingElse) {
  auto v = parse_supervisor_pid_line(supervisor_pid_line(4242, 99));
  ASSERT_TRUE(v);
  EXPECT_EQ(v->pid, 4242);
  EXPECT_EQ(v->start_time, 99u);
  EXPECT_EQ(v->version, kSupervisorLinkVersion);
  v = parse_supervisor_pid_line("pid 17 123456");  // a supervisor from before the field
  ASSERT_TRUE(v);
  EXPECT_EQ(v->pid, 17);
  EXPECT_EQ(v->version, 1u);
  v = parse_supervisor_pid_line("pid 17 123456 link 7");  // a newer one: read, and refused by the caller
  ASSERT_TRUE(v);
  EXPECT_EQ(v->version, 7u);
  for (const char* bad : {"", "pid", "pid 17", "pid 0 5", "pid -1 5", "pid +17 5", "pid 17 5 link",
                          "pid 17 5 link 0", "pid 17 5 link x", "pid 17 5 lnk 2", "pid 17 5 link 2 more",
                          "pid  17 5", "pid 17 5 ", "pid 99999999999 5", "pid 17 5 link 99999999999",
                          "error 1 2", "exit 0"})
    EXPECT_FALSE(parse_supervisor_pid_line(bad)) << '"' << bad << '"';
}

// A kgate adopts no kernel whose supervisor speaks a newer link, and says so; an older one's pid
// line is read as before.
TEST(SupervisorLink, ANewerSupervisorIsNotAdoptedAndAnOlderOneIs) {
  for (const auto& [line, adopted] : std::vector<std::pair<std::string, bool>>{
           {"pid 4242 99 link " + std::to_string(kSupervisorLinkVersion + 1), false},
           {"pid 4242 99", true},
           {"pid 4242 99 link 1", true}}) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    const std::string sent = line + "\n";
    ASSERT_EQ(::write(sv[1], sent.data(), sent.size()), static_cast<ssize_t>(sent.size()));
    auto h = ChildProcess::read_hello(sv[0], {}, 2000);
    if (adopted) {
      EXPECT_EQ(h.fd, sv[0]) << line << ": " << h.why;
      EXPECT_EQ(h.pid, 4242);
      EXPECT_EQ(h.start_time, 99u);
      ::close(h.fd);
    } else {
      EXPECT_EQ(h.fd, -1) << line;
      EXPECT_EQ(h.why, "its supervisor speaks link version " + std::to_string(kSupervisorLinkVersion + 1) +
                           ", this kgate version " + std::to_string(kSupervisorLinkVersion) +
                           " (a newer kgate or kgate-supervise started it)");
    }
    ::close(sv[1]);
  }
}

// A newer kgate-supervise on disk than the running kgate (a package upgraded, kgate not yet
// restarted): the launch fails with what to do, and the supervisor it started is not left behind.
TEST(SupervisorLink, ALaunchThroughANewerSupervisorFailsWithWhatToDo) {
  TempDir d("kgate-sup");
  const auto fake = d.path() / "kgate-supervise";
  const auto pidfile = d.path() / "pid";
  std::ofstream(fake) << "#!/bin/sh\necho $$ > " << pidfile.string() << "\necho \"pid $$ 1 link "
                      << kSupervisorLinkVersion + 1 << "\" >&3\nexec sleep 30\n";
  std::filesystem::permissions(fake, std::filesystem::perms::owner_all);
  auto o = supervised({"sleep", "30"});
  o.supervisor = fake;
  try {
    ChildProcess::launch(o);
    FAIL() << "no exception";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code().value(), EPROTO) << e.what();
    EXPECT_NE(std::string(e.what()).find("speaks link version " + std::to_string(kSupervisorLinkVersion + 1) +
                                         ", this kgate version " + std::to_string(kSupervisorLinkVersion) +
                                         "; restart kgate"),
              std::string::npos)
        << e.what();
  }
  const pid_t sup = std::stoi(read_file(pidfile.string()));
  EXPECT_TRUE(wait_dead(sup, 2000)) << "the newer supervisor was left running";
}

TEST(Supervised, AKilledSupervisorTakesItsKernelAlong) {
  ChildProcess c = ChildProcess::launch(supervised({"sleep", "30"}));
  KillOnExit k{c};
  const pid_t kernel = c.pid();
  ::kill(parent_of(kernel), SIGKILL);
  ASSERT_TRUE(c.wait_for_exit(5000));
  EXPECT_NE(c.describe_exit().find("supervisor"), std::string::npos) << c.describe_exit();
  EXPECT_TRUE(wait_dead(kernel, 2000));
}

// ---------------------------------------------------------------------------------------
// run(): a program to its end, with a deadline, no shell

RunResult run_sh(const std::string& script, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  RunOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.env = kMinimalEnv;
  o.timeout = timeout;
  return run(o);
}

TEST(Run, CapturesStdoutStderrAndStatus) {
  auto r = run_sh("echo out; echo err >&2; exit 3");
  ASSERT_TRUE(r.started());
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err_head, "err\n");
  EXPECT_EQ(r.err_tail, "err\n");
  ASSERT_TRUE(WIFEXITED(r.status));
  EXPECT_EQ(WEXITSTATUS(r.status), 3);
}

TEST(Run, ArgumentsAreNotReadByAShell) {
  RunOptions o;
  o.argv = {"/bin/echo", "$HOME; rm -rf /nonexistent-kgate", "*"};
  o.env = kMinimalEnv;
  auto r = run(o);
  EXPECT_EQ(r.out, "$HOME; rm -rf /nonexistent-kgate *\n");
}

TEST(Run, RunsInCwdWithTheGivenEnvironment) {
  TempDir t{"kgate-proc", TempDir::canonical};
  RunOptions o;
  o.argv = {"/bin/sh", "-c", "pwd; echo \"$ONLY\"; echo \"${HOME:-unset}\""};
  o.env = {{"PATH", "/usr/bin:/bin"}, {"ONLY", "this"}};
  o.cwd = t.path();
  auto r = run(o);
  EXPECT_EQ(r.out, t.path().string() + "\nthis\nunset\n");
}

TEST(Run, MissingProgramIsNotStarted) {
  RunOptions o;
  o.argv = {"/nonexistent/kgate-program"};
  o.env = kMinimalEnv;
  auto r = run(o);
  EXPECT_FALSE(r.started());
  EXPECT_EQ(r.spawn_errno, ENOENT);
  EXPECT_EQ(r.spawn_error, "No such file or directory");
}

TEST(Run, DeadlineKillsTheWholeGroup) {
  TempDir t{"kgate-proc", TempDir::canonical};
  const auto pidfile = t.path() / "grandchild";
  const auto started = std::chrono::steady_clock::now();
  auto r = run_sh("sleep 30 & echo $! > " + pidfile.string() + "; wait", std::chrono::milliseconds(300));
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_TRUE(r.timed_out);
  EXPECT_LT(took, std::chrono::seconds(5));
  const pid_t grandchild = std::stoi(read_file(pidfile));
  EXPECT_TRUE(wait_dead(grandchild, 2000));  // killed with the group
}

TEST(Run, GrandchildHoldingThePipesGetsOnlyTheGrace) {
  const auto started = std::chrono::steady_clock::now();
  auto r = run_sh("sleep 30 & echo done");
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.out, "done\n");
  EXPECT_LT(took, std::chrono::seconds(5));
}

TEST(Run, StdoutPastTheBoundIsDroppedAndSaid) {
  RunOptions o;
  o.argv = {"/bin/sh", "-c", "head -c 100000 /dev/zero"};
  o.env = kMinimalEnv;
  o.max_stdout = 1000;
  auto r = run(o);
  EXPECT_TRUE(r.out_overflow);
  EXPECT_LE(r.out.size(), 1000u);
}

TEST(Run, StderrKeepsItsHeadAndTail) {
  auto r = run_sh("i=0; while [ $i -lt 500 ]; do echo line$i >&2; i=$((i+1)); done");
  EXPECT_EQ(r.err_head.size(), 1024u);
  EXPECT_EQ(r.err_head.substr(0, 6), "line0\n");
  EXPECT_EQ(r.err_tail.size(), 2048u);
  EXPECT_EQ(r.err_tail.substr(r.err_tail.size() - 8), "line499\n");
}

TEST(Run, WithoutCaptureTheChildWritesToOurs) {
  RunOptions o;
  o.argv = {"/bin/sh", "-c", "echo to-our-stdout; exit 0"};
  o.env = kMinimalEnv;
  o.capture = false;
  testing::internal::CaptureStdout();
  auto r = run(o);
  testing::internal::GetCapturedStdout();  // gtest captures the fd: the child's output lands there
  EXPECT_TRUE(r.started());
  EXPECT_TRUE(r.out.empty());
  ASSERT_TRUE(WIFEXITED(r.status));
  EXPECT_EQ(WEXITSTATUS(r.status), 0);
}

TEST(FindProgram, SearchesEnvPathThenFallsBack) {
  TempDir t{"kgate-proc", TempDir::canonical};
  const fs::path exe = t.path() / "kgate-exe";
  const fs::path plain = t.path() / "kgate-plain";
  std::ofstream(exe) << "#!/bin/sh\n";
  std::ofstream(plain) << "#!/bin/sh\n";
  fs::permissions(exe, fs::perms::owner_all);
  fs::create_directories(t.path() / "kgate-dir");
  const std::map<std::string, std::string> env{{"PATH", "/nonexistent:" + t.path().string()}};

  EXPECT_EQ(find_program("kgate-exe", env), exe.string());
  EXPECT_EQ(find_program("kgate-plain", env), "kgate-plain");  // not executable
  EXPECT_EQ(find_program("kgate-dir", env), "kgate-dir");      // a directory
  EXPECT_EQ(find_program("sh", {{"PATH", "/bin"}}), "/bin/sh");
  EXPECT_EQ(find_program("./relative/x", env), "./relative/x");
  EXPECT_EQ(find_program("/abs/x", env), "/abs/x");
  EXPECT_EQ(find_program("kgate-nowhere", env), "kgate-nowhere");
  EXPECT_EQ(find_program("", env), "");
  // No PATH in env: the process's PATH is used.
  const std::string saved = std::getenv("PATH") ? std::getenv("PATH") : "";
  ::setenv("PATH", t.path().c_str(), 1);
  EXPECT_EQ(find_program("kgate-exe", {}), exe.string());
  ::setenv("PATH", saved.c_str(), 1);
}

TEST(CurrentEnvironment, MirrorsEnviron) {
  ::setenv("KGATE_TEST_CURENV", "v=1", 1);
  const auto env = current_environment();
  ASSERT_TRUE(env.count("KGATE_TEST_CURENV"));
  EXPECT_EQ(env.at("KGATE_TEST_CURENV"), "v=1");
  ::unsetenv("KGATE_TEST_CURENV");
  EXPECT_FALSE(current_environment().count("KGATE_TEST_CURENV"));
}

// The signal mask of a thread, from /proc/self/task/<tid>/status (SigBlk, hex).
unsigned long long blocked_mask(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("SigBlk:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  return 0;
}

bool blocks(unsigned long long mask, int sig) { return (mask >> (sig - 1)) & 1ULL; }

pid_t thread_named(const std::string& name) {
  for (auto& e : fs::directory_iterator("/proc/self/task")) {
    std::ifstream f(e.path() / "comm");
    std::string comm;
    std::getline(f, comm);
    if (comm == name) return static_cast<pid_t>(std::stol(e.path().filename().string()));
  }
  return -1;
}

TEST(WorkerSignals, AsyncSignalsAreBlockedFaultsAreNot) {
  std::promise<unsigned long long> mask;
  std::thread t([&] {
    block_async_signals_in_this_thread();
    mask.set_value(blocked_mask(static_cast<pid_t>(::syscall(SYS_gettid))));
  });
  t.join();
  const auto m = mask.get_future().get();
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGALRM, SIGUSR1, SIGCHLD, SIGPIPE}) EXPECT_TRUE(blocks(m, sig)) << sig;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) EXPECT_FALSE(blocks(m, sig)) << sig;
}

// Found by fuzz_http: libFuzzer's SIGALRM landed on the kernel I/O thread, zmq_poll failed
// with EINTR, cppzmq threw, and the uncaught exception ended the process.  The same went for
// SIGTERM or SIGHUP (kgate has handlers for both) delivered to that thread.
TEST(WorkerSignals, SignalsAimedAtTheKernelThreadDoNotStopIt) {
  struct sigaction sa {}, old {};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART (poll is never restarted anyway)
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, &old), 0);
  {
    test::TempDir dir("kgate-sig");
    KernelManager mgr(KernelOptions{}, dir.path(), {});
    pid_t tid = -1;
    for (int i = 0; i < 200 && tid < 0; ++i) {
      tid = thread_named("kgate-io");
      if (tid < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_GT(tid, 0) << "no kgate-io thread";
    EXPECT_TRUE(blocks(blocked_mask(tid), SIGTERM));
    EXPECT_TRUE(blocks(blocked_mask(tid), SIGHUP));
    for (int i = 0; i < 50; ++i) {
      ASSERT_EQ(::syscall(SYS_tgkill, ::getpid(), tid, SIGUSR1), 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // Still serving: a request for a kernel that does not exist is answered.
    std::promise<bool> answered;
    mgr.shutdown("no-such-kernel", [&](bool ok) { answered.set_value(ok); });
    auto f = answered.get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    EXPECT_FALSE(f.get());
  }
  ::sigaction(SIGUSR1, &old, nullptr);
}

}  // namespace
}  // namespace kgate
