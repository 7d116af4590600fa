// Unit tests for connection files, Jupyter directories, random ids and jupyter_client interop.
#include "kgate/jupyter/connection.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <csignal>
#include <memory>
#include <unistd.h>

#include <fstream>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kgate/jupyter/state_dir.hpp"
#include "kgate/jupyter/wire.hpp"
#include "support.hpp"

namespace kgate {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ---- helpers ---------------------------------------------------------------------------

using kgate::test::matches_pattern;
using kgate::test::read_file;
using kgate::test::TempDir;

// Sets (or, with nullopt, unsets) an environment variable, restoring it at scope exit.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    apply(value);
  }
  ~ScopedEnv() { apply(old_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void apply(const std::optional<std::string>& v) {
    if (v) {
      ::setenv(name_.c_str(), v->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  std::string name_;
  std::optional<std::string> old_;
};

unsigned file_mode(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) throw std::runtime_error("stat failed: " + p.string());
  return st.st_mode & 07777;
}

// Runs a Python script (written to `dir`) with the given argument; returns its stdout.
std::string run_python(const fs::path& dir, const std::string& script, const fs::path& arg) {
  const test::CommandResult r = test::run_python_script(dir, script, {arg.string()});
  if (r.status != 0) throw std::runtime_error("python failed (" + std::to_string(r.status) + "): " + r.output);
  return r.output;
}

ConnectionInfo sample_info() {
  ConnectionInfo c;
  c.transport = "tcp";
  c.ip = "127.0.0.1";
  c.shell_port = 50001;
  c.iopub_port = 50002;
  c.stdin_port = 50003;
  c.control_port = 50004;
  c.hb_port = 50005;
  c.key = "k\xc3\xa9y-\xe9\x8d\xb5-" + new_uuid();  // "kéy-鍵-<uuid>"
  c.signature_scheme = "hmac-sha256";
  c.kernel_name = "python3";
  return c;
}

void expect_same(const ConnectionInfo& a, const ConnectionInfo& b) {
  EXPECT_EQ(a.transport, b.transport);
  EXPECT_EQ(a.ip, b.ip);
  EXPECT_EQ(a.shell_port, b.shell_port);
  EXPECT_EQ(a.iopub_port, b.iopub_port);
  EXPECT_EQ(a.stdin_port, b.stdin_port);
  EXPECT_EQ(a.control_port, b.control_port);
  EXPECT_EQ(a.hb_port, b.hb_port);
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.signature_scheme, b.signature_scheme);
  EXPECT_EQ(a.kernel_name, b.kernel_name);
  EXPECT_EQ(a.jupyter_session, b.jupyter_session);
}

// Runs `f`, expecting a std::runtime_error whose message contains every one of `needles`.
template <typename F>
void expect_error_mentions(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown";
  } catch (const std::runtime_error& e) {
    for (const auto& n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
    }
  }
}

// ---- ConnectionInfo --------------------------------------------------------------------

TEST(ConnectionInfo, JsonRoundTrip) {
  ConnectionInfo c = sample_info();
  json j = c.to_json();
  EXPECT_EQ(j.size(), 10u);
  EXPECT_FALSE(j.contains("jupyter_session"));
  for (const char* port : {"shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"}) {
    EXPECT_TRUE(j.at(port).is_number_integer()) << port;
  }
  EXPECT_EQ(j.at("shell_port"), 50001);
  EXPECT_EQ(j.at("key"), c.key);
  expect_same(ConnectionInfo::from_json(j), c);

  c.jupyter_session = "/home/u/notebook.ipynb";
  j = c.to_json();
  EXPECT_EQ(j.size(), 11u);
  EXPECT_EQ(j.at("jupyter_session"), c.jupyter_session);
  expect_same(ConnectionInfo::from_json(j), c);
}

TEST(ConnectionInfo, Endpoint) {
  ConnectionInfo c;
  c.ip = "10.1.2.3";
  EXPECT_EQ(c.endpoint(5555), "tcp://10.1.2.3:5555");
  c.transport = "ipc";
  c.ip = "/tmp/kernel-abc";
  EXPECT_EQ(c.endpoint(3), "ipc:///tmp/kernel-abc-3");
}

TEST(ConnectionInfo, OptionalFieldsDefault) {
  const json j = {{"shell_port", 1}, {"iopub_port", 2}, {"stdin_port", 3},
                  {"control_port", 4}, {"hb_port", 5}, {"ip", "0.0.0.0"}, {"key", ""}};
  const ConnectionInfo c = ConnectionInfo::from_json(j);
  EXPECT_EQ(c.transport, "tcp");
  EXPECT_EQ(c.signature_scheme, "hmac-sha256");
  EXPECT_EQ(c.kernel_name, "");
  EXPECT_EQ(c.jupyter_session, "");
  EXPECT_EQ(c.hb_port, 5);
  EXPECT_EQ(c.ip, "0.0.0.0");
}

TEST(ConnectionInfo, MissingFieldIsNamed) {
  const json full = sample_info().to_json();
  for (const char* field :
       {"shell_port", "iopub_port", "stdin_port", "control_port", "hb_port", "ip", "key"}) {
    SCOPED_TRACE(field);
    json j = full;
    j.erase(field);
    expect_error_mentions([&] { ConnectionInfo::from_json(j); }, {field, "missing"});
  }
}

TEST(ConnectionInfo, MistypedFieldIsNamed) {
  const json full = sample_info().to_json();
  const std::pair<const char*, json> bad[] = {
      {"shell_port", "5555"},  {"iopub_port", 1.5},     {"stdin_port", -1},
      {"control_port", 65536}, {"hb_port", nullptr},   {"hb_port", json::array()},
      {"shell_port", true},    {"ip", 127},             {"key", nullptr},
      {"key", json::object()}, {"transport", 1},        {"transport", "udp"},
      {"signature_scheme", 256}, {"kernel_name", false}, {"jupyter_session", 7},
      {"iopub_port", std::uint64_t{1} << 63},
  };
  for (const auto& [field, value] : bad) {
    SCOPED_TRACE(std::string(field) + " = " + value.dump());
    json j = full;
    j[field] = value;
    expect_error_mentions([&] { ConnectionInfo::from_json(j); }, {field});
  }
  EXPECT_THROW(ConnectionInfo::from_json(json::array()), std::runtime_error);
  EXPECT_THROW(ConnectionInfo::from_json(json("text")), std::runtime_error);
  json edge = full;
  edge["shell_port"] = 0;
  edge["hb_port"] = 65535;
  EXPECT_EQ(ConnectionInfo::from_json(edge).hb_port, 65535);
}

// ---- files -----------------------------------------------------------------------------

TEST(ConnectionFile, WriteReadRoundTripMode0600) {
  TempDir dir{"kgate-conn"};
  const fs::path file = dir.path() / "kernel-1.json";
  ConnectionInfo c = sample_info();
  c.jupyter_session = "sess";
  write_connection_file(file, c);
  EXPECT_EQ(file_mode(file), 0600u);
  expect_same(load_connection_info(file), c);

  const std::string text = read_file(file);
  EXPECT_EQ(json::parse(text), c.to_json());
  EXPECT_NE(text.find("\n  \"control_port\": 50004"), std::string::npos) << text;  // indent 2
  // Nothing but the file itself is left in the directory.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 1);
}

TEST(ConnectionFile, ModeIs0600RegardlessOfUmask) {
  TempDir dir{"kgate-conn"};
  const mode_t old = ::umask(0);
  const fs::path file = dir.path() / "k.json";
  write_connection_file(file, sample_info());
  ::umask(old);
  EXPECT_EQ(file_mode(file), 0600u);
}

TEST(ConnectionFile, OverwritesAtomically) {
  TempDir dir{"kgate-conn"};
  const fs::path file = dir.path() / "k.json";
  std::ofstream(file) << "old contents that are longer than the new file would ever be ..."
                      << std::string(4096, '.');
  fs::permissions(file, fs::perms(0644));
  ConnectionInfo c = sample_info();
  write_connection_file(file, c);
  EXPECT_EQ(file_mode(file), 0600u);
  expect_same(load_connection_info(file), c);
  c.shell_port = 1;
  write_connection_file(file, c);
  EXPECT_EQ(load_connection_info(file).shell_port, 1);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 1);
}

