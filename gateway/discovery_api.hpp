// GET /api/kgate/kernelspecs: the whole kernel catalog, launchable or not, with the reasons.
#pragma once

#include <string>
#include <vector>

#include "api.hpp"

namespace kgate::gw {

// parts[0..2] == "api", "kgate", "kernelspecs". `?refresh=1` rediscovers first (waits up to 60 s).
void handle_kgate_kernelspecs(Server& server, const Request& req, const std::vector<std::string>& parts,
                              const std::string& query, Respond respond);

}  // namespace kgate::gw
