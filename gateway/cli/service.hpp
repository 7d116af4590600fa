// Running kgate as a service: `kgate install-service` / `uninstall-service` (a systemd unit on
// Linux, a launchd agent on macOS), the sd_notify readiness calls, and the journald log format.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/ip/tcp.hpp>

namespace spdlog {
class formatter;
}

namespace kgate::gw {

enum class ServiceScope { user, system };

struct ServiceOptions {
  ServiceScope scope = ServiceScope::user;
  bool enable = true;    // false: --no-enable, write the file only
  bool dry_run = false;  // print the file, write nothing, run nothing
#ifdef __APPLE__
  bool launchd = true;
#else
  bool launchd = false;  // --launchd (hidden): the macOS plist; with --dry-run only
#endif
  std::string config;    // --config for the service's `kgate serve`, made absolute
};

// What the templates (config/kgate.service, config/org.kgate.kgate.plist) are filled with.
struct ServiceFields {
  ServiceScope scope = ServiceScope::user;
  std::filesystem::path kgate_bin;  // absolute
  std::filesystem::path config;     // empty: serve's default
  std::filesystem::path env_file;   // systemd: the optional EnvironmentFile
  std::filesystem::path home;       // launchd: WorkingDirectory
  std::filesystem::path log;        // launchd: StandardErrorPath
  std::string user;                 // systemd --system: User=
};

std::string render_systemd_unit(const ServiceFields& f);
std::string render_launchd_plist(const ServiceFields& f);
// One ExecStart= word: % and $ escaped, double-quoted when it has blanks or quotes.
std::string systemd_exec_quote(std::string_view arg);

// The CLI commands: messages to out, errors to err; the exit code.
int install_service(const ServiceOptions& opts, std::ostream& out, std::ostream& err);
int uninstall_service(const ServiceOptions& opts, std::ostream& out, std::ostream& err);

// sd_notify(3): no-ops unless $NOTIFY_SOCKET is set (run by systemd with Type=notify).
void notify_ready(const boost::asio::ip::tcp::endpoint& ep, std::string_view base_url);
void notify_stopping(std::size_t kernels);

// True when $JOURNAL_STREAM names the file stderr is (systemd connected stderr to journald;
// an inherited JOURNAL_STREAM with stderr redirected elsewhere does not count).
bool stderr_is_journal();
// "<N>level message" per line, no timestamp: journald adds one and takes N as the priority.
std::unique_ptr<spdlog::formatter> journal_formatter();

}  // namespace kgate::gw