TEST(ConnectionFile, WriteErrors) {
  TempDir dir{"kgate-conn"};
  const fs::path missing = dir.path() / "no" / "such" / "k.json";
  expect_error_mentions([&] { write_connection_file(missing, sample_info()); },
                        {missing.string()});
  EXPECT_FALSE(fs::exists(missing));
}

TEST(ConnectionFile, LoadErrorsNamePathAndReason) {
  TempDir dir{"kgate-conn"};
  const fs::path missing = dir.path() / "absent.json";
  expect_error_mentions([&] { load_connection_info(missing); },
                        {missing.string(), "No such file"});

  const fs::path garbage = dir.path() / "garbage.json";
  std::ofstream(garbage) << "{ not json";
  expect_error_mentions([&] { load_connection_info(garbage); }, {garbage.string(), "JSON"});

  const fs::path partial = dir.path() / "partial.json";
  json j = sample_info().to_json();
  j.erase("iopub_port");
  std::ofstream(partial) << j.dump();
  expect_error_mentions([&] { load_connection_info(partial); },
                        {partial.string(), "iopub_port"});

  expect_error_mentions([&] { load_connection_info(dir.path()); }, {dir.path().string()});
}

// ---- directories -----------------------------------------------------------------------

TEST(Dirs, EnsurePrivateDir) {
  TempDir dir{"kgate-conn"};
  const fs::path nested = dir.path() / "a" / "b" / "runtime";
  ensure_private_dir(nested);
  EXPECT_TRUE(fs::is_directory(nested));
  EXPECT_EQ(file_mode(nested), 0700u);

  const fs::path open_dir = dir.path() / "open";
  fs::create_directory(open_dir);
  fs::permissions(open_dir, fs::perms(0755));
  ensure_private_dir(open_dir);
  EXPECT_EQ(file_mode(open_dir), 0700u);
  ensure_private_dir(open_dir);  // idempotent
  EXPECT_EQ(file_mode(open_dir), 0700u);

  const fs::path file = dir.path() / "file";
  std::ofstream(file) << "x";
  EXPECT_THROW(ensure_private_dir(file), std::runtime_error);
  EXPECT_THROW(ensure_private_dir(file / "sub"), std::runtime_error);
}

