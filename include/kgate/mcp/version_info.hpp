// What kgate-mcp says about itself (serverInfo).
#pragma once

#include <string_view>

namespace kgate::mcp {

std::string_view server_name();
std::string_view server_version();

}  // namespace kgate::mcp
