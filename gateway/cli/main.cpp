// kgate: the resident Jupyter kernel gateway.  main() parses options and wires the server.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "api/api.hpp"
#include "cli/cli_kernelspec_install.hpp"
#include "cli/cli_kernelspecs.hpp"
#include "cli/cli_remote.hpp"
#include "cli/cli_stop.hpp"
#include "config.hpp"
#include "kgate/process/launcher.hpp"
#include "kgate/process/process.hpp"
#include "kgate/version.hpp"
#include "cli/proxy_kernel.hpp"
#include "server.hpp"
#include "cli/paths.hpp"
#include "cli/service.hpp"
#include "systemd.hpp"

int main(int argc, char** argv) {
  using kgate::gw::GatewayOptions;
  CLI::App app{"kgate: a resident Jupyter kernel gateway (the Jupyter kernels HTTP/websocket API)"};
  app.set_version_flag("--version", std::string(kgate::version()));
  app.require_subcommand(1);

  auto* serve = app.add_subcommand("serve", "Run the gateway in the foreground (logs go to stderr)");
  std::string ip, token, config, runtime_dir, log_level = "info";
  int port = -1;
  serve->add_option("--ip", ip, "Address to bind (default 127.0.0.1). A non-loopback address requires a token");
  serve->add_option("--port", port, "TCP port (default 8787; 0 picks a free port and logs it)")->check(CLI::Range(0, 65535));
  auto* token_opt = serve->add_option("--token", token,
                                      "Require this token: 'Authorization: token T' or ?token=T (also $KGATE_TOKEN; "
                                      "prefer the env var or token_file: argv is visible to other users). "
                                      "Default: kgate's own, made at the first start and kept in the state dir")
                           ->envname("KGATE_TOKEN");
  bool no_token = false;
  serve->add_flag("--no-token", no_token,
                  "Serve without a token (as token = \"\" in kgate.toml): every local user of this machine "
                  "could run code as you. Refused with a non-loopback --ip");
  serve->add_option("--config", config, "kgate.toml to read (default $XDG_CONFIG_HOME/kgate/kgate.toml if it exists)");
  serve->add_option("--runtime-dir", runtime_dir,
                    "Where connection files go (default $JUPYTER_RUNTIME_DIR, else ~/.local/share/jupyter/runtime)");
  std::string state_dir;
  serve->add_option("--state-dir", state_dir,
                    "kgate's state, held by one kgate at a time (default $XDG_STATE_HOME/kgate, else "
                    "~/.local/state/kgate)");
  std::string unix_path, certfile, keyfile;
  auto* unix_opt = serve->add_option("--unix", unix_path,
                                     "Also serve on a Unix socket (mode 0600; default path "
                                     "$XDG_RUNTIME_DIR/kgate/kgate.sock, else <runtime dir>/kgate.sock)")
                       ->expected(0, 1)
                       ->type_name("[PATH]");
  bool no_tcp = false;
  serve->add_flag("--no-tcp", no_tcp, "Serve only on the Unix socket (needs --unix or unix_socket)");
  serve->add_option("--certfile", certfile, "Serve https/wss with this PEM certificate (chain); needs --keyfile");
  serve->add_option("--keyfile", keyfile, "The PEM private key of --certfile (unencrypted)");
  serve->add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));

  auto* kernels = app.add_subcommand("kernels", "List the kernelspecs, kernels and sessions of a gateway or Jupyter server");
  std::string kernels_host;
  bool kernels_json = false;
  kernels->add_option("--host", kernels_host,
                      "A gateways.toml name or a URL: http://, https:// or unix:///path (default $KGATE_URL, else http://127.0.0.1:8787; "
                      "token from gateways.toml or $KGATE_TOKEN)");
  kernels->add_flag("--json", kernels_json, "Print one JSON object instead of the table");

  auto* stop = app.add_subcommand("stop", "Stop the kgate serving a state directory; its kernels keep running "
                                           "for the next kgate unless --kernels");
  kgate::gw::StopOptions stop_opts;
  std::string stop_state_dir, stop_config;
  bool stop_kernels = false;
  int stop_timeout = 30;
  stop->add_option("--state-dir", stop_state_dir, "The kgate's state directory (default: as serve finds it)");
  stop->add_option("--config", stop_config, "kgate.toml to read state_dir from (default as serve)");
  stop->add_flag("--kernels", stop_kernels, "Stop its kernels too (else they wait for the next kgate)");
  stop->add_option("--timeout", stop_timeout, "Seconds to wait for it to exit (default 30)")->check(CLI::Range(1, 3600));

  auto* kernelspecs = app.add_subcommand("kernelspecs", "Find the kernelspecs this machine offers, as serve would");
  bool kernelspecs_json = false;
  kernelspecs->add_flag("--json", kernelspecs_json, "Print the catalog as JSON instead of the table");

  kgate::gw::ServiceOptions service;
  auto add_scope = [&service](CLI::App* sub) {
    auto* user = sub->add_flag_callback("--user", [&service] { service.scope = kgate::gw::ServiceScope::user; },
                                        "A user service: ~/.config/systemd/user/kgate.service (the default)");
    sub->add_flag_callback("--system", [&service] { service.scope = kgate::gw::ServiceScope::system; },
                           "A system service: /etc/systemd/system/kgate.service with User= you (needs root)")
        ->excludes(user);
    sub->add_flag("--dry-run", service.dry_run, "Print what would be written or done; change nothing");
    sub->add_flag("--launchd", service.launchd, "The macOS launchd agent (on Linux: with --dry-run)")->group("");
  };
  auto* install = app.add_subcommand("install-service",
                                     "Write a systemd unit (macOS: a launchd agent) running `kgate serve`, and enable it");
  add_scope(install);
  install->add_flag_callback("--no-enable", [&service] { service.enable = false; },
                             "Only write the file; print the commands that enable it");
  install->add_option("--config", service.config, "kgate.toml the service's `kgate serve` reads (default: serve's)");
  auto* uninstall = app.add_subcommand("uninstall-service", "Stop and disable the service and remove its file");
  add_scope(uninstall);

  // The proxy kernel and its kernelspec (gateway/cli/proxy_kernel.cpp, cli_kernelspec_install.cpp).
  auto* proxy = app.add_subcommand("proxy-kernel",
                                   "Be a Jupyter kernel (for a notebook) that forwards to a kgate kernel");
  kgate::gw::proxy::ProxyKernelOptions proxy_opts;
  std::string proxy_log_level = "info";
  proxy->add_option("-f,--connection-file", proxy_opts.connection_file, "The connection file the client wrote")
      ->required();
  proxy->add_option("--kernel", proxy_opts.kernel,
                    "The kgate kernel (an id or a unique prefix; default $KGATE_PROXY_KERNEL, else the agent's "
                    "current kernel, else the newest)");
  proxy->add_option("--url", proxy_opts.url,
                    "The gateway: a URL or a gateways.toml name (default $KGATE_URL, else http://127.0.0.1:8787)");
  proxy->add_option("--log-level", proxy_log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  auto* kspec = app.add_subcommand("install-kernelspec",
                                   "Write the kernelspec that attaches a notebook to a kgate kernel (proxy-kernel)");
  kgate::gw::KernelspecInstallOptions kspec_opts;
  using KsWhere = kgate::gw::KernelspecInstallOptions::Where;
  auto* ks_user = kspec->add_flag_callback("--user", [&kspec_opts] { kspec_opts.where = KsWhere::user; },
                                           "In your Jupyter data dir ($JUPYTER_DATA_DIR or ~/.local/share/jupyter; the default)");
  auto* ks_sys = kspec->add_flag_callback("--sys-prefix", [&kspec_opts] { kspec_opts.where = KsWhere::sys_prefix; },
                                          "In the active environment ($VIRTUAL_ENV or $CONDA_PREFIX)/share/jupyter");
  auto* ks_prefix = kspec->add_option_function<std::string>(
      "--prefix", [&kspec_opts](const std::string& p) { kspec_opts.where = KsWhere::prefix; kspec_opts.prefix = p; },
      "In PREFIX/share/jupyter/kernels");
  ks_user->excludes(ks_sys)->excludes(ks_prefix);
  ks_sys->excludes(ks_prefix);
  kspec->add_option("--name", kspec_opts.name, "The kernelspec name (default kgate)");
  kspec->add_option("--display-name", kspec_opts.display_name, "The name notebooks show");
  kspec->add_option("--kernel", kspec_opts.kernel, "Always attach to this kgate kernel (id or unique prefix)");
  kspec->add_option("--url", kspec_opts.url, "Always use this gateway (a URL or a gateways.toml name)");
  kspec->add_flag("--force", kspec_opts.force, "Replace a different kernelspec of the same name");

  // The node side of a remote launcher (docs/dev/remote-launchers.md): run by the Slurm job or over SSH, not by hand.
  auto* node_launch = app.add_subcommand("node-launch", "Start a kernel on this node for a kgate (a launch spec)");
  node_launch->group("");
  std::string node_spec;
  node_launch->add_option("spec", node_spec, "The launch spec kgate wrote")->required();

  CLI11_PARSE(app, argc, argv);
  if (node_launch->parsed()) return kgate::node_launch(node_spec);

  auto logger = spdlog::stderr_color_mt("kgate");
  spdlog::set_default_logger(logger);
  if (kgate::gw::stderr_is_journal())  // under systemd: journald stamps the time and reads <N>
    spdlog::set_formatter(kgate::gw::journal_formatter());
  else
    spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  if (*kspec) return kgate::gw::install_kernelspec(kspec_opts, std::cout, std::cerr);
  if (*proxy) {  // a kernel: its stderr is the notebook server's log
    spdlog::set_level(spdlog::level::from_str(proxy_log_level));
    return kgate::gw::proxy::run_proxy_kernel(proxy_opts);
  }
  if (*install) return kgate::gw::install_service(service, std::cout, std::cerr);
  if (*uninstall) return kgate::gw::uninstall_service(service, std::cout, std::cerr);
  if (!*serve) {  // the one-shot commands: stdout is theirs, only warnings go to stderr
    spdlog::set_level(spdlog::level::warn);
    if (*stop) {
      stop_opts.state_dir = stop_state_dir;
      stop_opts.config = stop_config;
      stop_opts.kernels = stop_kernels;
      stop_opts.timeout = std::chrono::seconds(stop_timeout);
      return kgate::gw::stop_gateway(stop_opts, std::cout, std::cerr);
    }
    if (*kernels) return kgate::gw::print_remote_kernels(kgate::client::load_config(), kernels_host, kernels_json);
    return kgate::gw::print_kernelspecs(kernelspecs_json);
  }
  spdlog::set_level(spdlog::level::from_str(log_level));

  if (no_token && token_opt->count()) {
    const bool on_argv = std::any_of(argv + 1, argv + argc, [](const char* a) {
      return std::string_view(a) == "--token" || std::string_view(a).rfind("--token=", 0) == 0;
    });
    std::cerr << (on_argv ? "kgate: --no-token and --token exclude each other.\n"
                          : "kgate: --no-token, but $KGATE_TOKEN is set in the environment: unset it, or leave out "
                            "--no-token.\n");
    return 2;
  }
  // Kernels inherit kgate's environment, and its own start-up copy is readable in
  // /proc/<pid>/environ by the kernels' code: the token must be in neither.
  kgate::scrub_environment("KGATE_TOKEN");
  std::filesystem::path cfg = config.empty() ? kgate::gw::default_config_path() : std::filesystem::path(config);
  bool use_cfg = !config.empty() || std::filesystem::exists(cfg);
  // Kernels are started under kgate-supervise (docs/dev/readoption.md), found by cli/paths.hpp.
  const std::filesystem::path supervisor = kgate::gw::self_paths().supervisor;
  // kgate.toml with the flags over it: at start, and again on SIGHUP (Server::reload).
  auto load = [=] {
    GatewayOptions o;
    o.kernel.supervisor = supervisor;
    if (use_cfg) kgate::gw::load_config_file(cfg, o);
    if (!ip.empty()) o.ip = ip;
    if (port >= 0) o.port = port;
    if (!token.empty()) {
      o.token = token;
      o.token_source = kgate::gw::TokenSource::given;
    }
    if (no_token) {
      o.token.clear();
      o.token_source = kgate::gw::TokenSource::none;
    }
    if (!runtime_dir.empty()) o.runtime_dir = runtime_dir;
    if (!state_dir.empty()) o.state_dir = state_dir;
    if (unix_opt->count()) {
      o.unix_socket = true;
      o.unix_path = unix_path;  // "" = the default path
    }
    if (no_tcp) o.tcp = false;
    if (!certfile.empty()) o.certfile = certfile;
    if (!keyfile.empty()) o.keyfile = keyfile;
    return o;
  };
  GatewayOptions opts;
  try {
    opts = load();
  } catch (const std::exception& e) {
    std::cerr << "kgate: " << e.what() << "\n";
    return 2;
  }
  if (auto why = kgate::gw::unsafe_settings(opts); !why.empty()) {
    std::cerr << "kgate: " << why << ".\n";
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  if (auto [was, now] = kgate::raise_fd_limit(); now != was)
    spdlog::debug("descriptor limit raised from {} to {} (kernels start with {})", was, now, was);
  if (supervisor.empty())
    spdlog::warn("kgate-supervise is not beside this kgate, nor in ../lib/kgate/: kernels are its direct children");
  try {
    kgate::gw::Server server(std::move(opts));
    server.set_reloader(load);
    auto ep = server.listen();
    const auto& o = server.options();
    std::string tail = kgate::gw::token_summary(o) + "; connection files in " + o.runtime_dir.string() +
                       "; state in " + o.state_dir.string();
    if (o.tcp) {
      std::string host = ep.address().is_v6() ? "[" + ep.address().to_string() + "]" : ep.address().to_string();
      spdlog::info("kgate {} listening on {}://{}:{}{} ({})", kgate::version(), server.tls() ? "https" : "http", host,
                   ep.port(), o.base_url, tail);
      kgate::gw::log_observe_url(o, std::string(server.tls() ? "https" : "http") + "://" + host + ":" +
                                        std::to_string(ep.port()) + o.base_url);
      if (!server.tls() && !kgate::gw::is_loopback_address(o.ip))
        spdlog::warn("serving {} without TLS: the token and the code travel in clear text on the network; "
                     "give --certfile and --keyfile (or put an https proxy in front)", o.ip);
    }
    if (!server.unix_socket().empty())
      spdlog::info("kgate {} listening on unix:{} (mode 0600, uid {}{}; {})", kgate::version(),
                   server.unix_socket().string(), ::geteuid(),
                   o.unix_allow_uids.empty() ? "" : " and unix_allow_uids", tail);
    server.run();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
