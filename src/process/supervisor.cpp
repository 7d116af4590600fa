// kgate-supervise (see supervisor.hpp and docs/dev/readoption.md).  One process per kernel, a single-threaded
// poll() loop: the kernel's pidfd, signals (signalfd), the listening socket, the connected kgates.
#include "kgate/process/supervisor.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <charconv>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <stddef.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kgate/jupyter/connection.hpp"
#include "kgate/jupyter/wire.hpp"
#include "kgate/process/process.hpp"

extern char** environ;

namespace kgate {

std::string supervisor_socket_name(const std::string& kernel_id) {
  return "kgate-supervise/" + std::to_string(::getuid()) + "/" + kernel_id;
}

std::string supervisor_pid_line(pid_t pid, unsigned long long start_time) {
  return "pid " + std::to_string(pid) + " " + std::to_string(start_time) + " link " +
         std::to_string(kSupervisorLinkVersion);
}

std::optional<SupervisorPidLine> parse_supervisor_pid_line(const std::string& line) {
  // Digits only, the whole word (sscanf's %llu would take a sign or a space, and wrap a "-1").
  auto number = [](std::string_view w, unsigned long long& out) {
    const auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), out);
    return ec == std::errc() && end == w.data() + w.size();
  };
  std::vector<std::string_view> words;
  for (std::size_t at = 0; at <= line.size();) {
    const std::size_t sp = std::min(line.find(' ', at), line.size());
    words.emplace_back(line.data() + at, sp - at);
    at = sp + 1;
  }
  unsigned long long pid = 0, start = 0, version = 1;
  if ((words.size() != 3 && words.size() != 5) || words[0] != "pid" || !number(words[1], pid) ||
      !number(words[2], start) || pid == 0 || pid > 0x7fffffffULL)
    return std::nullopt;
  if (words.size() == 5 && (words[3] != "link" || !number(words[4], version) || version == 0 ||
                            version > 0xffffffffULL))
    return std::nullopt;
  return SupervisorPidLine{static_cast<pid_t>(pid), start, static_cast<unsigned>(version)};
}

std::string control_link_answer(const std::string& key, const std::string& kernel_id,
                                const std::string& challenge) {
  return Signer(key).sign("kgate-control", kernel_id, challenge, "");
}

bool control_link_check(const std::string& key, const std::string& kernel_id,
                        const std::string& challenge, const std::string& answer) {
  if (key.empty()) return false;  // an unsigned link would let anyone in
  return Signer(key).verify(answer, "kgate-control", kernel_id, challenge, "");
}

std::string control_link_proof(const std::string& key, const std::string& kernel_id,
                               const std::string& kgate_challenge, const std::string& node_challenge) {
  return Signer(key).sign("kgate-control-launcher", kernel_id, kgate_challenge, node_challenge);
}

bool control_link_proof_check(const std::string& key, const std::string& kernel_id, const std::string& kgate_challenge,
                              const std::string& node_challenge, const std::string& proof) {
  if (key.empty()) return false;
  return Signer(key).verify(proof, "kgate-control-launcher", kernel_id, kgate_challenge, node_challenge);
}

namespace {

using Clock = std::chrono::steady_clock;

void say(const char* fmt, const std::string& a, long long b = 0) {
  std::fprintf(stderr, fmt, a.c_str(), b);  // lines of their own: kgate's log has the context
  std::fflush(stderr);
}

bool write_line(int fd, const std::string& line) {
  std::string msg = line + "\n";
  const char* p = msg.data();
  std::size_t left = msg.size();
  while (left > 0) {
    const ssize_t n = ::send(fd, p, left, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return true;
}

struct Client {
  int fd;
  std::string in;
  // A control-link peer (TCP) until it answered the challenge: not a kgate yet.
  std::string challenge;
  std::chrono::steady_clock::time_point deadline{};
  std::string peer;     // its address (a control-link peer)
  bool proved = false;  // the launcher answered its "prove": its "auth" is due
  bool evict = false;   // closed to make room for a newer peer
};

constexpr auto kAuthTimeout = std::chrono::seconds(5);
constexpr long kMaxUnanswered = 16;         // control-link peers still owing the challenge's answer
constexpr long kMaxUnansweredPerPeer = 4;   // of them, from one address

// Room for one more unanswered peer from `peer`: the oldest over a bound is marked to go.
void make_room(std::vector<Client>& clients, const std::string& peer) {
  auto oldest = [&](bool same_peer) -> Client* {
    Client* o = nullptr;
    long n = 0;
    for (auto& c : clients) {
      if (c.challenge.empty() || c.evict || (same_peer && c.peer != peer)) continue;
      ++n;
      if (!o || c.deadline < o->deadline) o = &c;
    }
    return n >= (same_peer ? kMaxUnansweredPerPeer : kMaxUnanswered) ? o : nullptr;
  };
  for (bool same : {true, false})
    if (Client* o = oldest(same)) o->evict = true;
}

std::string peer_address(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  else if (a.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
  return buf;
}

}  // namespace

int supervise(const SuperviseOptions& o) {
  ::setsid();  // a session of its own: a terminal's ^C to kgate never reaches it
  ::signal(SIGPIPE, SIG_IGN);
  if (::chdir("/") != 0) {
  }
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGCHLD}) sigaddset(&mask, sig);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  const int sfd = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);

