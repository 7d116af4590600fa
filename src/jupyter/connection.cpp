// Connection files, Jupyter directory lookup and random identifiers (getrandom).
#include "kgate/jupyter/connection.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <signal.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

namespace kgate {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string errno_text(int err) { return std::strerror(err); }

// An environment variable, or "" when unset.
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// ---- ConnectionInfo JSON fields --------------------------------------------------------

const json& require(const json& j, const char* field) {
  const auto it = j.find(field);
  if (it == j.end()) throw std::runtime_error(std::string("missing field '") + field + "'");
  return *it;
}

int get_port(const json& j, const char* field) {
  const json& v = require(j, field);
  if (!v.is_number_integer()) {
    throw std::runtime_error(std::string("field '") + field + "' must be an integer");
  }
  const bool in_range = v.is_number_unsigned() ? v.get<std::uint64_t>() <= 65535
                                               : (v.get<std::int64_t>() >= 0 &&
                                                  v.get<std::int64_t>() <= 65535);
  if (!in_range) {
    throw std::runtime_error(std::string("field '") + field + "' is not a valid port (0-65535)");
  }
  return static_cast<int>(v.get<std::int64_t>());
}

std::string get_string(const json& j, const char* field) {
  const json& v = require(j, field);
  if (!v.is_string()) {
    throw std::runtime_error(std::string("field '") + field + "' must be a string");
  }
  return v.get<std::string>();
}

// An optional string field: `fallback` when absent, an error when present but not a string.
std::string get_string_or(const json& j, const char* field, std::string fallback) {
  if (!j.contains(field)) return fallback;
  return get_string(j, field);
}

// ---- random ids ------------------------------------------------------------------------

// The kernel's random source (getrandom(2), the pool OpenSSL seeds from too).  Not OpenSSL's
// RAND_bytes: its first call loads openssl.cnf and registers OpenSSL's ciphers and digests,
// which was 3.4 MB of kgate-mcp's memory and a few ms of its start, for one agent id.
void random_fill(unsigned char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("getrandom failed: ") + std::strerror(errno));
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
}

std::array<unsigned char, 16> random_uuid4() {
  std::array<unsigned char, 16> b{};
  random_fill(b.data(), b.size());
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  return b;
}

std::string format_uuid(bool dashes) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto b = random_uuid4();
  std::string out;
  out.reserve(36);
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (dashes && (i == 4 || i == 6 || i == 8 || i == 10)) out.push_back('-');
    out.push_back(kHex[b[i] >> 4]);
    out.push_back(kHex[b[i] & 0x0f]);
  }
  return out;
}

// ---- file helpers ----------------------------------------------------------------------

[[noreturn]] void fail(const fs::path& path, const std::string& what) {
  throw std::runtime_error(path.string() + ": " + what);
}

void write_all(int fd, std::string_view data, const fs::path& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "write: " + errno_text(errno));
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

// ---- ConnectionInfo --------------------------------------------------------------------

std::string ConnectionInfo::endpoint(int port) const {
  const std::string p = std::to_string(port);
  if (transport == "ipc") return "ipc://" + ip + "-" + p;
  return transport + "://" + ip + ":" + p;
}

json ConnectionInfo::to_json() const {
  json j = {
      {"shell_port", shell_port},
      {"iopub_port", iopub_port},
      {"stdin_port", stdin_port},
      {"control_port", control_port},
      {"hb_port", hb_port},
      {"ip", ip},
      {"key", key},
      {"transport", transport},
      {"signature_scheme", signature_scheme},
      {"kernel_name", kernel_name},
  };
  if (!jupyter_session.empty()) j["jupyter_session"] = jupyter_session;
  return j;
}

ConnectionInfo ConnectionInfo::from_json(const json& j) {
  if (!j.is_object()) throw std::runtime_error("connection info is not a JSON object");
  ConnectionInfo c;
  c.shell_port = get_port(j, "shell_port");
  c.iopub_port = get_port(j, "iopub_port");
  c.stdin_port = get_port(j, "stdin_port");
  c.control_port = get_port(j, "control_port");
  c.hb_port = get_port(j, "hb_port");
  c.ip = get_string(j, "ip");
  c.key = get_string(j, "key");
  // Older writers omit these; jupyter_client falls back to the same defaults.
  c.transport = get_string_or(j, "transport", "tcp");
  if (c.transport != "tcp" && c.transport != "ipc") {
    throw std::runtime_error("field 'transport' must be \"tcp\" or \"ipc\", got \"" +
                             c.transport + "\"");
  }
  c.signature_scheme = get_string_or(j, "signature_scheme", "hmac-sha256");
  c.kernel_name = get_string_or(j, "kernel_name", "");
  c.jupyter_session = get_string_or(j, "jupyter_session", "");
  return c;
}

