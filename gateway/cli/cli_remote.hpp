// `kgate kernels`: lists the kernelspecs, kernels and sessions of a gateway (kgate or any Jupyter
// server), by gateways.toml name or URL, through kgate-mcp's listing (kgate/client/listing.hpp).
#pragma once

#include <string>

#include "kgate/client/gateways_toml.hpp"

namespace kgate::gw {

// host: "" = the default gateway ($KGATE_URL, default http://127.0.0.1:8787, token $KGATE_TOKEN),
// a name from gateways.toml, or a URL.  Prints the listing on stdout (a table, or with `json` one
// JSON object) and every error on stderr; the token is never printed.  Blocks up to ~15 s.
// Returns the exit status: 0 listed, 1 the remote could not be listed (or only in part),
// 2 `host` is not a known name or a usable URL.
int print_remote_kernels(const kgate::client::Config& cfg, const std::string& host, bool json);

}  // namespace kgate::gw
