// What of a request may reach the log: a target with its secrets blanked.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "kgate/client/endpoint.hpp"

namespace kgate::gw {

// True for a query parameter whose value is a credential: `token` (the Jupyter URL token),
// and any name with "token" or "xsrf" in it (`access_token`, `_xsrf`), compared
// case-insensitively after %-decoding, as request_token reads names (`%74oken` is `token`).
// A name that does not decode is taken for a secret one.
inline bool is_secret_param(std::string_view raw_name) {
  std::string lower;
  if (!client::percent_decode(raw_name, lower, true)) return true;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("token") != std::string::npos || lower.find("xsrf") != std::string::npos;
}

// `target` for a log line: the path as it is, and in the query every secret parameter's value
// replaced by `[redacted]`. Capped at `max_bytes` (the cut is marked), after the redaction, so
// a cut can never leave half a token behind.
inline std::string loggable_target(std::string_view target, std::size_t max_bytes = 200) {
  std::string out;
  auto q = target.find('?');
  out.append(target.substr(0, q));
  if (q != std::string_view::npos) {
    out.push_back('?');
    std::string_view query = target.substr(q + 1);
    bool first = true;
    while (true) {
      auto amp = query.find('&');
      std::string_view pair = query.substr(0, amp);
      if (!first) out.push_back('&');
      first = false;
      auto eq = pair.find('=');
      std::string_view name = pair.substr(0, eq);
      if (eq != std::string_view::npos && is_secret_param(name)) {
        out.append(name);
        out.append("=[redacted]");
      } else {
        out.append(pair);
      }
      if (amp == std::string_view::npos) break;
      query.remove_prefix(amp + 1);
    }
  }
  if (out.size() > max_bytes) {
    out.resize(max_bytes);
    out.append("...");
  }
  return out;
}

// The log line for a request whose handler threw (HttpSession's catch-all): the method, the
// target with its secrets blanked, and the exception's text.
inline void log_internal_error(std::string_view method, std::string_view target, std::string_view what) {
  spdlog::error("internal error serving {} {}: {}", method, loggable_target(target), what);
}

}  // namespace kgate::gw