// A folder on the way that someone else could change refuses the dir: a world-writable one, or
// one of another user's; root's sticky /tmp-like folders and symlinks to good places are fine.
TEST(Dirs, EveryParentMustBeRootsOrOursAndClosedToOthers) {
  TempDir dir{"kgate-parents"};
  auto message = [](const fs::path& p) {
    try {
      ensure_private_dir(p);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const fs::path open = dir.path() / "open";
  fs::create_directory(open);
  ::chmod(open.c_str(), 0777);
  EXPECT_NE(message(open / "runtime").find("its parent folder " + open.string() + " is writable by other users (mode 0777)"),
            std::string::npos)
      << message(open / "runtime");
  // Through a symlink to it: the real path is what counts.
  fs::create_directory_symlink(open, dir.path() / "link");
  EXPECT_NE(message(dir.path() / "link" / "runtime").find("is writable by other users"), std::string::npos);
  if (::geteuid() == 0) {  // root's sticky folder, like /tmp
    ::chmod(open.c_str(), 01777);
    EXPECT_EQ(message(open / "runtime"), "");
    const fs::path theirs = dir.path() / "theirs";
    fs::create_directory(theirs);
    ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
    EXPECT_NE(message(theirs / "runtime").find("is owned by uid 65534"), std::string::npos) << message(theirs / "runtime");
  }
  ::chmod(open.c_str(), 0755);
  EXPECT_EQ(message(dir.path() / "link" / "fine"), "");
}

TEST(Dirs, DataDirFromEnvironment) {
  ScopedEnv home("HOME", "/home/tester");
  {
    ScopedEnv d("JUPYTER_DATA_DIR", "/custom/data");
    ScopedEnv x("XDG_DATA_HOME", "/xdg");
    EXPECT_EQ(jupyter_data_dir(), fs::path("/custom/data"));
  }
  {
    ScopedEnv d("JUPYTER_DATA_DIR", "");
    ScopedEnv x("XDG_DATA_HOME", "/xdg");
    EXPECT_EQ(jupyter_data_dir(), fs::path("/xdg/jupyter"));
  }
  {
    ScopedEnv d("JUPYTER_DATA_DIR", std::nullopt);
    ScopedEnv x("XDG_DATA_HOME", "");
    EXPECT_EQ(jupyter_data_dir(), fs::path("/home/tester/.local/share/jupyter"));
  }
  {
    ScopedEnv d("JUPYTER_DATA_DIR", std::nullopt);
    ScopedEnv x("XDG_DATA_HOME", std::nullopt);
    EXPECT_EQ(jupyter_data_dir(), fs::path("/home/tester/.local/share/jupyter"));
  }
}

TEST(Dirs, RuntimeDirFromEnvironment) {
  ScopedEnv d("JUPYTER_DATA_DIR", "/data");
  {
    ScopedEnv r("JUPYTER_RUNTIME_DIR", "/run/user/1000/jupyter");
    EXPECT_EQ(jupyter_runtime_dir(), fs::path("/run/user/1000/jupyter"));
  }
  {
    ScopedEnv r("JUPYTER_RUNTIME_DIR", "");
    EXPECT_EQ(jupyter_runtime_dir(), fs::path("/data/runtime"));
  }
  {
    ScopedEnv r("JUPYTER_RUNTIME_DIR", std::nullopt);
    EXPECT_EQ(jupyter_runtime_dir(), fs::path("/data/runtime"));
  }
}

TEST(Dirs, RuntimeDirMatchesJupyterCore) {
  TempDir dir{"kgate-conn"};
  ScopedEnv home("HOME", dir.path().string());
  ScopedEnv d("JUPYTER_DATA_DIR", std::nullopt);
  ScopedEnv x("XDG_DATA_HOME", std::nullopt);
  ScopedEnv r("JUPYTER_RUNTIME_DIR", std::nullopt);
  ScopedEnv p("JUPYTER_PLATFORM_DIRS", std::nullopt);
  const std::string out = run_python(dir.path(),
                                     "import sys, jupyter_core.paths as p\n"
                                     "print(p.jupyter_data_dir())\n"
                                     "print(p.jupyter_runtime_dir())\n",
                                     "");
  EXPECT_EQ(out, jupyter_data_dir().string() + "\n" + jupyter_runtime_dir().string() + "\n");
}

// ---- random ids ------------------------------------------------------------------------

TEST(Ids, UuidFormatAndUniqueness) {
  std::set<std::string> seen;
  for (int i = 0; i < 2000; ++i) {
    const std::string u = new_uuid();
    const std::string h = new_hex_id();
    ASSERT_TRUE(matches_pattern(u, "xxxxxxxx-xxxx-4xxx-Vxxx-xxxxxxxxxxxx")) << u;
    ASSERT_TRUE(matches_pattern(h, "xxxxxxxxxxxx4xxxVxxxxxxxxxxxxxxx")) << h;
    seen.insert(u);
    seen.insert(h);
  }
  EXPECT_EQ(seen.size(), 4000u);
}

// ---- interop with jupyter_client -------------------------------------------------------

// ---- stale files of a kgate that is gone -----------------------------------------------

// A pid that no longer names a process: a child that exited and was reaped.
int dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

TEST(StaleFiles, ProcessStartTime) {
  EXPECT_GT(process_start_time(::getpid()), 0u);
  EXPECT_EQ(process_start_time(::getpid()), process_start_time(::getpid()));
  EXPECT_EQ(process_start_time(dead_pid()), 0u);
  EXPECT_EQ(process_start_time(0), 0u);
}

namespace {
// A TCP socket on 127.0.0.1, bound to a port the system picks; listening when `listen` says so.
int loopback_socket(bool listen, int& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || (listen && ::listen(fd, 1) != 0)) return -1;
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}
}  // namespace

// How the node launcher tells its kernel's listeners from another process's on a given port.
TEST(SessionListeners, OwnListenersOnlyAndOnlyWhileListening) {
  int listening_port = 0, bound_port = 0;
  const int listening = loopback_socket(true, listening_port);
  const int bound = loopback_socket(false, bound_port);
  ASSERT_GE(listening, 0);
  ASSERT_GE(bound, 0);
  auto mine = kgate::session_tcp_listeners(static_cast<int>(::getsid(0)));
  EXPECT_TRUE(mine.readable);
  EXPECT_TRUE(mine.own.count(listening_port));
  EXPECT_FALSE(mine.others.count(listening_port));
  EXPECT_FALSE(mine.own.count(bound_port) || mine.others.count(bound_port));  // bound, not listening

  // A process in a session of its own listens on a port: it is in its session's set, not ours.
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::setsid();
    int port = 0;
    const int fd = loopback_socket(true, port);
    (void)fd;
    (void)!::write(pipefd[1], &port, sizeof port);
    ::pause();
    ::_exit(0);
  }
  int child_port = 0;
  ASSERT_EQ(::read(pipefd[0], &child_port, sizeof child_port), static_cast<ssize_t>(sizeof child_port));
  EXPECT_TRUE(kgate::session_tcp_listeners(child).own.count(child_port));
  EXPECT_FALSE(kgate::session_tcp_listeners(child).others.count(child_port));
  auto ours = kgate::session_tcp_listeners(static_cast<int>(::getsid(0)));
  EXPECT_FALSE(ours.own.count(child_port));
  EXPECT_TRUE(ours.others.count(child_port));  // another session's listener
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(pipefd[0]);
  ::close(pipefd[1]);

  ::close(listening);
  ::close(bound);
  auto after = kgate::session_tcp_listeners(static_cast<int>(::getsid(0)));
  EXPECT_FALSE(after.own.count(listening_port) || after.others.count(listening_port));
  EXPECT_TRUE(kgate::session_tcp_listeners(999999999).own.empty());  // no such session
}

