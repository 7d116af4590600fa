// Kernelspecs: kernel.json loading and the basic lookup in the Jupyter data directories.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kgate {

struct KernelSpec {
  std::string name;                   // the directory name, lowercased
  std::filesystem::path resource_dir;  // the directory holding kernel.json
  std::vector<std::string> argv;       // may contain "{connection_file}"
  std::string display_name;
  std::string language;
  std::string interrupt_mode = "signal";  // "signal" or "message"
  std::map<std::string, std::string> env;  // values may contain ${VAR}
  nlohmann::json metadata = nlohmann::json::object();
  nlohmann::json raw;  // the whole kernel.json as read (every field, including unknown ones)

  // The spec part of the kernelspec API model: every field of kernel.json, with argv, env,
  // display_name, language, interrupt_mode and metadata always present.
  nlohmann::json spec_json() const;
  // File names in resource_dir that the API lists as resources: kernel.js, kernel.css and
  // logo-* files.  Map key = the API's resource name (file name without extension for logos).
  std::map<std::string, std::string> resources() const;
};

// Loads <dir>/kernel.json.  Throws std::runtime_error naming the file and the reason
// (missing, unreadable, bad JSON, argv missing or empty, a field of the wrong type).
KernelSpec load_kernelspec(const std::filesystem::path& dir);

struct KernelSpecScan {
  std::map<std::string, KernelSpec> specs;  // by name; the first directory wins
  std::vector<std::string> warnings;        // one per spec skipped: file and reason
};
// Scans every <dir>/<name>/kernel.json in `dirs`, in order.  Names are case-insensitive.
KernelSpecScan scan_kernelspecs(const std::vector<std::filesystem::path>& dirs);

// Expands ${VAR} in `value` from `env` (then from the process environment); unknown -> "".
std::string expand_env(const std::string& value, const std::map<std::string, std::string>& env);

}  // namespace kgate
