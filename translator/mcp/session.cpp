// The MCP protocol's helpers (session.hpp): versions, ids, replies, eras.
#include "session.hpp"

namespace kgate::mcp::session_detail {

// The translator's protocol log. It writes to stderr: stdout carries nothing but protocol, and
// spdlog's default logger writes to stdout. It is registered with spdlog, so spdlog::set_level
// and set_pattern in main apply to it too.
spdlog::logger& log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    if (auto existing = spdlog::get("mcp")) return existing;
    return spdlog::stderr_logger_mt("mcp");
  }();
  return *logger;
}

bool is_legacy_version(std::string_view v) {
  return std::find(kLegacyVersions.begin(), kLegacyVersions.end(), v) != kLegacyVersions.end();
}

json supported_versions() {
  json all = json::array({kModernVersion});
  for (std::string_view v : kLegacyVersions) all.push_back(v);
  return all;
}

json server_info() {
  return {{"name", std::string(server_name())}, {"version", std::string(server_version())}};
}

// Ids are strings or numbers. JSON-RPC allows null, but MCP does not.
bool is_valid_id(const json& id) { return id.is_string() || id.is_number(); }

// The key of a request id in the in-flight table. The string "1" and the number 1 are different ids.
std::string id_key(const json& id) { return id.dump(); }

json make_error(const json& id, int code, std::string message, json data) {
  json error = {{"code", code}, {"message", std::move(message)}};
  if (!data.is_null()) error["data"] = std::move(data);
  return {{"jsonrpc", "2.0"}, {"id", id}, {"error", std::move(error)}};
}

json make_result(const json& id, json result) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

// The deepest nesting of arrays and objects in `text` (outside strings). Counting stops once
// it passes `limit`.
std::size_t nesting_depth(std::string_view text, std::size_t limit) {
  std::size_t depth = 0;
  std::size_t deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) break;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// A task's reply, as tasks/result returns it to request `id`.
json task_reply(const TaskState& t, const json& id) {
  json msg = *t.reply;
  msg["id"] = id;
  if (msg.contains("result") && msg["result"].is_object())
    msg["result"]["_meta"][std::string(kMetaRelatedTask)] = {{"taskId", t.id}};
  return msg;
}

// Whether a modern request's client declared the tasks extension (in its _meta capabilities).
bool declares_tasks(const json& params) {
  const auto meta = params.find("_meta");
  if (meta == params.end() || !meta->is_object()) return false;
  const auto caps = meta->find(kMetaCapabilities);
  if (caps == meta->end() || !caps->is_object()) return false;
  const auto ext = caps->find("extensions");
  return ext != caps->end() && ext->is_object() && ext->contains(kTasksExtension);
}

// Adds what a modern result carries on top of the legacy shape.
json complete(json result, const Era& era) {
  if (era.modern) {
    result["resultType"] = "complete";
    result["_meta"][std::string(kMetaServerInfo)] = server_info();
  }
  return result;
}

json text_block(std::string text) { return {{"type", "text"}, {"text", std::move(text)}}; }

}  // namespace kgate::mcp::session_detail
