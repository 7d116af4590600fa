// kgate's state directory and its lock (state_dir.hpp).
#include "kgate/state_dir.hpp"

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

#include "kgate/connection.hpp"
#include "kgate/wire.hpp"

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

}  // namespace kgate
