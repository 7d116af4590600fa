// Where a gateway is: its URL (http, https or unix://), token and TLS settings.
#pragma once

#include <string>
#include <string_view>

namespace kgate::client {

// A gateway, resolved from `connect(host=...)` and gateways.toml.  The token is never logged.
struct Endpoint {
  std::string name;     // "" for the default gateway, else the gateways.toml name or the URL
  std::string url;      // as configured
  std::string scheme;   // "http", "https" (TLS, and wss:// for the websockets) or "unix"
  std::string host;     // unix: "localhost" (the Host header)
  std::string port;     // unix: ""
  std::string socket_path;  // unix: the socket file
  std::string base;     // the base path, ends with '/'
  std::string token;
  // No token of its own, but the owner's kgate's may go to it (the default gateway on loopback):
  // send_token() looks for it at each connection, so a kgate started later is found, and a
  // port another user has taken since gets nothing.
  bool local_token = false;
  // The default gateway on a loopback address: whoever accepted the connection must be this user
  // (loopback_peer_uid), checked after connect and before a byte is sent, token or not: another
  // user who listens on the port first gets no environment, cwd or code either.
  bool verify_peer = false;
  bool verify = true;   // https: check the certificate and the host name
  std::string ca_file;  // https: trust this PEM bundle instead of the system store ("" = system)
  bool is_default = false;
  bool ipv6 = false;    // host is an IPv6 address (written in brackets in a URL and a Host header)
  std::string display() const { return url; }
  bool is_unix() const { return scheme == "unix"; }
  // The HTTP Host header: host:port ([v6]:port), or localhost for a Unix socket.
  std::string host_header() const {
    return is_unix() ? host : (ipv6 ? "[" + host + "]" : host) + ":" + port;
  }
};

// Parses http://host[:port][/base] (port 80), https://host[:port][/base] (port 443) or
// unix:///absolute/path/to.sock (base "/"), by RFC 3986 (uriparser); false and `error` set if
// it is not such a URL: a port outside 1-65535, a user name or password, a query or a fragment
// is refused, never ignored.
bool parse_endpoint_url(const std::string& url, Endpoint& ep, std::string& error);

// RFC 3986 percent-encoding of a query value (every byte but unreserved characters).
std::string percent_encode(std::string_view s);

// Decodes the %-escapes of `in` into `out` (and '+' into a space when `plus_is_space`: a query
// component as HTML forms write it), with uriparser.  False when an escape is not '%' and two
// hex digits (uriparser would keep such a one as it is): a request with one is refused.
bool percent_decode(std::string_view in, std::string& out, bool plus_is_space);

}  // namespace kgate::client
