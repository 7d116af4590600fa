// kgate: the resident Jupyter kernel gateway.  main() parses options and wires the server.
#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "api.hpp"
#include "cli_kernelspecs.hpp"
#include "cli_remote.hpp"
#include "config.hpp"
#include "kgate/version.hpp"
#include "server.hpp"
#include "service.hpp"

int main(int argc, char** argv) {
  using kgate::gw::GatewayOptions;
  CLI::App app{"kgate: a resident Jupyter kernel gateway (the Jupyter kernels HTTP/websocket API)"};
  app.set_version_flag("--version", KGATE_VERSION);
  app.require_subcommand(1);

  auto* serve = app.add_subcommand("serve", "Run the gateway in the foreground (logs go to stderr)");
  std::string ip, token, config, runtime_dir, log_level = "info";
  int port = -1;
  serve->add_option("--ip", ip, "Address to bind (default 127.0.0.1). A non-loopback address requires a token");
  serve->add_option("--port", port, "TCP port (default 8787; 0 picks a free port and logs it)")->check(CLI::Range(0, 65535));
  serve->add_option("--token", token,
                    "Require this token: 'Authorization: token T' or ?token=T (also $KGATE_TOKEN; "
                    "prefer the env var or token_file: argv is visible to other users)")
      ->envname("KGATE_TOKEN");
  serve->add_option("--config", config, "kgate.toml to read (default $XDG_CONFIG_HOME/kgate/kgate.toml if it exists)");
  serve->add_option("--runtime-dir", runtime_dir,
                    "Where connection files go (default $JUPYTER_RUNTIME_DIR, else ~/.local/share/jupyter/runtime)");
  serve->add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));

  auto* kernels = app.add_subcommand("kernels", "List the kernelspecs, kernels and sessions of a gateway or Jupyter server");
  std::string kernels_host;
  bool kernels_json = false;
  kernels->add_option("--host", kernels_host,
                      "A gateways.toml name or a URL (default $KGATE_URL, else http://127.0.0.1:8787; "
                      "token from gateways.toml or $KGATE_TOKEN)");
  kernels->add_flag("--json", kernels_json, "Print one JSON object instead of the table");

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

  CLI11_PARSE(app, argc, argv);

  auto logger = spdlog::stderr_color_mt("kgate");
  spdlog::set_default_logger(logger);
  if (kgate::gw::stderr_is_journal())  // under systemd: journald stamps the time and reads <N>
    spdlog::set_formatter(kgate::gw::journal_formatter());
  else
    spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  if (*install) return kgate::gw::install_service(service, std::cout, std::cerr);
  if (*uninstall) return kgate::gw::uninstall_service(service, std::cout, std::cerr);
  if (!*serve) {  // the one-shot commands: stdout is theirs, only warnings go to stderr
    spdlog::set_level(spdlog::level::warn);
    if (*kernels) return kgate::gw::print_remote_kernels(kgate::mcp::load_config(), kernels_host, kernels_json);
    return kgate::gw::print_kernelspecs(kernelspecs_json);
  }
  spdlog::set_level(spdlog::level::from_str(log_level));

  GatewayOptions opts;
  try {
    std::filesystem::path cfg = config.empty() ? kgate::gw::default_config_path() : std::filesystem::path(config);
    if (!config.empty() || std::filesystem::exists(cfg)) kgate::gw::load_config_file(cfg, opts);
  } catch (const std::exception& e) {
    std::cerr << "kgate: " << e.what() << "\n";
    return 2;
  }
  // Kernels inherit kgate's environment: the token must not be in it.
  ::unsetenv("KGATE_TOKEN");
  if (!ip.empty()) opts.ip = ip;
  if (port >= 0) opts.port = port;
  if (!token.empty()) opts.token = token;
  if (!runtime_dir.empty()) opts.runtime_dir = runtime_dir;
  if (!kgate::gw::is_loopback_address(opts.ip) && opts.token.empty()) {
    std::cerr << "kgate: refusing to listen on " << opts.ip
              << " without a token: anyone who can reach it could run code as you. Set --token, "
                 "$KGATE_TOKEN or token_file in kgate.toml, or bind 127.0.0.1.\n";
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  try {
    kgate::gw::Server server(std::move(opts));
    auto ep = server.listen();
    std::string host = ep.address().is_v6() ? "[" + ep.address().to_string() + "]" : ep.address().to_string();
    spdlog::info("kgate {} listening on http://{}:{}{} (token {}; connection files in {})", KGATE_VERSION,
                 host, ep.port(), server.options().base_url,
                 server.options().token.empty() ? "off" : "required", server.options().runtime_dir.string());
    server.run();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
