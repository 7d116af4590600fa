// kgate's state directory (docs/dev/kernel-lifecycle.md): where what outlives one kgate process is kept, held by
// one kgate at a time.
#pragma once

#include <filesystem>

namespace kgate {

// state_home()/kgate (connection.hpp): $XDG_STATE_HOME/kgate when that is an absolute path (the
// XDG base directory spec ignores a relative one), else ~/.local/state/kgate.
std::filesystem::path default_state_dir();

// An open state directory: created (with missing parents) mode 0700, and its lock file
// (`kgate.lock`, mode 0600, holding the pid) locked with flock() for as long as this object
// lives.  The lock is the kernel's: a kgate that is killed (kill -9, a crash) releases it, so a
// stale lock file never blocks the next start.  The descriptor is close-on-exec, so no kernel
// or other child inherits the lock.
class StateDir {
 public:
  // Throws std::runtime_error naming the directory: it cannot be created, it belongs to another
  // user, or another process holds it (then naming that process's pid).
  static StateDir open(const std::filesystem::path& dir);

  StateDir() = default;
  StateDir(StateDir&& o) noexcept;
  StateDir& operator=(StateDir&& o) noexcept;
  StateDir(const StateDir&) = delete;
  StateDir& operator=(const StateDir&) = delete;
  ~StateDir();

  const std::filesystem::path& path() const { return dir_; }
  // kgate's session id as its kernels' host (docs/dev/kernel-side.md): read from `host-session` (0600), or
  // made ("kgate-" + 32 hex digits) and written there, so a kgate that re-adopts kernels is
  // the host they were launched for. A file that is not such an id is replaced (logged by the
  // caller through `replaced`).
  std::string host_session(bool* replaced = nullptr) const;
  // The gateway's own token (docs/dev/security.md, "The token"): read from `token` (0600), or made at the
  // first start (256 bits from getrandom(2), as 64 hex digits) and written there; `created` says
  // which.  A file that is not such a token is an error naming it (a person's own token belongs
  // in --token, $KGATE_TOKEN or token_file, not in kgate's state).  A token file other users
  // could read (a mode past 0600) is no secret any more: a new token replaces it, and
  // `replaced_mode` is set to the mode the old file had (0 otherwise).
  std::string token(bool* created = nullptr, unsigned* replaced_mode = nullptr) const;
  bool held() const { return fd_ >= 0; }
  // The directory existed with access for others, and open() made it 0700.
  bool tightened() const { return tightened_; }

 private:
  std::filesystem::path dir_;
  int fd_ = -1;
  bool tightened_ = false;
};

// The token the kgate of state directory `dir` made (StateDir::token), for the owner's own
// clients (kgate-mcp, `kgate kernels`, the proxy kernel).  Empty, with `why`, when there is none,
// or when the directory or the file is not this user's alone (then it is not trusted).
std::string read_local_token(const std::filesystem::path& dir, std::string* why = nullptr);

}  // namespace kgate
