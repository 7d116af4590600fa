// `kgate install-service` / `uninstall-service`.
#include "cli/service.hpp"

#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <ostream>
#include <system_error>
#include <vector>

#include <spdlog/spdlog.h>

#ifdef __APPLE__
#include <mach-o/dyld.h>
#else
#include <systemd/sd-daemon.h>  // sd_booted
#endif

#include "kgate/jupyter/connection.hpp"
#include "kgate/process/process.hpp"
#include "cli/paths.hpp"
#include "launchd_plist.hpp"
#include "systemd_system_lines.hpp"
#include "systemd_unit.hpp"


namespace kgate::gw {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kUnitName = "kgate.service";
constexpr std::string_view kLaunchdLabel = "org.kgate.kgate";
constexpr std::chrono::seconds kRunTimeout{120};  // systemctl or launchctl: a hung one is stopped

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Replaces every @NAME@ of `tmpl` by vars[NAME]; a placeholder with no value is a bug.
std::string fill(std::string_view tmpl, const std::map<std::string, std::string>& vars) {
  std::string out;
  out.reserve(tmpl.size() + 256);
  size_t i = 0;
  while (i < tmpl.size()) {
    size_t at = tmpl.find('@', i);
    if (at == std::string_view::npos) break;
    size_t end = tmpl.find('@', at + 1);
    if (end == std::string_view::npos) break;
    std::string name(tmpl.substr(at + 1, end - at - 1));
    auto it = vars.find(name);
    if (it == vars.end()) {  // not a placeholder (an '@' in a comment): keep it
      out.append(tmpl.substr(i, at + 1 - i));
      i = at + 1;
      continue;
    }
    out.append(tmpl.substr(i, at - i));
    out += it->second;
    i = end + 1;
  }
  out.append(tmpl.substr(i));
  if (out.find("@KGATE_") != std::string::npos) throw std::logic_error("service template: unfilled placeholder");
  return out;
}

// % starts a specifier in every unit setting.
std::string systemd_escape_percent(std::string_view s) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '%') out += '%';
  }
  return out;
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

void check_plain(const std::string& what, std::string_view s) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) throw Failure(what + " contains a control character: " + std::string(s));
}

fs::path running_binary() {
#ifdef __APPLE__
  uint32_t size = 0;
  _NSGetExecutablePath(nullptr, &size);
  std::string buf(size, '\0');
  if (_NSGetExecutablePath(buf.data(), &size) != 0) throw Failure("cannot find the kgate binary's path");
  buf.resize(std::strlen(buf.c_str()));
  std::error_code ec;
  auto p = fs::canonical(buf, ec);
  return ec ? fs::absolute(buf) : p;
#else
  fs::path exe = self_paths().exe;
  if (exe.empty()) throw Failure("cannot read /proc/self/exe");
  return exe;
#endif
}

struct Account {
  std::string name;
  uid_t uid = 0;
  fs::path home;
};

Account account_of(uid_t uid) {
  struct passwd* pw = ::getpwuid(uid);
  if (!pw) throw Failure("no passwd entry for uid " + std::to_string(uid));
  return {pw->pw_name, pw->pw_uid, pw->pw_dir};
}

// The user a --system service runs as: whoever ran sudo, else the caller.
Account invoking_account() {
  if (const char* su = std::getenv("SUDO_USER"); su && *su && std::string_view(su) != "root") {
    struct passwd* pw = ::getpwnam(su);
    if (!pw) throw Failure(std::string("$SUDO_USER is ") + su + ", who has no passwd entry");
    return {pw->pw_name, pw->pw_uid, pw->pw_dir};
  }
  return account_of(::getuid());
}

std::string join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    s += a.find_first_of(" \t'\"\\$") == std::string::npos ? a : "'" + a + "'";
  }
  return s;
}

bool on_path(const std::string& cmd) {
  const char* path = std::getenv("PATH");
  std::string_view rest = path && *path ? path : "/usr/bin:/bin";
  while (true) {
    auto colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    if (!dir.empty() && ::access((dir + "/" + cmd).c_str(), X_OK) == 0) return true;
    if (colon == std::string_view::npos) return false;
    rest.remove_prefix(colon + 1);
  }
}

