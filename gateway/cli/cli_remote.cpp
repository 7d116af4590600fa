// `kgate kernels` (see cli_remote.hpp).
#include "cli/cli_remote.hpp"

#include <iostream>

#include "kgate/client/listing.hpp"

namespace kgate::gw {

int print_remote_kernels(const kgate::client::Config& cfg, const std::string& host, bool json) {
  kgate::client::Endpoint ep;
  std::string error;
  if (!kgate::client::resolve_gateway(cfg, host, ep, error)) {
    std::cerr << "kgate: " << error << "\n";
    if (error.rfind("unknown gateway", 0) == 0) {
      std::string hint = kgate::client::known_gateways_hint(cfg);
      if (!hint.empty()) std::cerr << "kgate: " << hint << "\n";
    }
    return 2;
  }
  kgate::client::RemoteListing listing = kgate::client::list_remote(ep);
  if (listing.listed_anything()) {
    if (json) std::cout << kgate::client::render_json(listing).dump(2) << "\n";
    else std::cout << kgate::client::render_text(listing) << "\n";
    std::cout.flush();
  }
  if (listing.complete()) return 0;
  std::string text = listing.error_text();
  for (std::size_t at = 0; at <= text.size();) {
    auto nl = text.find('\n', at);
    std::cerr << "kgate: " << text.substr(at, nl == std::string::npos ? std::string::npos : nl - at) << "\n";
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  return 1;
}

}  // namespace kgate::gw
