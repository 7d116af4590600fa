// The kernel table (see kernel_table.hpp and docs/dev/readoption.md).
#include "kgate/kernel/kernel_table.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace kgate {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "kgate-kernel";

const json& field(const json& j, const char* key, json::value_t type, const char* what) {
  auto it = j.find(key);
  if (it == j.end()) throw std::runtime_error(std::string(key) + " is missing");
  bool ok = it->type() == type ||
            (type == json::value_t::number_integer && it->type() == json::value_t::number_unsigned);
  if (!ok) throw std::runtime_error(std::string(key) + " is not " + what);
  return *it;
}

std::string str(const json& j, const char* key) { return field(j, key, json::value_t::string, "a string").get<std::string>(); }

}  // namespace

json KernelTableEntry::to_json() const {
  json sp = {{"name", spec.name},
             {"resource_dir", spec.resource_dir.string()},
             {"argv", spec.argv},
             {"display_name", spec.display_name},
             {"language", spec.language},
             {"interrupt_mode", spec.interrupt_mode},
             {"env", spec.env},
             {"metadata", spec.metadata},
             {"raw", spec.raw.is_null() ? json::object() : spec.raw}};
  return {{"format", kFormat},
          {"version", kVersion},
          {"id", id},
          {"pooled", pooled},
          {"spec", std::move(sp)},
          {"connection", conn.to_json()},
          {"connection_file", connection_file.string()},
          {"pid", pid},
          {"pid_start", pid_start},
          {"supervisor", supervisor},
          {"supervisor_pid", supervisor_pid},
          {"cull_idle_timeout_ms", cull_idle_timeout ? json(cull_idle_timeout->count()) : json(nullptr)},
          {"conversation", conversation},
          {"created_unix_ms", created_unix_ms},
          {"last_activity_unix_ms", last_activity_unix_ms},
          {"remote", remote}};
}

KernelTableEntry KernelTableEntry::from_json(const json& j) {
  if (!j.is_object()) throw std::runtime_error("not a JSON object");
  if (j.value("format", "") != kFormat) throw std::runtime_error("not a kgate kernel table entry (no \"format\": \"kgate-kernel\")");
  const int version = field(j, "version", json::value_t::number_integer, "an integer").get<int>();
  if (version > kVersion || version < 1)
    throw std::runtime_error("version " + std::to_string(version) + " (this kgate reads 1 to " + std::to_string(kVersion) +
                             "; a newer kgate wrote it)");
  KernelTableEntry e;
  e.id = str(j, "id");
  if (e.id.empty() || e.id.find('/') != std::string::npos) throw std::runtime_error("id is not a kernel id");
  e.pooled = field(j, "pooled", json::value_t::boolean, "true or false").get<bool>();
  const json& sp = field(j, "spec", json::value_t::object, "an object");
  e.spec.name = str(sp, "name");
  e.spec.resource_dir = str(sp, "resource_dir");
  e.spec.argv = field(sp, "argv", json::value_t::array, "an array").get<std::vector<std::string>>();
  if (e.spec.argv.empty()) throw std::runtime_error("spec.argv is empty");
  e.spec.display_name = str(sp, "display_name");
  e.spec.language = str(sp, "language");
  e.spec.interrupt_mode = str(sp, "interrupt_mode");
  e.spec.env = field(sp, "env", json::value_t::object, "an object").get<std::map<std::string, std::string>>();
  e.spec.metadata = field(sp, "metadata", json::value_t::object, "an object");
  e.spec.raw = field(sp, "raw", json::value_t::object, "an object");
  e.conn = ConnectionInfo::from_json(field(j, "connection", json::value_t::object, "an object"));
  e.connection_file = str(j, "connection_file");
  e.pid = field(j, "pid", json::value_t::number_integer, "an integer").get<int>();
  e.pid_start = field(j, "pid_start", json::value_t::number_integer, "an integer").get<unsigned long long>();
  e.supervisor = str(j, "supervisor");
  if (auto it = j.find("supervisor_pid"); it != j.end()) {  // optional: an earlier version-1 entry has none
    if (!it->is_number_integer()) throw std::runtime_error("supervisor_pid is not an integer");
    e.supervisor_pid = it->get<int>();
  }
  if (auto it = j.find("cull_idle_timeout_ms"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) throw std::runtime_error("cull_idle_timeout_ms is not an integer");
    e.cull_idle_timeout = std::chrono::milliseconds(it->get<std::int64_t>());
  }
  if (auto it = j.find("conversation"); it != j.end()) {  // optional: an earlier version-1 entry has none
    if (!it->is_string()) throw std::runtime_error("conversation is not a string");
    e.conversation = it->get<std::string>();
  }
  e.created_unix_ms = field(j, "created_unix_ms", json::value_t::number_integer, "an integer").get<std::int64_t>();
  if (auto it = j.find("last_activity_unix_ms"); it != j.end()) {  // optional: an earlier version-1 entry has none
    if (!it->is_number_integer()) throw std::runtime_error("last_activity_unix_ms is not an integer");
    e.last_activity_unix_ms = it->get<std::int64_t>();
  }
  if (auto it = j.find("remote"); it != j.end() && !it->is_null()) {  // optional: local kernels have none
    if (!it->is_object() || !it->contains("launcher") || !(*it)["launcher"].is_object())
      throw std::runtime_error("remote is not an object with a launcher");
    e.remote = *it;
  }
  return e;
}

void KernelTable::save(const KernelTableEntry& e) const {
  if (!enabled()) return;
  ensure_private_dir(dir_);
  write_file_atomically(dir_ / (e.id + ".json"), e.to_json().dump(1) + "\n");
}

void KernelTable::remove(const std::string& id) const {
  if (!enabled()) return;
  std::error_code ec;
  fs::remove(dir_ / (id + ".json"), ec);
}

KernelTable::Loaded KernelTable::load() const {
  Loaded out;
  if (!enabled()) return out;
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path p = it->path();
    const std::string name = p.filename().string();
    if (name.size() <= 5 || name.compare(name.size() - 5, 5, ".json") != 0 || name.front() == '.') continue;
    std::ifstream in(p, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    std::string why;
    try {
      const json j = json::parse(text.str());
      KernelTableEntry e = KernelTableEntry::from_json(j);
      if (e.id + ".json" != name) throw std::runtime_error("its id " + e.id + " is not its file name");
      out.entries.push_back(std::move(e));
      continue;
    } catch (const std::exception& e) {
      why = e.what();
    }
    // Set aside, so it is reported once, and kept for whoever wants to look at it.
    std::error_code rc;
    fs::rename(p, fs::path(p.string() + ".bad"), rc);
    out.problems.push_back(p.string() + ": " + why + (rc ? "" : "; set aside as " + name + ".bad"));
  }
  return out;
}

}  // namespace kgate