// Runs argv (run(): no shell, stdin /dev/null) writing to our stdout and stderr; its exit
// status, 128+N for signal N, or -1 (and why, on `out`) if it could not start or took over
// kRunTimeout.
int run(const std::vector<std::string>& argv, std::ostream& out) {
  out << "running: " << join(argv) << std::endl;
  RunOptions o;
  o.argv = argv;
  o.env = current_environment();
  std::error_code cwd_error;  // a deleted working directory: run from / rather than throw
  o.cwd = fs::current_path(cwd_error);
  if (cwd_error) o.cwd = "/";
  o.capture = false;
  o.timeout = kRunTimeout;
  const RunResult r = kgate::run(o);  // not this file's run()
  if (!r.started()) {
    out << "cannot run " << argv[0] << ": " << r.spawn_error << std::endl;
    return -1;
  }
  if (r.timed_out) {
    out << argv[0] << " did not finish within " << kRunTimeout.count() << " s: stopped" << std::endl;
    return -1;
  }
  return WIFEXITED(r.status) ? WEXITSTATUS(r.status) : 128 + (WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0);
}

// Writes `text` to `path` with `mode` by a rename, so a reader never sees half a file.
void write_file(const fs::path& path, const std::string& text, mode_t mode) {
  fs::create_directories(path.parent_path());
  fs::path tmp = path;
  tmp += ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Failure("cannot write " + tmp.string() + ": " + std::strerror(errno));
    f << text;
    f.close();
    if (!f) throw Failure("cannot write " + tmp.string());
  }
  if (::chmod(tmp.c_str(), mode) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw Failure("cannot write " + path.string() + ": " + std::strerror(e));
  }
}

bool systemd_running() {
#ifdef __APPLE__
  return false;
#else
  return ::sd_booted() > 0;
#endif
}

fs::path absolute_config(const std::string& config) {
  if (config.empty()) return {};
  return fs::weakly_canonical(fs::absolute(config));
}

void warn_env_file(const fs::path& env_file, std::ostream& err) {
  struct stat st {};
  if (::stat(env_file.c_str(), &st) == 0 && (st.st_mode & 077))
    err << "kgate: warning: " << env_file.string() << " is readable by others (mode "
        << std::oct << (st.st_mode & 0777) << std::dec << "); if it holds the token: chmod 600 "
        << env_file.string() << "\n";
}

// ---- systemd ------------------------------------------------------------------------------

struct SystemdTarget {
  ServiceFields fields;
  fs::path unit_path;
  std::vector<std::string> ctl;  // systemctl [--user]
};

SystemdTarget systemd_target(const ServiceOptions& opts) {
  SystemdTarget t;
  t.fields.scope = opts.scope;
  t.fields.kgate_bin = running_binary();
  t.fields.man_pages = !self_paths(t.fields.kgate_bin).build_tree;
  t.fields.config = absolute_config(opts.config);
  t.ctl = {"systemctl"};
  if (opts.scope == ServiceScope::system) {
    Account a = invoking_account();
    t.fields.user = a.name;
    t.fields.home = a.home;
    t.fields.env_file = a.home / ".config" / "kgate" / "kgate.env";
    t.unit_path = fs::path("/etc/systemd/system") / kUnitName;
  } else {
    t.fields.home = kgate::home_dir();
    fs::path ch = kgate::config_home();
    t.fields.env_file = ch / "kgate" / "kgate.env";
    t.unit_path = ch / "systemd" / "user" / kUnitName;
    t.ctl.push_back("--user");
  }
  return t;
}

void require_root(const ServiceOptions& opts, const fs::path& path, std::string_view verb) {
  if (opts.scope == ServiceScope::system && !opts.dry_run && ::geteuid() != 0)
    throw Failure("--system " + std::string(verb) + " " + path.string() +
                  ", which needs root: run it with sudo (the service then runs as you), or use --user");
}

std::vector<std::string> with(std::vector<std::string> v, std::initializer_list<std::string> more) {
  v.insert(v.end(), more);
  return v;
}

void print_commands(std::ostream& out, const std::vector<std::vector<std::string>>& cmds) {
  for (const auto& c : cmds) out << "  " << join(c) << "\n";
}