TEST(StaleFiles, OnlyFilesOfAGoneKgateAreRemoved) {
  TempDir dir{"kgate-stale"};
  // A kernel's connection file, and its owner file naming `pid` started at `start`.
  auto kernel = [&](const std::string& id, int pid, unsigned long long start, const char* prefix = "kernel-") {
    write_connection_file(dir.path() / (prefix + id + ".json"), sample_info());
    std::ofstream(dir.path() / (".kgate-owner-" + id + ".json"))
        << json{{"kgate_pid", pid}, {"kgate_pid_start", start}}.dump();
  };
  const unsigned long long me = process_start_time(::getpid());
  kernel("dead", dead_pid(), 99);                // its kgate is gone
  kernel("pooled", dead_pid(), 99, "pool-");     // a warm-pool file, same
  kernel("reused", ::getpid(), me + 1);          // the pid was reused by another process
  kernel("live", ::getpid(), me);                // a live kgate's (this process)
  write_connection_file(dir.path() / "kernel-other.json", sample_info());  // no owner: not kgate's
  std::ofstream(dir.path() / ".kgate-owner-garbage.json") << "{not json";
  // write_owner_file names this process
  write_owner_file(dir.path(), "mine");
  write_connection_file(dir.path() / "kernel-mine.json", sample_info());
  EXPECT_EQ(read_file(dir.path() / ".kgate-owner-mine.json"),
            json({{"kgate_pid", ::getpid()}, {"kgate_pid_start", me}}).dump() + "\n");
  // A kgate killed but not yet reaped by its parent is a zombie: gone as well.
  const pid_t zombie = ::fork();
  if (zombie == 0) ::_exit(0);
  ASSERT_GT(zombie, 0);
  unsigned long long zombie_start = 0;
  for (int i = 0; i < 200 && !zombie_start; ++i) zombie_start = process_start_time(zombie);
  kernel("zombie", zombie, zombie_start);
  for (int i = 0; i < 500; ++i) {  // until it has exited (state Z), without reaping it
    std::ifstream st("/proc/" + std::to_string(zombie) + "/stat");
    std::string line;
    std::getline(st, line);
    if (line.find(") Z ") != std::string::npos) break;
    ::usleep(2000);
  }
  auto removed = remove_stale_connection_files(dir.path());
  int status = 0;
  ::waitpid(zombie, &status, 0);
  std::set<std::string> got(removed.begin(), removed.end());
  EXPECT_EQ(got, (std::set<std::string>{"kernel-dead.json", "pool-pooled.json", "kernel-reused.json",
                                        "kernel-zombie.json"}));
  for (auto name : {"kernel-live.json", ".kgate-owner-live.json", "kernel-other.json", "kernel-mine.json",
                    ".kgate-owner-garbage.json"})
    EXPECT_TRUE(fs::exists(dir.path() / name)) << name;
  for (auto& name : got) EXPECT_FALSE(fs::exists(dir.path() / name)) << name;
  for (auto id : {"dead", "pooled", "reused", "zombie"})
    EXPECT_FALSE(fs::exists(dir.path() / (std::string(".kgate-owner-") + id + ".json"))) << id;
  remove_owner_file(dir.path(), "mine");
  EXPECT_FALSE(fs::exists(dir.path() / ".kgate-owner-mine.json"));
  EXPECT_TRUE(remove_stale_connection_files(dir.path() / "missing").empty());
}

