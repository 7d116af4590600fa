// `kgate kernelspecs`: one discovery in this process, printed as a table or as JSON.
#include "cli/cli_kernelspecs.hpp"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "kgate/discovery/discovery.hpp"
#include "kgate/jupyter/utf8.hpp"

namespace kgate::gw {

int print_kernelspecs(bool as_json) {
  DiscoveryOptions opts;
  InterpreterProber prober;
  Catalog cat;
  try {
    cat = discover(opts, prober);
  } catch (const std::exception& e) {
    std::cerr << "kgate: kernel discovery failed: " << e.what() << "\n";
    return 1;
  }
  for (auto& w : cat.warnings) std::cerr << "kgate: kernelspec skipped: " << w << "\n";
  if (as_json) {
    std::cout << catalog_json(cat).dump(1) << "\n";
  } else {
    std::vector<std::vector<std::string>> rows = {{"NAME", "DISPLAY NAME", "LANGUAGE", "SOURCE", "LAUNCHABLE"}};
    for (auto& e : cat.entries) {
      std::string source = e.kind == "interpreter" ? (e.env.empty() ? e.source : e.env + " (" + e.source + ")")
                                                   : e.source + (e.env.empty() ? "" : " [" + e.env + "]");
      std::string verdict = e.launchable ? "yes" : "no: " + e.reason;
      if (e.launchable && e.spec.name == cat.default_name) verdict += " (default)";
      rows.push_back({e.spec.name, e.spec.display_name, e.spec.language, source, verdict});
    }
    std::cout << format_table(rows);
    std::cout << "\n" << cat.entries.size() << " kernelspecs, " << cat.launchable_count() << " launchable; "
              << cat.interpreters.size() << " interpreters checked in " << cat.took.count() << " ms\n";
  }
  return cat.launchable_count() ? 0 : 1;
}

}  // namespace kgate::gw