  std::vector<Client> clients;
  if (o.control_fd >= 0) {
    ::fcntl(o.control_fd, F_SETFD, FD_CLOEXEC);
    clients.push_back(Client{o.control_fd, {}, {}, {}, {}});
  }
  auto fail = [&](int stage, int err) {
    for (auto& c : clients) write_line(c.fd, "error " + std::to_string(stage) + " " + std::to_string(err));
    return 1;
  };

  // The socket a later kgate connects to: abstract (no file to leave behind, no path length
  // limit), so every peer is checked to be this user.  A node launcher has none: its kgate
  // comes over the TCP control link.
  int lfd = -1;
  if (!o.name.empty()) {
    lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (o.name.size() + 1 > sizeof addr.sun_path) return fail(0, ENAMETOOLONG);
    std::memcpy(addr.sun_path + 1, o.name.data(), o.name.size());
    const auto alen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + o.name.size());
    if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&addr), alen) != 0 || ::listen(lfd, 8) != 0)
      return fail(0, errno);
  }
  const int tfd = o.tcp_listen_fd;
  if (tfd >= 0) ::fcntl(tfd, F_SETFL, ::fcntl(tfd, F_GETFL) | O_NONBLOCK);

  LaunchOptions lo;
  lo.argv = o.argv;
  lo.env = current_environment();
  lo.env["JPY_PARENT_PID"] = std::to_string(::getpid());  // ipykernel's parent poller watches us
  lo.cwd = o.cwd;
  lo.die_with_parent = true;  // a killed supervisor takes its kernel along: none runs unwatched
  ChildProcess kernel;
  try {
    if (o.prelaunched) kernel = std::move(*o.prelaunched);
    else kernel = ChildProcess::launch(lo);
  } catch (const LaunchError& e) {
    return fail(e.stage, e.code().value());
  } catch (const std::system_error& e) {
    return fail(0, e.code().value());
  }
  const unsigned long long start = process_start_time(kernel.pid());
  std::string hello = supervisor_pid_line(kernel.pid(), start);
  for (auto& c : clients) write_line(c.fd, hello);
  const bool started_ok = !o.on_started || o.on_started(kernel.pid(), start);

  // No kgate connected since orphan_since (when orphaned); SIGKILL at kill_at (when killing).
  bool orphaned = clients.empty(), killing = false, terminating = false;
  Clock::time_point orphan_since = Clock::now(), kill_at{};
  auto terminate = [&](const char* why) {
    if (terminating) return;
    terminating = true;
    say("kgate-supervise: %s: stopping kernel pid %lld\n", why, kernel.pid());
    kernel.signal_group(SIGTERM);
    kill_at = Clock::now() + o.terminate_grace;
    killing = true;
  };
  if (!started_ok) terminate("its registration failed");

  // A node launcher restarts its kernel in place when kgate asked ("relaunch") before it ended:
  // the allocation it runs in is kept (docs/dev/remote-launchers.md).  A local supervisor never gets the line.
  bool relaunch = false;
  for (;;) {
    if (kernel.try_reap()) {
      if (!relaunch || terminating || o.tcp_listen_fd < 0) break;
      relaunch = false;
      const std::string bye = "exit " + std::to_string(kernel.status());
      for (auto& c : clients)
        if (c.challenge.empty()) write_line(c.fd, bye);
      try {
        kernel = ChildProcess::launch(lo);
      } catch (const std::system_error& e) {
        say("kgate-supervise: %s: the relaunch failed: ", o.kernel_id);
        say("%s\n", e.what());
        for (auto& c : clients)
          if (c.challenge.empty()) write_line(c.fd, "error 0 " + std::to_string(e.code().value()));
        break;
      }
      hello = supervisor_pid_line(kernel.pid(), process_start_time(kernel.pid()));
      for (auto& c : clients)
        if (c.challenge.empty()) write_line(c.fd, hello);
      continue;
    }
    auto now = Clock::now();
    if (killing && now >= kill_at) {
      kernel.signal_group(SIGKILL);
      killing = false;
    }
    if (orphaned && !terminating && now - orphan_since >= o.orphan_timeout)
      terminate(o.orphan_timeout.count() == 0 ? "its kgate is gone" : "no kgate came back within the orphan timeout");
    long timeout = -1;
    auto until = [&](Clock::time_point t) {
      long ms = static_cast<long>(std::chrono::ceil<std::chrono::milliseconds>(t - now).count());
      ms = ms < 0 ? 0 : ms;
      timeout = timeout < 0 ? ms : std::min(timeout, ms);
    };
    if (killing) until(kill_at);
    if (orphaned && !terminating) until(orphan_since + o.orphan_timeout);
    if (kernel.exit_fd() < 0) until(now + std::chrono::milliseconds(100));
    for (auto& c : clients)
      if (!c.challenge.empty()) until(c.deadline);

    std::vector<pollfd> fds;
    fds.push_back({kernel.exit_fd(), POLLIN, 0});
    fds.push_back({sfd, POLLIN, 0});
    fds.push_back({lfd, POLLIN, 0});
    fds.push_back({tfd, POLLIN, 0});
    for (auto& c : clients) fds.push_back({c.fd, POLLIN, 0});
    const std::size_t polled = clients.size();  // those accepted below have no slot in fds yet
    const int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long>(timeout, 1 << 30)));
    if (r < 0 && errno != EINTR) break;
    if (r < 0) continue;
    if (fds[1].revents) {
      signalfd_siginfo si;
      while (::read(sfd, &si, sizeof si) == sizeof si) {
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT || si.ssi_signo == SIGHUP)
          terminate("asked to stop (a signal)");
      }
    }
    if (fds[2].revents) {
      for (;;) {
        const int cfd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (cfd < 0) break;
        ucred cred{};
        socklen_t len = sizeof cred;
        if (::getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::getuid()) {
          ::close(cfd);
          continue;
        }
        write_line(cfd, hello);
        clients.push_back(Client{cfd, {}, {}, {}, {}});
        orphaned = false;
      }
    }
    if (fds[3].revents) {
      for (;;) {
        sockaddr_storage from{};
        socklen_t flen = sizeof from;
        const int cfd = ::accept4(tfd, reinterpret_cast<sockaddr*>(&from), &flen, SOCK_CLOEXEC);
        if (cfd < 0) break;
        // Peers that have not answered yet are bounded; the oldest makes room for a newcomer,
        // so a squatter holding connections open cannot keep kgate out.
        Client c{cfd, {}, random_hex(16), Clock::now() + kAuthTimeout, peer_address(from)};
        make_room(clients, c.peer);
        if (write_line(cfd, "challenge2 " + c.challenge)) clients.push_back(std::move(c));
        else ::close(cfd);
      }
    }
    std::vector<Client> keep;
    for (std::size_t i = 0; i < clients.size(); ++i) {
      Client& c = clients[i];
      bool gone = false;
      if (!c.challenge.empty() && (c.evict || Clock::now() >= c.deadline)) gone = true;  // never answered
      if (!gone && i < polled && fds[4 + i].revents) {
        char buf[256];
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) gone = true;
        if (n > 0) c.in.append(buf, static_cast<std::size_t>(n));
        if (c.in.size() > 1024) gone = true;  // lines are short: this peer is not a kgate
        for (auto nl = c.in.find('\n'); !gone && nl != std::string::npos; nl = c.in.find('\n')) {
          std::string line = c.in.substr(0, nl);
          c.in.erase(0, nl + 1);
          if (!c.challenge.empty()) {  // the control link's handshake: prove, then auth
            if (!c.proved) {
              // kgate's challenge first: the launcher proves itself before kgate answers.
              const std::string cK = line.rfind("prove ", 0) == 0 ? line.substr(6) : std::string();
              if (cK.size() < 32 || cK.size() > 128 ||
                  !write_line(c.fd, "proof " + control_link_proof(o.auth_key, o.kernel_id, cK, c.challenge))) {
                say("kgate-supervise: %s: a control-link peer did not send a challenge\n", o.kernel_id);
                gone = true;
                break;
              }
              c.proved = true;
              continue;
            }
            if (line.rfind("auth ", 0) != 0 ||
                !control_link_check(o.auth_key, o.kernel_id, c.challenge, line.substr(5))) {
              say("kgate-supervise: %s: a control-link peer failed the challenge\n", o.kernel_id);
              gone = true;
              break;
            }
            c.challenge.clear();
            write_line(c.fd, hello);
            orphaned = false;
            continue;
          }
          if (line == "relaunch") {
            relaunch = true;
            continue;
          }
          int sig = 0;
          char scope[8] = {0};
          if (std::sscanf(line.c_str(), "signal %d %7s", &sig, scope) == 2 && sig > 0 && sig < 65) {
            if (std::strcmp(scope, "group") == 0) kernel.signal_group(sig);
            else kernel.signal(sig);
          }
        }
      }
      if (gone) ::close(c.fd);
      else keep.push_back(std::move(c));
    }
    clients.swap(keep);
    const bool any_kgate = std::any_of(clients.begin(), clients.end(), [](const Client& c) { return c.challenge.empty(); });
    if (!any_kgate && !orphaned) {
      orphaned = true;
      orphan_since = Clock::now();
    }
  }
  if (lfd >= 0) ::close(lfd);  // first: once a kgate reads the exit, nobody can connect any more
  if (tfd >= 0) ::close(tfd);
  const std::string bye = "exit " + std::to_string(kernel.status());
  for (auto& c : clients) {
    if (c.challenge.empty()) write_line(c.fd, bye);
    ::close(c.fd);
  }
  return 0;
}

}  // namespace kgate