TEST(Interop, JupyterClientLoadsOurFile) {
  TempDir dir{"kgate-conn"};
  const fs::path file = dir.path() / "kernel-ours.json";
  const ConnectionInfo c = sample_info();
  write_connection_file(file, c);
  const std::string out = run_python(dir.path(), R"PY(
import json, sys
from jupyter_client import BlockingKernelClient
with open(sys.argv[1]) as f:
    raw = json.load(f)
kc = BlockingKernelClient()
kc.load_connection_file(sys.argv[1])
print(json.dumps({
    "raw": raw,
    "shell_url": kc._make_url("shell"),
    "hb_url": kc._make_url("hb"),
    "key": kc.session.key.decode("utf-8"),
    "scheme": kc.session.signature_scheme,
    "sig": kc.session.sign([b'{"a": 1}', b"{}", b"{}", "{\"t\": \"\u00e9\"}".encode()]).decode(),
}))
)PY",
                                     file);
  const json j = json::parse(out);
  expect_same(ConnectionInfo::from_json(j.at("raw")), c);
  EXPECT_EQ(j.at("shell_url"), c.endpoint(c.shell_port));
  EXPECT_EQ(j.at("hb_url"), c.endpoint(c.hb_port));
  EXPECT_EQ(j.at("key"), c.key);
  EXPECT_EQ(j.at("scheme"), c.signature_scheme);
  const Signer signer(c.key, c.signature_scheme);
  EXPECT_EQ(j.at("sig"), signer.sign(R"({"a": 1})", "{}", "{}", "{\"t\": \"\xc3\xa9\"}"));
}

