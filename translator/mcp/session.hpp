// The MCP session engine's private parts, shared by translator/mcp/: the protocol's constants
// and helpers (session.cpp), the state of a call and of a task and what the worker threads share
// (below), the call's worker thread and its requests to the client (calls.cpp).  McpSession
// itself is jsonrpc.cpp; the arguments' check, arguments.cpp; the stdio transport, stdio.cpp.
#pragma once

#include "kgate/mcp/jsonrpc.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <istream>
#include <map>
#include <mutex>
#include <ostream>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "kgate/jupyter/connection.hpp"
#include "kgate/mcp/version_info.hpp"

namespace kgate::mcp {
namespace session_detail {

inline constexpr std::array<std::string_view, 3> kLegacyVersions = {"2025-11-25", "2025-06-18", "2025-03-26"};
inline constexpr std::string_view kMetaVersion = "io.modelcontextprotocol/protocolVersion";
inline constexpr std::string_view kMetaCapabilities = "io.modelcontextprotocol/clientCapabilities";
inline constexpr std::string_view kMetaServerInfo = "io.modelcontextprotocol/serverInfo";
inline constexpr std::string_view kMetaClientInfo = "io.modelcontextprotocol/clientInfo";
// How long a modern client may reuse server/discover and tools/list. The tool list stays the
// same for as long as this binary runs, and it is the same for every client ("public").
inline constexpr long long kListTtlMs = 60LL * 60 * 1000;
// Arrays and objects nested deeper than this are refused without parsing them. Tool arguments
// are shallow, and code that walks a value recursively (dump, the tool layer) would run out of
// stack on a line of a few million '['.
inline constexpr std::size_t kMaxDepth = 256;
inline constexpr std::size_t kReadChunk = 64u << 10;
// MCP tasks (2025-11-25, experimental): the version that has them, how long a task and its
// result are kept unless the client asks for less, the longest it may ask for, how often a
// client is told to poll, and how many tasks a session keeps (the oldest ended one goes first;
// with all of them running, a new one is refused).
inline constexpr std::string_view kTasksVersion = "2025-11-25";
inline constexpr long long kTaskTtlMs = 60LL * 60 * 1000;
inline constexpr long long kMaxTaskTtlMs = 24LL * 60 * 60 * 1000;
inline constexpr long long kTaskPollMs = 1000;
inline constexpr std::size_t kMaxTasks = 256;
inline constexpr std::string_view kMetaRelatedTask = "io.modelcontextprotocol/related-task";
// The 2026-07-28 tasks extension: its name (in server/discover's capabilities and the client's
// per-request capabilities), and how long a call whose client declared it runs before its
// answer becomes a task (a shorter call is answered as usual).
inline constexpr std::string_view kTasksExtension = "io.modelcontextprotocol/tasks";
inline constexpr auto kTaskAfter = std::chrono::seconds(5);
inline constexpr int kMissingCapability = -32021;  // the extension's "Missing required client capability"

struct TaskState;

// One tools/call, shared by the reader thread and the call's worker thread.
struct CallState {
  Call call;
  Sink out;                // where its progress and its reply go: the transport of its request
  std::mutex mutex;        // orders progress, the reply and a cancellation
  bool replied = false;    // the reply went out, or was dropped: nothing more is sent for the call
  bool dropped = false;    // notifications/cancelled named the call, so its reply is not sent
  std::optional<double> last_progress;
  std::chrono::steady_clock::time_point last_progress_at{};
  std::chrono::milliseconds progress_interval{1000};  // ServerOptions::progress_interval
  std::shared_ptr<TaskState> task;  // a task-augmented call: its reply is kept, not sent
  std::string key;                  // its entry in Shared::in_flight
  // The tasks extension (2026-07-28): the call is answered as usual if it ends within
  // kTaskAfter; else (or as soon as it asks the client something) it becomes its task, and
  // the request is answered with the task (CreateTaskResult). Under `mutex`.
  bool may_become_task = false;
  bool promoted = false;
  std::condition_variable settled;  // the reply went out, or the call became a task
};

// One MCP task: a tools/call whose reply is kept for tasks/result (under Shared::tasks_mutex).
struct TaskState {
  std::string id;
  std::string created_at, updated_at;  // ISO 8601
  std::chrono::steady_clock::time_point created;
  long long ttl_ms = kTaskTtlMs;
  std::string status = "working";  // working, then completed, failed or cancelled (terminal)
  std::string message;
  std::optional<json> reply;  // the call's JSON-RPC reply, without its id, once it ended
  std::vector<std::pair<json, Sink>> waiting;  // tasks/result requests: id, where to answer
  std::shared_ptr<CallState> call;
  // The tasks extension's (2026-07-28): what the task asks the client (inputRequests, by key)
  // while it is input_required, and the answers tasks/update brought (by key).
  bool modern = false;
  json input_requests = json::object();
  std::map<std::string, json> answers;
  std::condition_variable answered;  // with Shared::tasks_mutex
  std::uint64_t next_key = 0;