int install_systemd(const ServiceOptions& opts, std::ostream& out, std::ostream& err) {
  SystemdTarget t = systemd_target(opts);
  require_root(opts, t.unit_path, "writes");
  std::string text = render_systemd_unit(t.fields);
  if (self_paths(t.fields.kgate_bin).build_tree)
    err << "kgate: warning: " << t.fields.kgate_bin.string()
        << " is a build folder's binary: the service stops working when that folder is rebuilt or removed. "
           "Install kgate (its package, or cmake --install) and run install-service from the installed kgate\n";
  if (opts.dry_run) {
    out << text;
    err << "kgate: dry run: would write " << t.unit_path.string() << "\n";
    return 0;
  }
  bool existed = fs::exists(t.unit_path);
  write_file(t.unit_path, text, 0644);
  out << (existed ? "replaced " : "wrote ") << t.unit_path.string() << " (ExecStart="
      << t.fields.kgate_bin.string() << " serve" << (t.fields.config.empty() ? "" : " --config " + t.fields.config.string())
      << "; reinstall if you move the binary)\n";
  if (opts.scope == ServiceScope::system && t.fields.user == "root")
    err << "kgate: warning: the service runs as root, and so do its kernels; run install-service with "
           "sudo from your own account to make User= you\n";
  warn_env_file(t.fields.env_file, err);

  std::vector<std::vector<std::string>> cmds = {with(t.ctl, {"daemon-reload"}),
                                                with(t.ctl, {"enable", "--now", std::string(kUnitName)})};
  std::string journal = opts.scope == ServiceScope::user ? "journalctl --user -u kgate -f" : "journalctl -u kgate -f";
  if (!opts.enable) {
    out << "not enabled (--no-enable). To start it now and at every "
        << (opts.scope == ServiceScope::user ? "login" : "boot") << ", run:\n";
    print_commands(out, cmds);
    return 0;
  }
  if (!on_path("systemctl") || !systemd_running()) {
    out << (on_path("systemctl") ? "systemd is not running here (no /run/systemd/system, e.g. a container)"
                                 : "systemctl is not installed")
        << ", so the service was not enabled. On a machine running systemd, run:\n";
    print_commands(out, cmds);
    return 0;
  }
  for (size_t i = 0; i < cmds.size(); ++i) {
    int rc = run(cmds[i], out);
    if (rc != 0) {
      err << "kgate: `" << join(cmds[i]) << "` "
          << (rc < 0 ? "could not be run" : "failed (exit " + std::to_string(rc) + ")")
          << ". The unit is written; once that is fixed, run:\n";
      for (size_t j = i; j < cmds.size(); ++j) err << "  " << join(cmds[j]) << "\n";
      return 1;
    }
  }
  out << "kgate is enabled and started. Status: " << join(with(t.ctl, {"status", "kgate"})) << "; logs: " << journal
      << ".\nIf an older kgate was already running, " << join(with(t.ctl, {"restart", "kgate"}))
      << " switches to this unit (and restarts its kernels).\n";
  if (opts.scope == ServiceScope::user)
    out << "To keep it running while you are logged out: loginctl enable-linger " << account_of(::getuid()).name << "\n";
  return 0;
}

int uninstall_systemd(const ServiceOptions& opts, std::ostream& out, std::ostream& err) {
  SystemdTarget t = systemd_target(opts);
  require_root(opts, t.unit_path, "removes");
  if (opts.dry_run) {
    out << "would stop and disable kgate.service and remove " << t.unit_path.string() << "\n";
    return 0;
  }
  bool usable = on_path("systemctl") && systemd_running();
  if (!fs::exists(t.unit_path)) {
    out << "no unit at " << t.unit_path.string() << ": nothing to remove\n";
    return 0;
  }
  int rc = 0;
  if (usable && run(with(t.ctl, {"disable", "--now", std::string(kUnitName)}), out) != 0) {
    err << "kgate: warning: could not stop and disable kgate.service; removing the unit anyway\n";
    rc = 1;
  }
  std::error_code ec;
  fs::remove(t.unit_path, ec);
  if (ec) throw Failure("cannot remove " + t.unit_path.string() + ": " + ec.message());
  out << "removed " << t.unit_path.string() << "\n";
  if (usable)
    run(with(t.ctl, {"daemon-reload"}), out);
  else
    out << "systemd is not running here: nothing to stop\n";
  return rc;
}

// ---- launchd ------------------------------------------------------------------------------

struct LaunchdTarget {
  ServiceFields fields;
  fs::path plist_path;
  std::string domain;  // gui/<uid>
};

LaunchdTarget launchd_target(const ServiceOptions& opts) {
  if (opts.scope == ServiceScope::system)
    throw Failure("--system is for systemd; on macOS kgate installs a LaunchAgent for you (--user)");
#ifndef __APPLE__
  if (!opts.dry_run) throw Failure("--launchd writes a macOS LaunchAgent: use it with --dry-run to see the plist");
#endif
  LaunchdTarget t;
  t.fields.kgate_bin = running_binary();
  t.fields.config = absolute_config(opts.config);
  t.fields.home = kgate::home_dir();
  t.fields.log = t.fields.home / "Library" / "Logs" / "kgate.log";
  t.plist_path = t.fields.home / "Library" / "LaunchAgents" / (std::string(kLaunchdLabel) + ".plist");
  t.domain = "gui/" + std::to_string(::getuid());
  return t;
}

