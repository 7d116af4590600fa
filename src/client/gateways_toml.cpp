// kgate-mcp's configuration (see mcp_config.hpp).
#include "kgate/client/gateways_toml.hpp"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include <unistd.h>

#include "kgate/jupyter/connection.hpp"
#include "kgate/jupyter/state_dir.hpp"

namespace kgate::client {

namespace {

std::string env_or(const char* name, std::string fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// $KGATE_TLS_VERIFY: 0/false/no/off turn the checks off; anything else keeps them on.
bool tls_verify_from_env() {
  std::string v = env_or("KGATE_TLS_VERIFY", "1");
  for (auto& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  if (v != "1" && v != "true" && v != "yes" && v != "on")
    spdlog::warn("KGATE_TLS_VERIFY={} is not 0 or 1: certificates are checked", v);
  return true;
}

std::string config_path(const Config& cfg, const std::string& path) {
  if (path.empty()) return path;
  if (path.rfind("~/", 0) == 0) {
    return (home_dir() / path.substr(2)).string();
  }
  std::filesystem::path p(path);
  return p.is_absolute() ? path : (cfg.dir / p).string();
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8, written as a dotted quad
  unsigned a = 0, b = 0, c = 0, d = 0;
  char tail = 0;
  return std::sscanf(host.c_str(), "%u.%u.%u.%u%c", &a, &b, &c, &d, &tail) == 4 && a == 127 && b < 256 &&
         c < 256 && d < 256;
}

// The default URL and a URL given as `host` are the same gateway when equal up to a trailing '/'.
std::string without_slash(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url;
}



}  // namespace

long loopback_peer_uid(int fd) {
  sockaddr_storage mine{}, peer{};
  socklen_t ml = sizeof mine, pl = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &ml) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 || mine.ss_family != peer.ss_family)
    return -1;
  // The accepted socket's entry: its local address is our peer, its remote one us, printed as
  // /proc/net/tcp prints them (each 32-bit word of the address in host order, %08X; the port %04X).
  auto text = [](const sockaddr_storage& a) {
    char buf[64];
    if (a.ss_family == AF_INET) {
      const auto& in = reinterpret_cast<const sockaddr_in&>(a);
      std::snprintf(buf, sizeof buf, "%08X:%04X", in.sin_addr.s_addr, ntohs(in.sin_port));
    } else {
      const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
      std::uint32_t w[4];
      std::memcpy(w, &in6.sin6_addr, sizeof w);
      std::snprintf(buf, sizeof buf, "%08X%08X%08X%08X:%04X", w[0], w[1], w[2], w[3], ntohs(in6.sin6_port));
    }
    return std::string(buf);
  };
  bool loopback = false;
  if (peer.ss_family == AF_INET) {
    loopback = (ntohl(reinterpret_cast<const sockaddr_in&>(peer).sin_addr.s_addr) >> 24) == 127;
  } else if (peer.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(peer).sin6_addr;
    loopback = IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
  }
  if (!loopback) return -1;
  const std::string local = text(peer), remote = text(mine);
  std::ifstream in(peer.ss_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6");
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string sl, l, r, state, queues, timer, retr;
    long uid = -1;
    if (!(ss >> sl >> l >> r >> state >> queues >> timer >> retr >> uid)) continue;
    if (l == local && r == remote) return uid;
  }
  return -1;
}

std::string foreign_peer_error(const Endpoint& ep, int fd) {
  if (!ep.verify_peer) return "";
  const long uid = loopback_peer_uid(fd);
  if (uid == long(::geteuid())) return "";
  std::string who = uid < 0 ? "a process kgate-mcp cannot identify" : "uid " + std::to_string(uid);
  if (uid >= 0)
    if (const passwd* pw = ::getpwuid(uid_t(uid)); pw && pw->pw_name) who += " (" + std::string(pw->pw_name) + ")";
  return ep.url + " is served by " + who + ", not by you (uid " + std::to_string(::geteuid()) + "): " +
         program_invocation_short_name + " sent it nothing, no token, environment, path or code. Another user " +
         "may be listening on the port while your kgate is down: start kgate (it says so if the port is taken), " +
         "or point $KGATE_URL at it";
}

std::string send_token(const Endpoint& ep) {
  if (!ep.token.empty() || !ep.local_token) return ep.token;
  return read_local_token(default_state_dir());
}

void parse_gateways(const std::string& text, const std::string& source, Config& cfg) {
  toml::table tbl;
  try {
    tbl = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream ss;
    ss << source << ":" << e.source().begin.line << ":" << e.source().begin.column << ": " << e.description();
    throw std::runtime_error(ss.str());
  }
  for (auto& [key, node] : tbl) {
    if (key.str() != "gateways")
      throw std::runtime_error(source + ": unknown table [" + std::string(key.str()) + "] (expected [gateways.NAME])");
    auto gws = node.as_table();
    if (!gws) throw std::runtime_error(source + ": gateways must be a table of [gateways.NAME]");
    for (auto& [name, gnode] : *gws) {
      std::string n(name.str());
      auto g = gnode.as_table();
      if (!g) throw std::runtime_error(source + ": gateways." + n + " must be a table");
      GatewayEntry e;
      for (auto& [k, v] : *g) {
        std::string field(k.str());
        std::string where = source + ": gateways." + n + "." + field;
        if (field == "url" || field == "token" || field == "token_env") {
          auto s = v.value<std::string>();
          if (!s || !v.is_string()) throw std::runtime_error(where + " must be a string");
          (field == "url" ? e.url : field == "token" ? e.token : e.token_env) = *s;
        } else if (field == "verify") {
          if (!v.is_boolean()) throw std::runtime_error(where + " must be true or false");
          e.verify = *v.value<bool>();
        } else if (field == "ca_file") {
          if (!v.is_string() || v.value<std::string>()->empty())
            throw std::runtime_error(where + " must be the path of a PEM file");
          e.ca_file = *v.value<std::string>();
        } else {
          throw std::runtime_error(where + ": unknown key (expected url, token, token_env, verify, ca_file)");
        }
      }
      if (e.url.empty()) throw std::runtime_error(source + ": gateways." + n + " has no url");
      if (!e.token.empty() && !e.token_env.empty())
        throw std::runtime_error(source + ": gateways." + n + " has both token and token_env: keep one");
      cfg.gateways[n] = std::move(e);
    }
  }
}

Config load_config() {
  Config cfg;
  cfg.dir = kgate_config_dir();
  cfg.default_url = env_or("KGATE_URL", cfg.default_url);
  cfg.default_token = env_or("KGATE_TOKEN", "");
  cfg.default_ca_file = env_or("KGATE_CA_FILE", "");
  cfg.default_verify = tls_verify_from_env();
  std::ifstream in(cfg.gateways_file());
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    try {
      parse_gateways(ss.str(), cfg.gateways_file().string(), cfg);
    } catch (const std::exception& e) {
      cfg.gateways_error = e.what();
      spdlog::warn("{}", cfg.gateways_error);
    }
  }
  return cfg;
}

