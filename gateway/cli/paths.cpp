// Where this kgate runs from, and its kgate-supervise (paths.hpp).
#include "cli/paths.hpp"

#include <unistd.h>

#include <string>
#include <string_view>
#include <system_error>

namespace kgate::gw {
namespace fs = std::filesystem;

SelfPaths self_paths(const fs::path& exe) {
  SelfPaths p;
  p.exe = exe;
  const fs::path dir = exe.parent_path();
  for (const fs::path& sup : {dir / "kgate-supervise", dir.parent_path() / "lib" / "kgate" / "kgate-supervise"}) {
    if (::access(sup.c_str(), X_OK) == 0) {
      p.supervisor = sup;
      break;
    }
  }
  std::error_code ec;  // build/gateway/kgate, build/translator/kgate-mcp: the cache is in build/
  p.build_tree = fs::exists(dir.parent_path() / "CMakeCache.txt", ec);
  return p;
}

SelfPaths self_paths() {
  std::error_code ec;
  std::string s = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) return {};
  constexpr std::string_view deleted = " (deleted)";  // the binary was replaced while it runs
  if (s.size() > deleted.size() && s.ends_with(deleted)) s.resize(s.size() - deleted.size());
  return self_paths(fs::path(s));
}

}  // namespace kgate::gw
