// Fuzz target: the TOML files kgate reads: gateways.toml (kgate-mcp's gateways, parsed by
// the code kgate itself links for `kgate kernels --host`) and kgate.toml.  Each parser either
// succeeds or throws std::runtime_error naming the file and place; nothing else may happen.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <spdlog/spdlog.h>

#include "config.hpp"
#include "kgate/client/gateways_toml.hpp"

namespace fs = std::filesystem;

namespace {

fs::path scratch() {
  static const fs::path dir = [] {
    spdlog::set_level(spdlog::level::off);
    auto d = fs::temp_directory_path() / ("kgate-fuzz-toml-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    kgate::client::Config cfg;
    kgate::client::parse_gateways(text, "gateways.toml", cfg);
  } catch (const std::runtime_error&) {
  }

  const fs::path file = scratch() / "kgate.toml";
  std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
  try {
    kgate::gw::GatewayOptions opts;
    kgate::gw::load_config_file(file, opts);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
