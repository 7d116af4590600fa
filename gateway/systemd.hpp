// The running daemon under systemd: the sd_notify readiness and stopping calls, and the log
// format for journald.  (Installing the service is `kgate install-service`: cli/service.hpp.)
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include <boost/asio/ip/tcp.hpp>

namespace spdlog {
class formatter;
}

namespace kgate::gw {

// sd_notify(3): no-ops unless $NOTIFY_SOCKET is set (run by systemd with Type=notify).
void notify_ready(const boost::asio::ip::tcp::endpoint& ep, std::string_view base_url);
void notify_stopping(std::size_t kernels);

// True when $JOURNAL_STREAM names the file stderr is (systemd connected stderr to journald;
// an inherited JOURNAL_STREAM with stderr redirected elsewhere does not count).
bool stderr_is_journal();
// "<N>level message" per line, no timestamp: journald adds one and takes N as the priority.
std::unique_ptr<spdlog::formatter> journal_formatter();

}  // namespace kgate::gw
