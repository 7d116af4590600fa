// Fuzz target: the JSON files kgate reads that a person or another program wrote: kernel.json
// (kernelspecs) and connection files.  Each loader either succeeds or throws
// std::runtime_error naming the file; nothing else may happen.  What loads must serialise.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "kgate/jupyter/connection.hpp"
#include "kgate/jupyter/kernelspec.hpp"

namespace fs = std::filesystem;

namespace {

fs::path scratch() {
  static const fs::path dir = [] {
    auto d = fs::temp_directory_path() / ("kgate-fuzz-json-" + std::to_string(::getpid()));
    fs::create_directories(d / "spec");
    return d;
  }();
  return dir;
}

void put(const fs::path& file, const std::string& text) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const fs::path dir = scratch();

  put(dir / "spec" / "kernel.json", text);
  try {
    auto spec = kgate::load_kernelspec(dir / "spec");
    (void)spec.spec_json().dump();
    (void)spec.resources();
  } catch (const std::runtime_error&) {
  }

  put(dir / "connection.json", text);
  try {
    auto info = kgate::load_connection_info(dir / "connection.json");
    (void)info.to_json().dump();
  } catch (const std::runtime_error&) {
  }
  return 0;
}
