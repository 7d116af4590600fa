// The Jupyter sessions API's store (/api/sessions, docs/api.md "Sessions"): which notebook, console
// or file (path, name, type) uses which kernel.  In memory, and in <state>/sessions.json (0600,
// written whole and renamed over the old one after every change, by a writer thread of its own),
// so that the sessions of kernels that outlive kgate come back with them (docs/dev/readoption.md).
//
// A session is gone once its kernel is: every read first drops the sessions whose kernel is no
// longer listed (deleted, culled, or not re-adopted), as jupyter_server's session manager does.
//
// Threading: the Asio thread only; the file is written on the store's writer thread, from a
// snapshot the Asio thread makes (the newest snapshot wins: a burst of changes is one write).
#pragma once

#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace kgate::gw {

struct Session {
  std::string id;  // a UUID
  std::string path;
  std::string name;
  std::string type;
  std::string kernel_id;
  // The session started its kernel (not one it was opened on): only then does deleting the
  // session, or moving it to another kernel, shut that kernel down, and only if no other
  // session uses it.  An agent's kernel a notebook was opened on is never shut down by it.
  bool started_kernel = false;
};

class SessionStore {
 public:
  // At most this many sessions: a POST past it is refused (503).  Sessions are small, but each
  // is listed on every GET and written on every change.
  static constexpr std::size_t kMaxSessions = 10000;
  // A session's path, name and type are each at most this many bytes (a 413 past it): a path is
  // a notebook's, and no file system has one near it.
  static constexpr std::size_t kMaxFieldBytes = 4096;
  // All sessions' path, name and type together are at most this many bytes (a 413 past it), so
  // sessions.json stays small enough to rewrite after every change.
  static constexpr std::size_t kMaxTotalBytes = 4u << 20;

  // `file` "": in memory only.  The file is read at once; an unreadable one is logged and set
  // aside as sessions.json.bad, never fatal.
  explicit SessionStore(std::filesystem::path file);
  ~SessionStore();  // writes what is pending, then stops the writer
  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // Drops the sessions whose kernel `alive` says is gone.  Returns how many.
  std::size_t prune(const std::function<bool(const std::string& kernel_id)>& alive);

  const std::vector<Session>& all() const { return sessions_; }
  const Session* find(const std::string& id) const;
  const Session* find_path(const std::string& path) const;
  // Whether a session other than `except` uses `kernel_id`.
  bool kernel_shared(const std::string& kernel_id, const std::string& except) const;
  bool full() const { return sessions_.size() >= kMaxSessions; }
  // The bytes kMaxTotalBytes counts, of every session.
  std::size_t bytes() const { return bytes_; }
  static std::size_t bytes_of(const Session& s) { return s.path.size() + s.name.size() + s.type.size(); }

  void add(Session s);
  void update(const Session& s);  // by s.id
  void remove(const std::string& id);

 private:
  void save();  // hands a snapshot to the writer
  void write_loop();
  void recount();

  std::filesystem::path file_;
  std::vector<Session> sessions_;
  std::size_t bytes_ = 0;

  std::mutex mu_;  // guards pending_ and stop_
  std::condition_variable wake_;
  std::optional<std::string> pending_;
  bool stop_ = false;
  std::thread writer_;
};

}  // namespace kgate::gw
