// kgate's state directory and its lock (state_dir.hpp).
#include "kgate/jupyter/state_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "kgate/jupyter/connection.hpp"
#include "kgate/jupyter/wire.hpp"

#include <fstream>

namespace kgate {
namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const fs::path& dir, const std::string& what) {
  throw std::runtime_error("state directory " + dir.string() + ": " + what);
}

std::string errno_text(int e) { return std::strerror(e); }

// The pid a lock file names, or "" when it names none (a holder that has not written it yet).
std::string read_pid(int fd) {
  char buf[32] = {};
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return {};
  std::string s(buf, std::size_t(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  for (char c : s)
    if (c < '0' || c > '9') return {};
  return s;
}

}  // namespace

fs::path default_state_dir() { return state_home() / "kgate"; }

StateDir StateDir::open(const fs::path& dir) {
  StateDir s;
  s.dir_ = dir;
  std::error_code ec;
  const bool existed = fs::exists(dir, ec);
  if (existed && !fs::is_directory(dir, ec)) fail(dir, "not a directory");
  fs::create_directories(dir, ec);
  if (ec) fail(dir, "cannot create it: " + ec.message());
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) fail(dir, errno_text(errno));  // a symlink to it is fine
  if (!S_ISDIR(st.st_mode)) fail(dir, "not a directory");
  if (st.st_uid != ::geteuid())
    fail(dir, "owned by uid " + std::to_string(st.st_uid) + ", not by this user (uid " +
                  std::to_string(::geteuid()) + "); give kgate a directory of its own with --state-dir");
  if ((st.st_mode & 0777) != 0700) {
    s.tightened_ = existed && (st.st_mode & 0077) != 0;
    if (::chmod(dir.c_str(), 0700) != 0) fail(dir, "chmod 0700: " + errno_text(errno));
  }
  check_parents(dir);  // no one else can swap the way to it later
  const fs::path lock = dir / "kgate.lock";
  int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) fail(dir, "cannot open " + lock.filename().string() + ": " + errno_text(errno));
  s.fd_ = fd;  // closed by ~StateDir on every path below
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    if (e != EWOULDBLOCK) fail(dir, "cannot lock " + lock.filename().string() + ": " + errno_text(e));
    std::string pid = read_pid(fd);
    fail(dir, "another kgate" + (pid.empty() ? std::string() : " (pid " + pid + ")") +
                  " is using it; stop that one, or give this one a directory of its own with --state-dir "
                  "(state_dir in kgate.toml)");
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != ssize_t(pid.size()))
    fail(dir, "cannot write " + lock.filename().string() + ": " + errno_text(errno));
  ::fchmod(fd, 0600);
  return s;
}

StateDir::StateDir(StateDir&& o) noexcept
    : dir_(std::move(o.dir_)), fd_(std::exchange(o.fd_, -1)), tightened_(o.tightened_) {}

StateDir& StateDir::operator=(StateDir&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    dir_ = std::move(o.dir_);
    fd_ = std::exchange(o.fd_, -1);
    tightened_ = o.tightened_;
  }
  return *this;
}

StateDir::~StateDir() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (its pid is only a hint)
}

std::string StateDir::host_session(bool* replaced) const {
  const fs::path file = dir_ / "host-session";
  std::string id;
  if (std::ifstream in(file); in) std::getline(in, id);
  auto valid = [](const std::string& s) {
    if (s.size() != 6 + 32 || s.compare(0, 6, "kgate-") != 0) return false;
    for (std::size_t i = 6; i < s.size(); ++i)
      if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
    return true;
  };
  if (valid(id)) return id;
  if (replaced) *replaced = fs::exists(file);
  id = "kgate-" + new_hex_id();
  write_file_atomically(file, id + "\n");
  return id;
}

namespace {

constexpr std::size_t kTokenBytes = 32;
constexpr const char* kTokenFile = "token";

bool valid_token(const std::string& s) {
  if (s.size() != 2 * kTokenBytes) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// The first line of `file`, opened without following a symlink: 0, or the errno why not (EINVAL:
// not a regular file).
int read_first_line(const fs::path& file, std::string& line, struct stat& st) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return errno;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return EINVAL;
  }
  std::string text;
  char buf[256];
  while (text.size() < 4096) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, std::size_t(n));
  }
  ::close(fd);
  line = text.substr(0, text.find('\n'));
  return 0;
}

}  // namespace

std::string StateDir::token(bool* created, unsigned* replaced_mode) const {
  const fs::path file = dir_ / kTokenFile;
  std::string line;
  struct stat st{};
  if (created) *created = false;
  if (replaced_mode) *replaced_mode = 0;
  const int err = read_first_line(file, line, st);
  if (err == 0) {
    if (!valid_token(line))
      fail(dir_, std::string(kTokenFile) + " is not a token kgate made (64 hex digits); remove it and kgate "
                 "makes a new one, or give your own with --token, $KGATE_TOKEN or token_file");
    if (st.st_uid != ::geteuid()) fail(dir_, std::string(kTokenFile) + " is owned by uid " + std::to_string(st.st_uid));
    if ((st.st_mode & 0077) == 0) return line;
    // Others could read it: whoever did holds it. A new one, written 0600 in its place.
    if (replaced_mode) *replaced_mode = unsigned(st.st_mode & 07777);
  } else if (err != ENOENT) {
    fail(dir_, std::string("cannot read ") + kTokenFile + ": " + errno_text(err));
  }
  const std::string tok = random_hex(kTokenBytes);
  write_file_atomically(file, tok + "\n");
  if (created) *created = err != 0;
  return tok;
}

std::string read_local_token(const fs::path& dir, std::string* why) {
  auto no = [why](std::string w) {
    if (why) *why = std::move(w);
    return std::string();
  };
  struct stat dst{};
  if (::stat(dir.c_str(), &dst) != 0) return no(dir.string() + ": " + errno_text(errno));
  if (dst.st_uid != ::geteuid() || (dst.st_mode & 0077) != 0)
    return no(dir.string() + " is not this user's alone (owner uid " + std::to_string(dst.st_uid) + ")");
  std::string line;
  struct stat st{};
  const fs::path file = dir / kTokenFile;
  if (int err = read_first_line(file, line, st); err != 0) return no(file.string() + ": " + errno_text(err));
  if (st.st_uid != ::geteuid() || (st.st_mode & 0077) != 0)
    return no(file.string() + " is not this user's alone (owner uid " + std::to_string(st.st_uid) + ")");
  if (!valid_token(line)) return no(file.string() + " is not a token kgate made");
  return line;
}

}  // namespace kgate