std::vector<fs::path> ipc_socket_paths(const ConnectionInfo& c) {
  std::vector<fs::path> out;
  if (c.transport != "ipc") return out;
  for (int port : {c.shell_port, c.iopub_port, c.stdin_port, c.control_port, c.hb_port})
    if (port > 0) out.emplace_back(c.ip + "-" + std::to_string(port));
  return out;
}

void remove_ipc_sockets(const ConnectionInfo& c) {
  auto paths = ipc_socket_paths(c);
  if (!paths.empty()) paths.emplace_back(c.ip + "-pipe");  // ipykernel's IOPub pipe, moved there (kernel side)
  for (const auto& p : paths) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(p.c_str());
  }
}

ConnectionInfo load_connection_info(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(path, "is a directory, not a connection file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open connection file: " + errno_text(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail(path, "cannot read connection file");
  const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail(path, "connection file is not valid JSON");
  try {
    return ConnectionInfo::from_json(j);
  } catch (const std::runtime_error& e) {
    fail(path, e.what());
  }
}

void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const fs::path tmp = dir / ("." + path.filename().string() + "." + new_hex_id() + ".tmp");

  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) fail(path, "cannot create " + tmp.string() + ": " + errno_text(errno));
  try {
    if (::fchmod(fd, 0600) != 0) fail(path, "fchmod: " + errno_text(errno));
    write_all(fd, text, path);
    if (::fsync(fd) != 0) fail(path, "fsync: " + errno_text(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(path, "close: " + errno_text(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(path, "rename: " + errno_text(err));
  }
  // Make the rename itself durable; best effort, the file is already in place.
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_connection_file(const fs::path& path, const ConnectionInfo& info) {
  write_file_atomically(path, info.to_json().dump(2) + "\n");
}

namespace {

// The state letter and start time of `pid` from /proc/<pid>/stat; false when there is none.
bool proc_stat(int pid, char& state, unsigned long long& start, int* session = nullptr) {
  if (pid <= 0) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return false;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so count from the last ')'.
  auto close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 3) state = field.empty() ? '?' : field[0];
    if (i == 6 && session) *session = std::atoi(field.c_str());  // field 6: the session id
    if (i == 22) {  // field 22: starttime
      start = std::strtoull(field.c_str(), nullptr, 10);
      return true;
    }
  }
  return false;
}

constexpr std::string_view kOwnerPrefix = ".kgate-owner-";
fs::path owner_path(const fs::path& dir, const std::string& id) {
  return dir / (std::string(kOwnerPrefix) + id + ".json");
}

}  // namespace

unsigned long long process_start_time(int pid) {
  char state = '?';
  unsigned long long start = 0;
  return proc_stat(pid, state, start) ? start : 0;
}

void write_owner_file(const fs::path& runtime_dir, const std::string& id) {
  const json j = {{"kgate_pid", ::getpid()}, {"kgate_pid_start", process_start_time(::getpid())}};
  write_file_atomically(owner_path(runtime_dir, id), j.dump() + "\n");
}

void remove_owner_file(const fs::path& runtime_dir, const std::string& id) {
  std::error_code ec;
  fs::remove(owner_path(runtime_dir, id), ec);
}

std::vector<std::string> remove_stale_connection_files(const fs::path& runtime_dir, const std::set<std::string>& keep) {
  std::vector<std::string> removed;
  std::error_code ec;
  std::vector<fs::path> owners;
  for (fs::directory_iterator it(runtime_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kOwnerPrefix, 0) == 0 && name.size() > kOwnerPrefix.size() + 5 &&
        name.compare(name.size() - 5, 5, ".json") == 0)
      owners.push_back(it->path());
  }
  for (auto& file : owners) {
    const std::string name = file.filename().string();
    const std::string id = name.substr(kOwnerPrefix.size(), name.size() - kOwnerPrefix.size() - 5);
    if (keep.count(id)) continue;  // a kernel that outlived its kgate, to be re-adopted
    std::ifstream in(file, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    const json j = json::parse(text.str(), nullptr, false);
    if (!j.is_object()) continue;
    auto pid = j.find("kgate_pid");
    auto start = j.find("kgate_pid_start");
    if (pid == j.end() || !pid->is_number_integer() || start == j.end() || !start->is_number_unsigned()) continue;
    const int owner = pid->get<int>();
    if (owner <= 0) continue;
    // The owner is alive when its pid names a running process that started when it did. A
    // zombie (killed, not yet reaped by its parent) is gone too.
    bool alive;
    char state = '?';
    unsigned long long started = 0;
    if (proc_stat(owner, state, started))
      alive = state != 'Z' && state != 'X' &&
              (start->get<unsigned long long>() == 0 || started == start->get<unsigned long long>());
    else
      alive = fs::exists("/proc/self") ? false : (::kill(owner, 0) == 0 || errno == EPERM);
    if (alive) continue;
    for (const std::string prefix : {"kernel-", "pool-"}) {
      const std::string conn = prefix + id + ".json";
      // Its ipc sockets first, while the file still names them (only those in this dir).
      try {
        const ConnectionInfo info = load_connection_info(runtime_dir / conn);
        if (info.transport == "ipc" && fs::path(info.ip).parent_path() == runtime_dir) remove_ipc_sockets(info);
      } catch (const std::exception&) {
      }
      if (fs::remove(runtime_dir / conn, ec)) removed.push_back(conn);
      ec.clear();
    }
    fs::remove(file, ec);
  }
  return removed;
}

// ---- Jupyter directories ---------------------------------------------------------------

fs::path home_dir() {
  if (auto h = env("HOME"); !h.empty() && h.front() == '/') return h;
  std::array<char, 4096> buf{};
  passwd pw{};
  passwd* result = nullptr;
  if (getpwuid_r(getuid(), &pw, buf.data(), buf.size(), &result) == 0 && result && result->pw_dir &&
      result->pw_dir[0] == '/') {
    return result->pw_dir;
  }
  return "/";
}

fs::path config_home() {
  if (auto x = env("XDG_CONFIG_HOME"); !x.empty() && x.front() == '/') return x;
  return home_dir() / ".config";
}

fs::path kgate_config_dir() { return config_home() / "kgate"; }

fs::path state_home() {
  if (auto x = env("XDG_STATE_HOME"); !x.empty() && x.front() == '/') return x;
  return home_dir() / ".local" / "state";
}

fs::path jupyter_data_dir() {
  if (auto d = env("JUPYTER_DATA_DIR"); !d.empty()) return d;
  std::string xdg = env("XDG_DATA_HOME");
  if (xdg.empty()) xdg = (home_dir() / ".local" / "share").string();
  return fs::path(xdg) / "jupyter";
}

fs::path jupyter_runtime_dir() {
  if (auto d = env("JUPYTER_RUNTIME_DIR"); !d.empty()) return d;
  return jupyter_data_dir() / "runtime";
}

void ensure_private_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir, "cannot create directory: " + ec.message());
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) fail(dir, errno_text(errno));
  if (!S_ISDIR(st.st_mode)) fail(dir, "not a directory");
  // Another user's directory (even one root could chmod) is theirs to fill: its owner could put
  // files where kgate's are looked for (a connection file an attach command names).
  if (st.st_uid != ::geteuid())
    fail(dir, "owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
                  std::to_string(::geteuid()) + "); give kgate a directory of its own");
  if ((st.st_mode & 0777) != 0700 && ::chmod(dir.c_str(), 0700) != 0) fail(dir, "chmod 0700: " + errno_text(errno));
  check_parents(dir);
}

