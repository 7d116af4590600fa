// kgate-mcp's configuration: the default gateway (KGATE_URL / KGATE_TOKEN), gateways.toml,
// startup.py and inspectors.py, all under $XDG_CONFIG_HOME/kgate/.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "kgate/client/endpoint.hpp"

namespace kgate::client {

struct GatewayEntry {
  std::string url;
  std::string token;      // literal, or read from token_env when resolved
  std::string token_env;
  bool verify = true;      // https: check the certificate (false: encrypted, not authenticated)
  std::string ca_file;     // https: a PEM bundle trusted instead of the system store
};

struct Config {
  std::filesystem::path dir;  // $XDG_CONFIG_HOME/kgate
  std::string default_url = "http://127.0.0.1:8787";
  std::string default_token;  // $KGATE_TOKEN
  // TLS settings of the default gateway and of URL hosts (gateways.toml entries have their own).
  std::string default_ca_file;  // $KGATE_CA_FILE
  bool default_verify = true;   // $KGATE_TLS_VERIFY=0 turns the checks off
  std::map<std::string, GatewayEntry> gateways;
  std::string gateways_error;  // gateways.toml failed to parse: every named lookup reports it

  std::filesystem::path startup_file() const { return dir / "startup.py"; }
  std::filesystem::path inspectors_file() const { return dir / "inspectors.py"; }
  std::filesystem::path gateways_file() const { return dir / "gateways.toml"; }
};

// Reads the environment and gateways.toml (a missing file is fine; a bad one is reported on use).
Config load_config();
// Parses gateways.toml text into `cfg` (throws std::runtime_error with file:line:col on errors).
void parse_gateways(const std::string& text, const std::string& source, Config& cfg);

// host "" = the default gateway; a name = gateways.toml; anything with "://" = that URL (with
// $KGATE_TOKEN, $KGATE_CA_FILE and $KGATE_TLS_VERIFY).  A gateways.toml ca_file that is relative
// is taken from the config dir, and a leading ~/ from $HOME.  False and `error` (what to do next) when it cannot be resolved.
bool resolve_gateway(const Config& cfg, const std::string& host, Endpoint& ep, std::string& error);

}  // namespace kgate::client
