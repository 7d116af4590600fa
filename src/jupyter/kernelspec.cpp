// Kernelspecs: reading and validating kernel.json, scanning kernelspec directories, ${VAR} expansion.
#include "kgate/jupyter/kernelspec.hpp"
#include "kgate/jupyter/utf8.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace kgate {

namespace {

namespace fs = std::filesystem;

std::string to_lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

[[noreturn]] void fail(const fs::path& file, const std::string& reason) {
  throw std::runtime_error(file.string() + ": " + reason);
}

}  // namespace

KernelSpec load_kernelspec(const fs::path& dir) {
  const fs::path file = dir / "kernel.json";

  std::error_code ec;
  if (!fs::exists(file, ec)) fail(file, "no such file");
  if (fs::is_directory(file, ec)) fail(file, "is a directory");

  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file, "cannot open for reading");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) fail(file, "read error");

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(buf.str());
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e999
    fail(file, std::string("invalid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(file, "top-level value is not an object");

  KernelSpec spec;
  spec.name = to_lower(dir.filename().string());
  if (spec.name.empty()) spec.name = to_lower(dir.parent_path().filename().string());
  spec.resource_dir = dir;

  // argv: required, a non-empty array of strings.
  auto it = j.find("argv");
  if (it == j.end()) fail(file, "argv is missing");
  if (!it->is_array()) fail(file, "argv is not an array");
  if (it->empty()) fail(file, "argv is empty");
  for (const auto& a : *it) {
    if (!a.is_string()) fail(file, "argv contains a non-string element");
    spec.argv.push_back(a.get<std::string>());
  }

  // display_name: required string.
  it = j.find("display_name");
  if (it == j.end()) fail(file, "display_name is missing");
  if (!it->is_string()) fail(file, "display_name is not a string");
  spec.display_name = it->get<std::string>();

  // language: optional string.
  it = j.find("language");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_string()) fail(file, "language is not a string");
    spec.language = it->get<std::string>();
  }

  // interrupt_mode: optional, "signal" or "message".
  it = j.find("interrupt_mode");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_string()) fail(file, "interrupt_mode is not a string");
    const auto mode = it->get<std::string>();
    if (mode != "signal" && mode != "message")
      fail(file, "interrupt_mode must be \"signal\" or \"message\", not \"" + mode + "\"");
    spec.interrupt_mode = mode;
  }

  // env: optional object of strings.
  it = j.find("env");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_object()) fail(file, "env is not an object");
    for (const auto& [k, v] : it->items()) {
      if (!v.is_string()) fail(file, "env value for \"" + k + "\" is not a string");
      spec.env[k] = v.get<std::string>();
    }
  }

  // metadata: optional object.
  it = j.find("metadata");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_object()) fail(file, "metadata is not an object");
    spec.metadata = *it;
  }

  spec.raw = std::move(j);
  return spec;
}

nlohmann::json KernelSpec::spec_json() const {
  nlohmann::json out = raw.is_object() ? raw : nlohmann::json::object();
  out["argv"] = argv;
  nlohmann::json e = nlohmann::json::object();
  for (const auto& [k, v] : env) e[k] = v;
  out["env"] = std::move(e);
  out["display_name"] = display_name;
  out["language"] = language;
  out["interrupt_mode"] = interrupt_mode;
  out["metadata"] = metadata.is_object() ? metadata : nlohmann::json::object();
  return out;
}

std::map<std::string, std::string> KernelSpec::resources() const {
  std::map<std::string, std::string> out;
  std::error_code ec;
  if (resource_dir.empty() || !fs::is_directory(resource_dir, ec)) return out;
  for (fs::directory_iterator di(resource_dir, ec), end; !ec && di != end; di.increment(ec)) {
    std::error_code fec;
    if (!di->is_regular_file(fec)) continue;
    const std::string fname = di->path().filename().string();
    if (fname == "kernel.js" || fname == "kernel.css") {
      out[fname] = fname;
    } else if (fname.rfind("logo-", 0) == 0) {
      out[di->path().stem().string()] = fname;
    }
  }
  return out;
}

KernelSpecScan scan_kernelspecs(const std::vector<fs::path>& dirs) {
  KernelSpecScan scan;
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;

    // Sort the entries so the result (and which of two case-variants wins) is deterministic.
    std::vector<fs::path> subdirs;
    for (fs::directory_iterator di(dir, ec), end; !ec && di != end; di.increment(ec)) {
      std::error_code dec;
      if (!di->is_directory(dec)) continue;
      std::error_code kec;
      if (!fs::exists(di->path() / "kernel.json", kec)) continue;
      subdirs.push_back(di->path());
    }
    std::sort(subdirs.begin(), subdirs.end());

    for (const auto& sub : subdirs) {
      const std::string name = to_lower(sub.filename().string());
      if (!is_valid_utf8(name)) {  // a file name is bytes; a kernelspec name travels in JSON
        scan.warnings.push_back(valid_utf8(sub.string()) +
                                ": skipped: a kernelspec's directory name must be valid UTF-8");
        continue;
      }
      if (scan.specs.count(name)) continue;  // an earlier directory (or case-variant) wins
      try {
        scan.specs.emplace(name, load_kernelspec(sub));
      } catch (const std::exception& e) {
        scan.warnings.emplace_back(e.what());
      }
    }
  }
  return scan;
}

std::string expand_env(const std::string& value, const std::map<std::string, std::string>& env) {
  std::string out;
  out.reserve(value.size());
  std::size_t i = 0;
  while (i < value.size()) {
    if (value[i] == '$' && i + 1 < value.size() && value[i + 1] == '{') {
      const std::size_t close = value.find('}', i + 2);
      if (close == std::string::npos) {  // unterminated: the rest stays literal
        out.append(value, i, std::string::npos);
        break;
      }
      const std::string var = value.substr(i + 2, close - i - 2);
      if (auto e = env.find(var); e != env.end()) {
        out += e->second;
      } else if (!var.empty()) {
        if (const char* v = std::getenv(var.c_str())) out += v;
      }
      i = close + 1;
    } else {
      out += value[i];
      ++i;
    }
  }
  return out;
}

}  // namespace kgate
