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
  std::string default_token;  // $KGATE_TOKEN: for the default gateway only
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

// host "" = the default gateway; a name = gateways.toml; anything with "://" = that URL.
// A token goes only where it belongs (docs/dev/security.md, "Tokens a client sends"): $KGATE_TOKEN to the
// default gateway's URL, else the local kgate's own token (Endpoint::local_token, send_token) if
// that URL is a loopback one, and whatever goes to it goes only to a peer that is this user's
// (Endpoint::verify_peer, foreign_peer_error); a gateways.toml entry's to its
// URL (a URL given as `host` that equals an entry's gets the entry's token and TLS settings).
// Any other URL gets no token.  $KGATE_CA_FILE and $KGATE_TLS_VERIFY apply to the default gateway and to URLs.  A
// gateways.toml ca_file that is relative is taken from the config dir, and a leading ~/ from
// $HOME.  False and `error` (what to do next) when it cannot be resolved.
bool resolve_gateway(const Config& cfg, const std::string& host, Endpoint& ep, std::string& error);

// The uid that owns the other end of the loopback TCP connection on socket `fd` (the accepted
// socket's entry in /proc/net/tcp or tcp6, whose uid is its listener's); -1 when the peer is not
// on this machine's loopback or its entry is not found.
long loopback_peer_uid(int fd);
// "" when `fd`'s peer is this user's, else the error that refuses the connection to `ep`.
std::string foreign_peer_error(const Endpoint& ep, int fd);

// The token a request to `ep` carries: its own, else (Endpoint::local_token) the token the
// owner's kgate keeps in its default state dir (read_local_token); else "".  The connection it
// goes on was checked to be this user's (Endpoint::verify_peer, foreign_peer_error) first.  Read at each call: a file and /proc/net/tcp (a few
// ms with thousands of sockets), so callers ask once per connection they open.
std::string send_token(const Endpoint& ep);

}  // namespace kgate::client
