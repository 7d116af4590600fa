// kgate-mcp: the per-conversation MCP translator.  Wiring only: options, logging, the tool
// handler and the stdio server.
#include <iostream>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "mcp_config.hpp"
#include "jsonrpc.hpp"
#include "tools.hpp"
#include "version_info.hpp"

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

  kgate::mcp::Translator translator(kgate::mcp::load_config());
  kgate::mcp::StdioServer server(translator, std::cin, std::cout);
  return server.run();
}