TEST(Interop, WeLoadJupyterClientFile) {
  TempDir dir{"kgate-conn"};
  const fs::path file = dir.path() / "kernel-theirs.json";
  const std::string out = run_python(dir.path(), R"PY(
import json, os, stat, sys
from jupyter_client.connect import write_connection_file
fname, cfg = write_connection_file(fname=sys.argv[1], ip="127.0.0.1",
                                   key="cl\u00e9-\U0001F511".encode("utf-8"),
                                   signature_scheme="hmac-sha512", kernel_name="python3")
cfg["mode"] = stat.S_IMODE(os.stat(fname).st_mode)
print(json.dumps(cfg))
)PY",
                                     file);
  const json cfg = json::parse(out);
  const ConnectionInfo c = load_connection_info(file);
  EXPECT_EQ(c.transport, "tcp");
  EXPECT_EQ(c.ip, "127.0.0.1");
  EXPECT_EQ(c.shell_port, cfg.at("shell_port").get<int>());
  EXPECT_EQ(c.iopub_port, cfg.at("iopub_port").get<int>());
  EXPECT_EQ(c.stdin_port, cfg.at("stdin_port").get<int>());
  EXPECT_EQ(c.control_port, cfg.at("control_port").get<int>());
  EXPECT_EQ(c.hb_port, cfg.at("hb_port").get<int>());
  EXPECT_GT(c.shell_port, 0);
  EXPECT_EQ(c.key, "cl\xc3\xa9-\xf0\x9f\x94\x91");
  EXPECT_EQ(c.signature_scheme, "hmac-sha512");
  EXPECT_EQ(c.kernel_name, "python3");
  EXPECT_EQ(cfg.at("mode"), 0600);

  // And our rewrite of it round-trips through jupyter_client's own fields unchanged.
  const fs::path copy = dir.path() / "copy.json";
  write_connection_file(copy, c);
  json theirs = json::parse(read_file(file));
  EXPECT_EQ(json::parse(read_file(copy)), theirs);
}

