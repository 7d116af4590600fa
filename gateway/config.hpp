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

}  // namespace kgate::gw
