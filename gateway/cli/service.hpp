// Running kgate as a service: `kgate install-service` / `uninstall-service` (a systemd unit on
// Linux, a launchd agent on macOS).  The running daemon's side of systemd is in systemd.hpp.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <string>
#include <string_view>

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
  bool man_pages = false;           // systemd: Documentation= names kgate(1) (an installed kgate)
};

std::string render_systemd_unit(const ServiceFields& f);
std::string render_launchd_plist(const ServiceFields& f);
// One ExecStart= word: % and $ escaped, double-quoted when it has blanks or quotes.
std::string systemd_exec_quote(std::string_view arg);

// The CLI commands: messages to out, errors to err; the exit code.
int install_service(const ServiceOptions& opts, std::ostream& out, std::ostream& err);
int uninstall_service(const ServiceOptions& opts, std::ostream& out, std::ostream& err);

}  // namespace kgate::gw
