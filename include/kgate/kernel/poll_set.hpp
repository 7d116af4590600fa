// The descriptors kgate-io waits on, kept in one epoll set across its passes (io_loop.cpp,
// DEV.md §3).
#pragma once

#include <cstdint>

#include <sys/epoll.h>

namespace kgate {

// A pass of kgate-io tells the set what it wants to wait on, and only a change costs a system
// call: a stream held or let go, sockets opened or closed, a process started or gone.  So a
// pass with 60 idle kernels waits as cheaply as one with a single kernel, where poll() walked
// every descriptor of every kernel on every pass (bench/README.md, "A pass's cost").
//
// A descriptor whose owner may close it unannounced (a process's pidfd or supervisor socket, a
// tunnel's) goes in as a close-on-exec duplicate that the set owns: a number its owner closed,
// which the system may give to anything next, is never added, changed or removed here.  The
// duplicate keeps the file open until it leaves the set, so a member whose owner changed it (a
// new process) is told apart by its `stamp`, and the owner drops what it no longer wants.  A
// descriptor whose closing the caller always announces first (`borrowed`: the ZMQ sockets
// kgate-io owns, whose members leave in close_sockets, stop_stdin_monitor and with their
// KernelIo) goes in as it is, so it costs no descriptor: kgate holds 13 a kernel (12 when it
// used poll()), where a copy of each made 18, which under systemd's default soft limit of 1,024
// would have cut the kernels one kgate can hold from ~80 to ~55.
class PollSet {
 public:
  PollSet();
  ~PollSet();
  PollSet(const PollSet&) = delete;
  PollSet& operator=(const PollSet&) = delete;

  // One place in the set.  `tag` comes back with each event (epoll_event::data.u64).
  class Member {
   public:
    Member() = default;
    ~Member() { leave(); }
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;

    // Wants `fd` in the set, reported when readable if `on` (kept in the set but silent if not).
    // `stamp` names what `fd` is (a generation): another fd or stamp replaces the member.  A
    // negative fd leaves.  `borrowed`: the caller calls leave() before fd is closed, always; the
    // set then uses fd itself.  False (and out of the set) when the system refused.
    bool want(PollSet& set, int fd, std::uint64_t stamp, bool on, std::uint64_t tag, bool borrowed = false);
    // In the set for what `stamp` names: then only enable() may be needed, and the caller need
    // not look the descriptor up again.
    bool holds(std::uint64_t stamp) const { return dup_ >= 0 && stamp_ == stamp; }
    // Reported when readable, or not (kept in the set).  False, and out, when the system refused.
    bool enable(bool on);
    void leave();
    bool in() const { return dup_ >= 0; }

   private:
    PollSet* set_ = nullptr;
    int src_ = -1, dup_ = -1;  // dup_: the descriptor in the set (src_ itself when borrowed)
    std::uint64_t stamp_ = 0, tag_ = 0;
    bool on_ = false, borrowed_ = false;
  };

  // Waits up to timeout_ms (-1: for ever) for readable members; their tags, at most `max`
  // (what is left is reported again by the next wait).  0 on a timeout or a signal.
  int wait(epoll_event* out, int max, int timeout_ms);

  // How many system calls the members made (tests: a pass with nothing changed makes none).
  std::uint64_t changes() const { return changes_; }

 private:
  int ep_ = -1;
  std::uint64_t changes_ = 0;
  bool warned_ = false;
  void refused(const char* what);
};

}  // namespace kgate
