// kgate.toml: reads the config file into GatewayOptions (CLI flags are applied after it).
#pragma once

#include <filesystem>

#include "options.hpp"

namespace kgate::gw {

// $XDG_CONFIG_HOME/kgate/kgate.toml (or ~/.config/kgate/kgate.toml).
std::filesystem::path default_config_path();

// Applies every key in the file to `opts`.  Throws std::runtime_error naming the file, the
// key and what is wrong (a parse error, an unknown key, a wrong type or a bad value).
void load_config_file(const std::filesystem::path& path, GatewayOptions& opts);

// Why these settings may not be served (main refuses to start, SIGHUP keeps the running ones),
// or "": without a token, a non-loopback TCP bind, or "*" in allow_origins (any web page could
// drive the API).
std::string unsafe_settings(const GatewayOptions& opts);

}  // namespace kgate::gw