TEST(Interop, IpcTransport) {
  TempDir dir{"kgate-conn"};
  const fs::path file = dir.path() / "kernel-ipc.json";
  ConnectionInfo c = sample_info();
  c.transport = "ipc";
  c.ip = (dir.path() / "kernel-ipc").string();
  write_connection_file(file, c);
  const std::string out = run_python(dir.path(), R"PY(
import sys
from jupyter_client import BlockingKernelClient
kc = BlockingKernelClient()
kc.load_connection_file(sys.argv[1])
print(kc._make_url("iopub"))
)PY",
                                     file);
  EXPECT_EQ(out, c.endpoint(c.iopub_port) + "\n");
}

// A stale kgate's ipc kernel: its sockets go with its connection file; a regular file at one of
// the names, and the sockets of a live kgate's kernel, stay.
TEST(StaleFiles, IpcSocketsOfAGoneKgateAreRemovedAndNothingElse) {
  TempDir dir{"kgate-ipc"};
  auto bind_at = [](const fs::path& p) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", p.c_str());
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << p;
    ::close(fd);
  };
  auto ipc = [&](const std::string& id) {
    ConnectionInfo c = sample_info();
    c.transport = "ipc";
    c.ip = (dir.path() / ("kernel-" + id + "-ipc")).string();
    c.shell_port = 1, c.iopub_port = 2, c.stdin_port = 3, c.control_port = 4, c.hb_port = 5;
    return c;
  };
  const ConnectionInfo dead = ipc("dead"), live = ipc("live");
  for (const auto& c : {dead, live}) {
    ASSERT_EQ(ipc_socket_paths(c).size(), 5u);
    for (const auto& p : ipc_socket_paths(c)) bind_at(p);
  }
  fs::remove(ipc_socket_paths(dead)[4]);
  std::ofstream(ipc_socket_paths(dead)[4]) << "not a socket";
  write_connection_file(dir.path() / "kernel-dead.json", dead);
  std::ofstream(dir.path() / ".kgate-owner-dead.json") << json{{"kgate_pid", dead_pid()}, {"kgate_pid_start", 9}}.dump();
  write_connection_file(dir.path() / "kernel-live.json", live);
  write_owner_file(dir.path(), "live");
  EXPECT_EQ(remove_stale_connection_files(dir.path()), std::vector<std::string>{"kernel-dead.json"});
  for (std::size_t i = 0; i < 4; ++i) EXPECT_FALSE(fs::exists(ipc_socket_paths(dead)[i])) << i;
  EXPECT_TRUE(fs::is_regular_file(ipc_socket_paths(dead)[4]));
  for (const auto& p : ipc_socket_paths(live)) EXPECT_TRUE(fs::is_socket(p)) << p;
  remove_ipc_sockets(live);
  for (const auto& p : ipc_socket_paths(live)) EXPECT_FALSE(fs::exists(p)) << p;
  EXPECT_TRUE(ipc_socket_paths(sample_info()).empty());  // tcp: none
}

// ---- the state directory (state_dir.hpp) ----------------------------------------------

