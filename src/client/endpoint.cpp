// Gateway URLs: http://, https:// and unix:// endpoints, parsed by uriparser (RFC 3986).
#include "kgate/client/endpoint.hpp"

#include <sys/un.h>

#include <algorithm>
#include <cctype>
#include <memory>

#include <uriparser/Uri.h>

namespace kgate::client {

namespace {

std::string text(const UriTextRangeA& r) {
  return r.first && r.afterLast ? std::string(r.first, r.afterLast) : std::string();
}

bool has(const UriTextRangeA& r) { return r.first != nullptr; }

// The path as written (still percent-encoded), "/" joined; "" for none.
std::string path_of(const UriUriA& u) {
  std::string path;
  for (const UriPathSegmentA* seg = u.pathHead; seg; seg = seg->next) path += "/" + text(seg->text);
  return path;
}

// The path's segments decoded (a socket's file name).
std::string decoded(std::string s) {
  s.push_back('\0');
  const char* end = uriUnescapeInPlaceA(s.data());
  s.resize(std::size_t(end - s.data()));
  return s;
}

}  // namespace

bool parse_endpoint_url(const std::string& url, Endpoint& ep, std::string& error) {
  UriUriA u;
  const char* error_pos = nullptr;
  if (url.find("://") == std::string::npos || uriParseSingleUriA(&u, url.c_str(), &error_pos) != URI_SUCCESS) {
    error = "'" + url + "' is not a URL (expected http://host:port/)";
    if (error_pos && url.find("://") != std::string::npos) {
      // uriparser stops at the first byte its grammar rejects; when that is in the authority's
      // port (after the last ':' that is not inside an IPv6 literal), say so.
      const std::size_t at = std::size_t(error_pos - url.c_str());
      const std::size_t auth = url.find("://") + 3;
      const std::size_t auth_end = std::min(url.find_first_of("/?#", auth), url.size());
      const std::size_t colon = url.rfind(':', auth_end == 0 ? 0 : auth_end - 1);
      const std::size_t bracket = url.rfind(']', auth_end == 0 ? 0 : auth_end - 1);
      if (at >= auth && at <= auth_end && colon != std::string::npos && colon >= auth && colon < at &&
          (bracket == std::string::npos || bracket < auth || bracket < colon))
        error = "bad port in " + url + " (expected a number from 1 to 65535)";
      else
        error += ": bad character at offset " + std::to_string(at);
    }
    return false;
  }
  std::unique_ptr<UriUriA, void (*)(UriUriA*)> guard(&u, [](UriUriA* p) { uriFreeUriMembersA(p); });
  ep.url = url;
  ep.scheme = text(u.scheme);
  for (auto& c : ep.scheme) c = char(std::tolower(static_cast<unsigned char>(c)));
  ep.socket_path.clear();
  ep.ipv6 = false;
  if (has(u.userInfo)) {
    error = "a user name or password in " + ep.scheme +
            ":// URLs is not used: put the token in gateways.toml or $KGATE_TOKEN instead";
    return false;
  }
  if (has(u.query) || has(u.fragment)) {
    error = "'" + url + "' has a query or fragment; a gateway URL is scheme://host[:port][/base]";
    return false;
  }
  if (ep.scheme == "unix") {
    // unix:///path: an empty authority, then the socket's absolute path.
    const std::string path = decoded(path_of(u));
    if (!text(u.hostText).empty() || has(u.portText) || path.size() <= 1) {
      error = "'" + url + "' has no absolute socket path (expected unix:///path/to/kgate.sock: three slashes)";
      return false;
    }
    if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      error = "the socket path in " + url + " is too long (" + std::to_string(path.size()) + " bytes; at most " +
              std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + ")";
      return false;
    }
    ep.socket_path = path;
    ep.host = "localhost";
    ep.port.clear();
    ep.base = "/";
    return true;
  }
  if (ep.scheme != "http" && ep.scheme != "https") {
    error = "unsupported URL scheme '" + ep.scheme + "' in " + url + " (expected http, https or unix)";
    return false;
  }
  ep.host = text(u.hostText);
  if (ep.host.empty()) {
    error = "no host in " + url;
    return false;
  }
  ep.ipv6 = u.hostData.ip6 != nullptr;
  ep.port = text(u.portText);
  if (ep.port.empty()) {
    if (has(u.portText)) {  // "host:" with nothing after the colon
      error = "bad port in " + url + " (expected a number from 1 to 65535)";
      return false;
    }
    ep.port = ep.scheme == "https" ? "443" : "80";
  } else if (ep.port.size() > 5 || ep.port.find_first_not_of("0123456789") != std::string::npos ||
             std::stoul(ep.port) < 1 || std::stoul(ep.port) > 65535) {
    error = "bad port in " + url + " (expected a number from 1 to 65535)";
    return false;
  }
  ep.base = path_of(u);
  if (ep.base.empty() || ep.base.back() != '/') ep.base += '/';
  return true;
}

bool percent_decode(std::string_view in, std::string& out, bool plus_is_space) {
  for (std::size_t i = in.find('%'); i != std::string_view::npos; i = in.find('%', i + 1)) {
    if (i + 2 >= in.size() || !std::isxdigit(static_cast<unsigned char>(in[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(in[i + 2])))
      return false;
  }
  out.assign(in);
  out.push_back('\0');
  const char* end = uriUnescapeInPlaceExA(out.data(), plus_is_space ? URI_TRUE : URI_FALSE, URI_BR_DONT_TOUCH);
  out.resize(std::size_t(end - out.data()));
  return true;
}

std::string percent_encode(std::string_view s) {
  std::string out(s.size() * 3 + 1, '\0');  // uriEscape writes at most 3 bytes per byte, and a NUL
  const char* end = uriEscapeExA(s.data(), s.data() + s.size(), out.data(), URI_FALSE, URI_FALSE);
  out.resize(std::size_t(end - out.data()));
  return out;
}

}  // namespace kgate::client
