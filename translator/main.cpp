// kgate-mcp: the per-conversation MCP translator.  Wiring only: options, logging, the tool
// handler and the stdio server.
#include <pthread.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "kgate/mcp/jsonrpc.hpp"
#include "kgate/mcp/tools.hpp"
#include "kgate/mcp/version_info.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kgate-mcp: an MCP server (stdio) for the kernels of a kgate gateway"};
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off (logs go to stderr)")
      ->capture_default_str();
  app.set_version_flag("--version", std::string(kgate::mcp::server_version()));
  CLI11_PARSE(app, argc, argv);

  // stdout carries the protocol only: every log line goes to stderr.
  auto logger = spdlog::stderr_color_mt("kgate-mcp");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(log_level));
  std::ios::sync_with_stdio(false);
  // A reply written after the client closed its end must fail, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);

  std::cerr.tie(nullptr);  // a stray std::cerr write must not flush stdout outside the server's lock

  // SIGINT (how Claude Code ends its servers), SIGTERM and SIGHUP end the conversation as EOF
  // does: blocked here, before any thread starts, and taken by the thread below.
  sigset_t ending;
  sigemptyset(&ending);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&ending, sig);
  ::pthread_sigmask(SIG_BLOCK, &ending, nullptr);

  // Neither is destroyed: a tool call still running after the EOF grace may use them, so the
  // process leaves with _Exit once run() returned (after shutdown() stopped the auto kernel and
  // closed the agent link).
  auto* translator = new kgate::mcp::Translator(kgate::mcp::load_config());
  auto* server = new kgate::mcp::StdioServer(*translator, std::cin, std::cout);
  std::thread([server, ending] {
    int sig = 0;
    if (::sigwait(&ending, &sig) != 0) return;
    spdlog::info("{}: ending the conversation", ::strsignal(sig));
    server->stop();  // the calls cancelled, the auto kernel stopped, the claims released
    std::cout.flush();
    spdlog::shutdown();
    std::_Exit(0);
  }).detach();
  int rc = server->run();
  std::cout.flush();
  spdlog::shutdown();
  std::_Exit(rc);
}