int install_launchd(const ServiceOptions& opts, std::ostream& out, std::ostream& err) {
  LaunchdTarget t = launchd_target(opts);
  std::string text = render_launchd_plist(t.fields);
  if (opts.dry_run) {
    out << text;
    err << "kgate: dry run: would write " << t.plist_path.string() << "\n";
    return 0;
  }
  fs::create_directories(t.fields.log.parent_path());
  write_file(t.plist_path, text, 0644);
  out << "wrote " << t.plist_path.string() << " (logs: " << t.fields.log.string()
      << "). To start it now and at every login, run:\n"
      << "  launchctl bootstrap " << t.domain << " " << t.plist_path.string() << "\n"
      << "(if an older one is loaded, first: launchctl bootout " << t.domain << "/" << kLaunchdLabel << ")\n";
  return 0;
}

int uninstall_launchd(const ServiceOptions& opts, std::ostream& out, std::ostream&) {
  LaunchdTarget t = launchd_target(opts);
  if (opts.dry_run) {
    out << "would unload " << kLaunchdLabel << " and remove " << t.plist_path.string() << "\n";
    return 0;
  }
  if (!fs::exists(t.plist_path)) {
    out << "no agent at " << t.plist_path.string() << ": nothing to remove\n";
    return 0;
  }
  run({"launchctl", "bootout", t.domain + "/" + std::string(kLaunchdLabel)}, out);  // fails if not loaded
  fs::remove(t.plist_path);
  out << "removed " << t.plist_path.string() << "\n";
  return 0;
}

template <class F>
int guarded(F&& f, std::ostream& err) {
  try {
    return f();
  } catch (const std::exception& e) {
    err << "kgate: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

std::string systemd_exec_quote(std::string_view arg) {
  std::string s;
  for (char c : arg) {
    if (c == '%') s += "%%";
    else if (c == '$') s += "$$";
    else s += c;
  }
  if (!s.empty() && s.find_first_of(" \t\"'\\;") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

// The Documentation= line of the units an installed kgate writes, and of the units the install
// carries (cmake/SystemdUnits.cmake).
constexpr std::string_view kUnitDocumentation = "Documentation=man:kgate(1) man:kgate.toml(5)\n";

std::string render_systemd_unit(const ServiceFields& f) {
  check_plain("the kgate path", f.kgate_bin.string());
  check_plain("the config path", f.config.string());
  check_plain("the environment file path", f.env_file.string());
  check_plain("the user name", f.user);
  std::string system_lines;
  if (f.scope == ServiceScope::system) {
    if (f.user.find_first_of(" \t") != std::string::npos) throw Failure("odd user name: " + f.user);
    system_lines = fill(kSystemdSystemLines, {{"KGATE_USER", f.user}});  // config/kgate.service.system
  }
  return fill(kSystemdUnitTemplate,
              {{"KGATE_BIN", systemd_exec_quote(f.kgate_bin.string())},
               {"KGATE_SERVE_ARGS", f.config.empty() ? "" : " --config " + systemd_exec_quote(f.config.string())},
               {"KGATE_ENV_FILE", systemd_escape_percent(f.env_file.string())},
               {"KGATE_SYSTEM_LINES", system_lines},
               {"KGATE_DOCUMENTATION", f.man_pages ? std::string(kUnitDocumentation) : ""},
               {"KGATE_WANTED_BY", f.scope == ServiceScope::system ? "multi-user.target" : "default.target"}});
}

std::string render_launchd_plist(const ServiceFields& f) {
  std::string args;
  if (!f.config.empty())
    args = "\n    <string>--config</string>\n    <string>" + xml_escape(f.config.string()) + "</string>";
  return fill(kLaunchdPlistTemplate, {{"KGATE_BIN", xml_escape(f.kgate_bin.string())},
                                      {"KGATE_SERVE_ARGS", args},
                                      {"KGATE_HOME", xml_escape(f.home.string())},
                                      {"KGATE_LOG", xml_escape(f.log.string())}});
}

int install_service(const ServiceOptions& opts, std::ostream& out, std::ostream& err) {
  return guarded([&] { return opts.launchd ? install_launchd(opts, out, err) : install_systemd(opts, out, err); }, err);
}

int uninstall_service(const ServiceOptions& opts, std::ostream& out, std::ostream& err) {
  return guarded([&] { return opts.launchd ? uninstall_launchd(opts, out, err) : uninstall_systemd(opts, out, err); },
                 err);
}

}  // namespace kgate::gw