  bool terminal() const { return status == "completed" || status == "failed" || status == "cancelled"; }
  json to_json() const {
    if (modern) {
      json j = {{"taskId", id},          {"status", status}, {"createdAt", created_at},
                {"lastUpdatedAt", updated_at}, {"ttlMs", ttl_ms}, {"pollIntervalMs", kTaskPollMs}};
      if (!message.empty()) j["statusMessage"] = message;
      return j;
    }
    json j = {{"taskId", id},          {"status", status}, {"createdAt", created_at},
              {"lastUpdatedAt", updated_at}, {"ttl", ttl_ms}, {"pollInterval", kTaskPollMs}};
    if (!message.empty()) j["statusMessage"] = message;
    return j;
  }
  // tasks/get's answer in the extension: the task, and what its status carries.
  json detailed() const {
    json j = to_json();
    if (status == "input_required") j["inputRequests"] = input_requests;
    if (status == "completed" && reply && reply->contains("result")) j["result"] = (*reply)["result"];
    if (status == "failed" && reply && reply->contains("error")) j["error"] = (*reply)["error"];
    return j;
  }
};

// The state that worker threads share with the session. It can outlive the session, because a
// call still running after eof_grace keeps it alive.
struct Shared {
  // Once the session is closed nothing more is sent, from any thread (under each call's mutex).
  std::atomic<bool> closed{false};

  // Requests to the client (Call::ask_client) waiting for their response, by id.
  struct Ask {
    std::mutex mutex;
    std::condition_variable answered;
    std::optional<json> response;
  };
  std::mutex asks_mutex;
  std::map<std::string, std::shared_ptr<Ask>> asks;
  std::uint64_t next_ask = 0;

  std::mutex tasks_mutex;
  std::map<std::string, std::shared_ptr<TaskState>> tasks;  // by id
  std::vector<std::string> task_order;                       // ids, oldest first

  std::mutex calls_mutex;
  std::condition_variable calls_done;  // notified whenever a call leaves in_flight
  std::map<std::string, std::shared_ptr<CallState>> in_flight;  // by id_key
  std::map<std::uint64_t, std::thread> threads;  // by sequence number
  std::vector<std::uint64_t> finished;            // threads whose call ended, to be joined
};

// What kind of request this is: modern (the version is in its _meta) or legacy.
struct Era {
  bool modern = false;
  std::string version;
};

// The translator's protocol log. It writes to stderr: stdout carries nothing but protocol, and
// spdlog's default logger writes to stdout. It is registered with spdlog, so spdlog::set_level
// and set_pattern in main apply to it too.
spdlog::logger& log();
bool is_legacy_version(std::string_view v);
json supported_versions();
json server_info();
json make_error(const json& id, int code, std::string message, json data = nullptr);
json make_result(const json& id, json result);
// The deepest nesting of arrays and objects in `text` (outside strings). Counting stops once
// it passes `limit`.
std::size_t nesting_depth(std::string_view text, std::size_t limit);
bool is_blank(std::string_view line);
// A task's reply, as tasks/result returns it to request `id`.
json task_reply(const TaskState& t, const json& id);
// Whether a modern request's client declared the tasks extension (in its _meta capabilities).
bool declares_tasks(const json& params);
// Adds what a modern result carries on top of the legacy shape.
json complete(json result, const Era& era);
// Answers a call that may become a task (the tasks extension) with its task, unless it was
// answered already. True if it is a task now.
bool promote(const std::shared_ptr<Shared>& shared, const std::shared_ptr<CallState>& st);
// Call::ask_client for a call that may become a task: the call becomes its task (if it is not
// one yet), which turns input_required with the request until tasks/update answers it.
std::optional<json> ask_in_task(const std::weak_ptr<CallState>& weak_state, const std::weak_ptr<Shared>& weak_shared,
                                const std::string& method, const json& params, std::chrono::milliseconds timeout);
// The body of a call's worker thread: runs the tool, then sends the reply unless the call was
// cancelled.
void run_call(const std::shared_ptr<Shared>& shared, ToolHandler& handler, const std::shared_ptr<CallState>& st,
              std::uint64_t seq, Era era);
// Sends a request to the client for a call and waits for its answer (see Call::ask_client).
std::optional<json> ask_client(const std::weak_ptr<CallState>& weak_state, const std::weak_ptr<Shared>& weak_shared,
                               const std::string& method, const json& params, std::chrono::milliseconds timeout);
// Sends notifications/progress for a call (see Call::progress), at most one per
// ServerOptions::progress_interval.
void send_progress(const std::weak_ptr<CallState>& weak_state, const std::weak_ptr<Shared>& weak_shared,
                   double progress, std::optional<double> total, const std::string& message);
// Ids are strings or numbers. JSON-RPC allows null, but MCP does not.
bool is_valid_id(const json& id);
// The key of a request id in the in-flight table. The string "1" and the number 1 are different ids.
std::string id_key(const json& id);
json text_block(std::string text);

}  // namespace session_detail
using namespace session_detail;
}  // namespace kgate::mcp