TEST(StateDir, DefaultFollowsXdgStateHomeWhenAbsolute) {
  ScopedEnv home("HOME", "/home/someone");
  {
    ScopedEnv x("XDG_STATE_HOME", "/var/lib/st");
    EXPECT_EQ(default_state_dir(), fs::path("/var/lib/st/kgate"));
  }
  {
    ScopedEnv x("XDG_STATE_HOME", "relative/st");  // the spec ignores a relative path
    EXPECT_EQ(default_state_dir(), fs::path("/home/someone/.local/state/kgate"));
  }
  ScopedEnv x("XDG_STATE_HOME", std::nullopt);
  EXPECT_EQ(default_state_dir(), fs::path("/home/someone/.local/state/kgate"));
}

TEST(StateDir, IsCreatedPrivateWithALockFileNamingItsHolder) {
  TempDir tmp("kgate-state");
  fs::path dir = tmp.path() / "a" / "b" / "kgate";
  StateDir sd = StateDir::open(dir);
  EXPECT_TRUE(sd.held());
  EXPECT_EQ(sd.path(), dir);
  EXPECT_EQ(file_mode(dir), 0700u);
  EXPECT_EQ(file_mode(dir / "kgate.lock"), 0600u);
  EXPECT_EQ(read_file(dir / "kgate.lock"), std::to_string(::getpid()) + "\n");
  EXPECT_FALSE(sd.tightened());
}

TEST(StateDir, ASecondHolderIsRefusedWithTheFirstOnesPid) {
  TempDir tmp("kgate-state");
  StateDir first = StateDir::open(tmp.path() / "kgate");
  try {
    StateDir second = StateDir::open(tmp.path() / "kgate");
    FAIL() << "a second open of a held state directory succeeded";
  } catch (const std::runtime_error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find((tmp.path() / "kgate").string()), std::string::npos) << what;
    EXPECT_NE(what.find("another kgate (pid " + std::to_string(::getpid()) + ")"), std::string::npos) << what;
    EXPECT_NE(what.find("--state-dir"), std::string::npos) << what;
  }
  // The refusal changed nothing: the holder's pid is still in the file.
  EXPECT_EQ(read_file(tmp.path() / "kgate" / "kgate.lock"), std::to_string(::getpid()) + "\n");
}

TEST(StateDir, TheLockGoesWithItsHolderAndMovesWithIt) {
  TempDir tmp("kgate-state");
  fs::path dir = tmp.path() / "kgate";
  StateDir moved;
  {
    StateDir a = StateDir::open(dir);
    moved = std::move(a);
    EXPECT_FALSE(a.held());  // NOLINT(bugprone-use-after-move): the moved-from object holds nothing
  }
  EXPECT_TRUE(moved.held());
  EXPECT_THROW(StateDir::open(dir), std::runtime_error);  // `a` going did not release it
  moved = StateDir();
  StateDir again = StateDir::open(dir);  // a stale lock file is no obstacle
  EXPECT_TRUE(again.held());
}

TEST(StateDir, AChildProcessDoesNotInheritTheLock) {
  TempDir tmp("kgate-state");
  fs::path dir = tmp.path() / "kgate";
  auto sd = std::make_unique<StateDir>(StateDir::open(dir));
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Let the child reach exec (close-on-exec applies there).
  for (int i = 0; i < 200; ++i) {
    std::ifstream comm("/proc/" + std::to_string(child) + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "sleep") break;
    ::usleep(10000);
  }
  sd.reset();
  bool reopened = false;
  try {
    StateDir again = StateDir::open(dir);
    reopened = again.held();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "the child kept the lock: " << e.what();
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(reopened);
}

TEST(StateDir, ADirectoryOpenToOthersIsMadePrivate) {
  TempDir tmp("kgate-state");
  fs::path dir = tmp.path() / "kgate";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  StateDir sd = StateDir::open(dir);
  EXPECT_TRUE(sd.tightened());
  EXPECT_EQ(file_mode(dir), 0700u);
}

TEST(StateDir, APathThatIsNotADirectoryIsRefused) {
  TempDir tmp("kgate-state");
  fs::path file = tmp.path() / "kgate";
  std::ofstream(file) << "x";
  try {
    StateDir::open(file);
    FAIL() << "a regular file was taken as the state directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kgate
