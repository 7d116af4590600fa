// What kgate-io waits on (poll_set.hpp): members kept across passes, a pass with nothing changed
// costs no system call, and a descriptor's number, once its owner closed it, is never touched.
// Real eventfds and a real socket pair; the loop that uses it runs in every KernelRuntime test
// (test_kernel.cpp) and in the integration tests, with ipykernel.
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kgate/kernel/poll_set.hpp"

namespace kgate {
namespace {

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

void signal(int fd) {
  std::uint64_t one = 1;
  ASSERT_EQ(::write(fd, &one, sizeof one), ssize_t(sizeof one));
}

// A connected pair of Unix stream sockets: ours (a supervisor's socket, as kgate holds it) and
// the peer's.
struct Link {
  Fd ours{-1}, peer{-1};
  Link() {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
      ours.fd = sv[0];
      peer.fd = sv[1];
    }
  }
};

std::vector<std::uint64_t> ready(PollSet& set, int timeout_ms = 0) {
  epoll_event ev[8];
  int n = set.wait(ev, 8, timeout_ms);
  std::vector<std::uint64_t> tags;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t tag = ev[i].data.u64;  // epoll_event is packed: copied, not referred to
    tags.push_back(tag);
  }
  return tags;
}

TEST(PollSet, AMemberIsReportedWithItsTagWhileOnAndSilentWhileOff) {
  PollSet set;
  Fd a{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  PollSet::Member m;
  ASSERT_TRUE(m.want(set, a.fd, 7, true, 0x51));
  EXPECT_TRUE(ready(set).empty());
  signal(a.fd);
  EXPECT_EQ(ready(set), std::vector<std::uint64_t>{0x51});
  ASSERT_TRUE(m.enable(false));  // a held iopub: in the set, not reported
  EXPECT_TRUE(ready(set).empty());
  ASSERT_TRUE(m.enable(true));
  EXPECT_EQ(ready(set), std::vector<std::uint64_t>{0x51});  // level-triggered, as poll() was
}

TEST(PollSet, APassThatChangesNothingMakesNoSystemCall) {
  PollSet set;
  Fd a{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  PollSet::Member m;
  ASSERT_TRUE(m.want(set, a.fd, 1, true, 3));
  const auto after_add = set.changes();
  for (int pass = 0; pass < 100; ++pass) {
    ASSERT_TRUE(m.want(set, a.fd, 1, true, 3));
    ASSERT_TRUE(m.holds(1));
    ASSERT_TRUE(m.enable(true));
  }
  EXPECT_EQ(set.changes(), after_add);
  ASSERT_TRUE(m.enable(false));
  EXPECT_EQ(set.changes(), after_add + 1);
  m.leave();
  EXPECT_FALSE(m.in());
  EXPECT_EQ(set.changes(), after_add + 2);
}

TEST(PollSet, ANumberItsOwnerClosedAndTheSystemGaveAgainIsNeverTouched) {
  PollSet set;
  Fd a{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  const int number = a.fd;
  PollSet::Member old_member, other;
  ASSERT_TRUE(old_member.want(set, a.fd, 1, true, 0x10));
  a.reset();  // the owner closes it (libzmq closing a socket) ...
  Fd b{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};  // ... and the number comes back for something else
  ASSERT_EQ(b.fd, number);
  ASSERT_TRUE(other.want(set, b.fd, 1, true, 0x20));
  old_member.leave();  // leaving removes the set's own copy, not whatever has the number now
  signal(b.fd);
  EXPECT_EQ(ready(set), std::vector<std::uint64_t>{0x20});
}

TEST(PollSet, ANewStampReplacesTheMemberEvenUnderTheSameNumber) {
  PollSet set;
  Fd a{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  PollSet::Member m;
  ASSERT_TRUE(m.want(set, a.fd, 1, true, 0x30));
  signal(a.fd);  // the old file is readable for ever: it must not be what the set reports
  a.reset();
  Fd b{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  ASSERT_TRUE(m.want(set, b.fd, 2, true, 0x30));  // sockets opened again: a new generation
  EXPECT_TRUE(ready(set).empty());
  signal(b.fd);
  EXPECT_EQ(ready(set), std::vector<std::uint64_t>{0x30});
}

TEST(PollSet, ABorrowedDescriptorIsWaitedOnAsItIsAndLeftOpen) {
  PollSet set;
  Fd a{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  Link link;
  ASSERT_GE(link.ours.fd, 0);
  {
    PollSet::Member m;
    ASSERT_TRUE(m.want(set, a.fd, 1, true, 0x60, /*borrowed=*/true));
    signal(a.fd);
    EXPECT_EQ(ready(set), std::vector<std::uint64_t>{0x60});
    PollSet::Member n;
    ASSERT_TRUE(n.want(set, link.ours.fd, 1, true, 0x61, /*borrowed=*/true));
  }  // both leave, and close neither
  std::uint64_t v = 0;
  EXPECT_EQ(::read(a.fd, &v, sizeof v), ssize_t(sizeof v));
  EXPECT_EQ(v, 1u);
  EXPECT_TRUE(ready(set).empty());
  char c;
  EXPECT_EQ(::recv(link.peer.fd, &c, 1, MSG_DONTWAIT), -1);  // ours is still open: no EOF
  EXPECT_EQ(errno, EAGAIN);
}

TEST(PollSet, ItsCopyKeepsAConnectionOpenUntilTheMemberLeaves) {
  // Why the loop drops a kernel's members with it: a process's supervisor sees kgate go when the
  // last descriptor of its socket closes.
  Link link;
  ASSERT_GE(link.ours.fd, 0);
  PollSet set;
  {
    PollSet::Member m;
    ASSERT_TRUE(m.want(set, link.ours.fd, 1, true, 0x40));
    link.ours.reset();
    char c;
    EXPECT_EQ(::recv(link.peer.fd, &c, 1, MSG_DONTWAIT), -1);  // no EOF: the set's copy holds it
    EXPECT_EQ(errno, EAGAIN);
  }
  char c;
  EXPECT_EQ(::recv(link.peer.fd, &c, 1, MSG_DONTWAIT), 0);  // gone with the member
}

TEST(PollSet, AHangUpIsReportedAsTheMembersTag) {
  // A supervisor's socket closing (the kernel's exit) is reported like poll()'s POLLHUP was.
  Link link;
  ASSERT_GE(link.ours.fd, 0);
  PollSet set;
  PollSet::Member m;
  ASSERT_TRUE(m.want(set, link.ours.fd, 4242, true, 0x55));
  EXPECT_TRUE(ready(set).empty());
  link.peer.reset();
  EXPECT_EQ(ready(set, 1000), std::vector<std::uint64_t>{0x55});
}

}  // namespace
}  // namespace kgate