void check_parents(const fs::path& dir) {
  // The real path: a symlink on the way is resolved once, here, and its target's folders checked.
  char* real = ::realpath(dir.c_str(), nullptr);
  if (!real) fail(dir, "realpath: " + errno_text(errno));
  const fs::path path(real);
  std::free(real);
  const uid_t me = ::geteuid();
  std::vector<fs::path> parents{"/"};
  for (const auto& part : path.relative_path()) parents.push_back(parents.back() / part);
  parents.pop_back();  // `dir` itself: the caller's
  for (const auto& folder : parents) {
    struct stat st {};
    if (::lstat(folder.c_str(), &st) != 0) fail(dir, folder.string() + ": " + errno_text(errno));
    if (st.st_uid != 0 && st.st_uid != me)
      fail(dir, "its parent folder " + folder.string() + " is owned by uid " + std::to_string(st.st_uid) +
                    ", who could swap a folder or a symlink on the way after kgate checked it; give kgate a "
                    "directory whose every parent is root's or yours");
    const bool sticky_roots = st.st_uid == 0 && (st.st_mode & S_ISVTX);  // /tmp: nobody moves what is not theirs
    const bool others_write =
        (st.st_mode & S_IWOTH) || ((st.st_mode & S_IWGRP) && st.st_gid != ::getegid() && st.st_gid != 0);
    if (others_write && !sticky_roots) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
      fail(dir, "its parent folder " + folder.string() + " is writable by other users (mode " + mode +
                    "), who could swap a folder or a symlink on the way after kgate checked it; give kgate a "
                    "directory whose every parent only root or you can write to");
    }
  }
}

