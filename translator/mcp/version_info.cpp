// What kgate-mcp says about itself (serverInfo).
#include "kgate/mcp/version_info.hpp"

#include "kgate/version.hpp"

namespace kgate::mcp {

std::string_view server_name() { return "kgate-mcp"; }
std::string_view server_version() { return kgate::version(); }

}  // namespace kgate::mcp