bool resolve_gateway(const Config& cfg, const std::string& host, Endpoint& ep, std::string& error) {
  ep = Endpoint{};
  if (host.empty() || (host.find("://") != std::string::npos && without_slash(host) == without_slash(cfg.default_url))) {
    ep.name = host;
    ep.is_default = host.empty();
    ep.verify = cfg.default_verify;
    ep.ca_file = cfg.default_ca_file;
    if (!parse_endpoint_url(host.empty() ? cfg.default_url : host, ep, error)) return false;
    ep.token = cfg.default_token;
    // Without $KGATE_TOKEN, the owner's kgate's own token may go to it (send_token checks).
    ep.verify_peer = !ep.is_unix() && is_loopback_host(ep.host);
    ep.local_token = ep.token.empty() && ep.verify_peer;
    return true;
  }
  if (host.find("://") != std::string::npos) {
    // A gateways.toml entry with this URL: its token and TLS settings.
    if (cfg.gateways_error.empty())
      for (const auto& [name, g] : cfg.gateways)
        if (without_slash(g.url) == without_slash(host)) {
          if (!resolve_gateway(cfg, name, ep, error)) return false;
          ep.name = host;
          return true;
        }
    ep.name = host;
    ep.verify = cfg.default_verify;
    ep.ca_file = cfg.default_ca_file;
    return parse_endpoint_url(host, ep, error);  // no token goes to a URL nobody paired one with
  }
  if (!cfg.gateways_error.empty()) {
    error = "gateways.toml is broken, so gateway '" + host + "' cannot be looked up: " + cfg.gateways_error;
    return false;
  }
  auto it = cfg.gateways.find(host);
  if (it == cfg.gateways.end()) {
    error = "unknown gateway '" + host + "': not a URL, and not in " + cfg.gateways_file().string();
    return false;
  }
  const auto& g = it->second;
  ep.name = host;
  ep.verify = g.verify;
  ep.ca_file = config_path(cfg, g.ca_file);
  ep.token = g.token;
  if (!g.token_env.empty()) {
    const char* v = std::getenv(g.token_env.c_str());
    if (!v || !*v) {
      error = "gateway '" + host + "' takes its token from $" + g.token_env + ", which is not set";
      return false;
    }
    ep.token = v;
  }
  return parse_endpoint_url(g.url, ep, error);
}

}  // namespace kgate::client
