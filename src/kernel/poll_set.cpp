#include "kgate/kernel/poll_set.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include <fcntl.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

namespace kgate {

PollSet::PollSet() : ep_(::epoll_create1(EPOLL_CLOEXEC)) {
  if (ep_ < 0) throw std::runtime_error(std::string("epoll_create1: ") + std::strerror(errno));
}

PollSet::~PollSet() {
  if (ep_ >= 0) ::close(ep_);
}

int PollSet::wait(epoll_event* out, int max, int timeout_ms) {
  int n = ::epoll_wait(ep_, out, max, timeout_ms);
  return n < 0 ? 0 : n;  // EINTR: a pass with nothing ready
}

// The first refusal is a warning, the rest debug lines: a pass would repeat it many times a second.
void PollSet::refused(const char* what) {
  auto level = warned_ ? spdlog::level::debug : spdlog::level::warn;
  warned_ = true;
  spdlog::log(level, "kgate-io: {}: {}; that descriptor is not waited on", what, std::strerror(errno));
}

bool PollSet::Member::want(PollSet& set, int fd, std::uint64_t stamp, bool on, std::uint64_t tag,
                           bool borrowed) {
  if (fd < 0) {
    leave();
    return true;
  }
  if (dup_ >= 0 && set_ == &set && src_ == fd && stamp_ == stamp && tag_ == tag && borrowed_ == borrowed)
    return enable(on);
  leave();
  ++set.changes_;
  int d = borrowed ? fd : ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d < 0) {
    set.refused("fcntl(F_DUPFD_CLOEXEC)");
    return false;
  }
  epoll_event ev{};
  ev.events = on ? std::uint32_t(EPOLLIN) : 0u;
  ev.data.u64 = tag;
  if (::epoll_ctl(set.ep_, EPOLL_CTL_ADD, d, &ev) != 0) {
    set.refused("epoll_ctl(ADD)");
    if (!borrowed) ::close(d);
    return false;
  }
  borrowed_ = borrowed;
  set_ = &set;
  src_ = fd;
  dup_ = d;
  stamp_ = stamp;
  tag_ = tag;
  on_ = on;
  return true;
}

bool PollSet::Member::enable(bool on) {
  if (dup_ < 0) return false;
  if (on_ == on) return true;
  epoll_event ev{};
  ev.events = on ? std::uint32_t(EPOLLIN) : 0u;
  ev.data.u64 = tag_;
  ++set_->changes_;
  if (::epoll_ctl(set_->ep_, EPOLL_CTL_MOD, dup_, &ev) != 0) {
    set_->refused("epoll_ctl(MOD)");
    leave();
    return false;
  }
  on_ = on;
  return true;
}

void PollSet::Member::leave() {
  if (dup_ < 0) return;
  ++set_->changes_;
  ::epoll_ctl(set_->ep_, EPOLL_CTL_DEL, dup_, nullptr);
  if (!borrowed_) ::close(dup_);
  dup_ = src_ = -1;
  set_ = nullptr;
}

}  // namespace kgate
