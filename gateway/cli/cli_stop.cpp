// `kgate stop` (see cli_stop.hpp).
#include "cli/cli_stop.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "config.hpp"
#include "kgate/jupyter/state_dir.hpp"

namespace kgate::gw {

namespace {

std::vector<std::string> cmdline(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  std::string a;
  while (std::getline(in, a, '\0')) argv.push_back(a);
  return argv;
}

}  // namespace

int stop_gateway(const StopOptions& opts, std::ostream& out, std::ostream& err) {
  StopOptions o = opts;
  if (o.state_dir.empty()) {
    const std::filesystem::path cfg = o.config.empty() ? default_config_path() : o.config;
    GatewayOptions g;
    try {
      if (!o.config.empty() || std::filesystem::exists(cfg)) load_config_file(cfg, g);
    } catch (const std::exception& e) {
      err << "kgate: " << e.what() << "\n";
      return 2;
    }
    o.state_dir = g.state_dir.empty() ? default_state_dir() : g.state_dir;
  }
  o.state_dir = std::filesystem::absolute(o.state_dir);
  const auto lock = o.state_dir / "kgate.lock";
  std::ifstream in(lock);
  if (!in) {
    err << "kgate stop: no kgate has run on state directory " << o.state_dir.string() << " (no " << lock.string()
        << "); give the one to stop with --state-dir\n";
    return 1;
  }
  long pid = 0;
  in >> pid;
  const auto argv = cmdline(static_cast<int>(pid));
  auto base = [](const std::string& p) { return p.substr(p.rfind('/') == std::string::npos ? 0 : p.rfind('/') + 1); };
  if (pid <= 0 || argv.size() < 2 || base(argv[0]) != "kgate" || argv[1] != "serve") {
    err << "kgate stop: no kgate is running on state directory " << o.state_dir.string() << " (" << lock.string()
        << " names pid " << pid << ", which is " << (argv.empty() ? "not running" : "not a kgate serve") << ")\n";
    return 1;
  }
  const long pidfd = ::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0);
  if (pidfd < 0) {
    err << "kgate stop: cannot watch kgate (pid " << pid << "): " << std::strerror(errno) << "\n";
    return 1;
  }
  const int sig = o.kernels ? SIGINT : SIGTERM;
  if (::syscall(SYS_pidfd_send_signal, static_cast<int>(pidfd), sig, nullptr, 0) != 0) {
    err << "kgate stop: cannot signal kgate (pid " << pid << "): " << std::strerror(errno) << "\n";
    ::close(static_cast<int>(pidfd));
    return 1;
  }
  pollfd p{static_cast<int>(pidfd), POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(o.timeout).count()));
  } while (r < 0 && errno == EINTR);
  ::close(static_cast<int>(pidfd));
  if (r <= 0) {
    err << "kgate stop: kgate (pid " << pid << ") did not exit within " << o.timeout.count() << " s\n";
    return 1;
  }
  out << "kgate (pid " << pid << ") stopped; "
      << (o.kernels ? "its kernels were stopped with it"
                    : "its kernels keep running for the next kgate on " + o.state_dir.string() +
                          " (kgate stop --kernels stops them too)")
      << "\n";
  return 0;
}

}  // namespace kgate::gw