// ---- random ids ------------------------------------------------------------------------

std::string new_uuid() { return format_uuid(true); }
std::string new_hex_id() { return format_uuid(false); }

std::string random_hex(std::size_t bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::vector<unsigned char> b(bytes);
  random_fill(b.data(), bytes);
  std::string out;
  out.reserve(2 * bytes);
  for (unsigned char c : b) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 0x0f]);
  }
  return out;
}

bool tcp_accepts(const std::string& ip, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1 &&
                  ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

namespace {
// Adds each LISTEN entry of a /proc/net/tcp-format table to `out` as {port, socket inode}; false
// when the table cannot be read.  A line: "sl local_address rem_address st tx:rx tr:when
// retrnsmt uid timeout inode ...", the address as hex "ADDR:PORT", st 0A for LISTEN.
bool listening_sockets(const char* table, std::vector<std::pair<int, unsigned long long>>& out) {
  std::ifstream in(table);
  std::string line;
  if (!in || !std::getline(in, line)) return false;  // the heading
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, st, queues, timer, retransmits, uid, timeout;
    unsigned long long inode = 0;
    if (!(f >> sl >> local >> remote >> st >> queues >> timer >> retransmits >> uid >> timeout >> inode)) continue;
    const auto colon = local.rfind(':');
    if (st != "0A" || colon == std::string::npos) continue;
    int port = 0;
    const char* first = local.data() + colon + 1;
    const char* last = local.data() + local.size();
    if (auto r = std::from_chars(first, last, port, 16); r.ec != std::errc{} || r.ptr != last) continue;
    out.emplace_back(port, inode);
  }
  return true;
}
}  // namespace

TcpListeners session_tcp_listeners(int sid) {
  // The listeners first, then the session's descriptors: a socket's descriptor exists before it
  // listens, so every listener of the session read here is found below.  (The other order
  // would count one that began listening between the two reads as another process's.)
  std::vector<std::pair<int, unsigned long long>> listeners;
  TcpListeners out;
  out.readable = listening_sockets("/proc/net/tcp", listeners);
  listening_sockets("/proc/net/tcp6", listeners);  // absent without IPv6
  if (!out.readable) return out;
  std::set<unsigned long long> inodes;
  std::error_code ec;
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int pid = 0, session = -1;
    char state = '?';
    unsigned long long start = 0;
    if (auto r = std::from_chars(name.data(), name.data() + name.size(), pid);
        r.ec != std::errc{} || r.ptr != name.data() + name.size() || !proc_stat(pid, state, start, &session) ||
        session != sid)
      continue;
    std::error_code fec;
    for (fs::directory_iterator fd(it->path() / "fd", fec), fend; !fec && fd != fend; fd.increment(fec)) {
      char buf[64];
      const ssize_t n = ::readlink(fd->path().c_str(), buf, sizeof buf);
      if (n <= 0) continue;
      const std::string_view target(buf, static_cast<std::size_t>(n));
      constexpr std::string_view prefix = "socket:[";
      if (target.size() <= prefix.size() + 1 || target.substr(0, prefix.size()) != prefix || target.back() != ']') continue;
      unsigned long long inode = 0;
      const char* last = target.data() + target.size() - 1;
      if (auto r = std::from_chars(target.data() + prefix.size(), last, inode); r.ec == std::errc{} && r.ptr == last)
        inodes.insert(inode);
    }
  }
  for (const auto& [port, inode] : listeners) (inodes.count(inode) ? out.own : out.others).insert(port);
  return out;
}

std::vector<int> pick_ports(const std::string& ip, std::size_t n, const std::set<int>& avoid) {
  std::vector<int> ports;
  std::vector<int> fds;
  for (int tries = 0; ports.size() < n && tries < 100; ++tries) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = 0;
    if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      break;
    }
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    fds.push_back(fd);
    int port = ntohs(a.sin_port);
    if (!avoid.count(port)) ports.push_back(port);
  }
  for (int fd : fds) ::close(fd);
  if (ports.size() < n) throw std::runtime_error("cannot reserve TCP ports for a kernel on " + ip);
  return ports;
}

}  // namespace kgate
