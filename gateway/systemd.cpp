// sd_notify readiness and stopping, and the journald log format (systemd.hpp).
#include "systemd.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <spdlog/formatter.h>
#include <spdlog/spdlog.h>

#ifndef __APPLE__
#include <systemd/sd-daemon.h>
#endif

namespace kgate::gw {

namespace {

// ---- journald -----------------------------------------------------------------------------

int syslog_priority(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::critical: return 2;
    case spdlog::level::err: return 3;
    case spdlog::level::warn: return 4;
    case spdlog::level::info: return 6;
    default: return 7;  // debug, trace
  }
}

class JournalFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    std::string_view text(msg.payload.data(), msg.payload.size());
    auto level = spdlog::level::to_string_view(msg.level);
    std::string prefix = "<" + std::to_string(syslog_priority(msg.level)) + ">";
    // journald makes one entry per line: each gets the priority.
    while (true) {
      auto nl = text.find('\n');
      dest.append(prefix.data(), prefix.data() + prefix.size());
      dest.append(level.data(), level.data() + level.size());
      dest.push_back(' ');
      auto line = text.substr(0, nl);
      dest.append(line.data(), line.data() + line.size());
      dest.push_back('\n');
      if (nl == std::string_view::npos || nl + 1 == text.size()) break;
      text.remove_prefix(nl + 1);
    }
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JournalFormatter>(); }
};

}  // namespace

void notify_ready(const boost::asio::ip::tcp::endpoint& ep, std::string_view base_url) {
#ifndef __APPLE__
  auto addr = ep.address();
  std::string host = addr.is_v6() ? "[" + addr.to_string() + "]" : addr.to_string();
  std::string state = "READY=1\nSTATUS=listening on http://" + host + ":" + std::to_string(ep.port()) +
                      std::string(base_url);
  ::sd_notify(0, state.c_str());
#else
  (void)ep;
  (void)base_url;
#endif
}

void notify_stopping(std::size_t kernels) {
#ifndef __APPLE__
  std::string state = "STOPPING=1\nSTATUS=shutting down " + std::to_string(kernels) + " kernel(s)";
  ::sd_notify(0, state.c_str());
#else
  (void)kernels;
#endif
}

bool stderr_is_journal() {
  const char* js = std::getenv("JOURNAL_STREAM");
  if (!js || !*js) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(js, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st {};
  if (::fstat(STDERR_FILENO, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == dev && static_cast<unsigned long long>(st.st_ino) == ino;
}

std::unique_ptr<spdlog::formatter> journal_formatter() { return std::make_unique<JournalFormatter>(); }

}  // namespace kgate::gw
