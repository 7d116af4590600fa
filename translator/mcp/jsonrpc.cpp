// MCP (see jsonrpc.hpp): the session engine (dispatch for both protocol eras, the threads of the
// tool calls) and the stdio transport's line framing.
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
namespace {

constexpr std::array<std::string_view, 3> kLegacyVersions = {"2025-11-25", "2025-06-18", "2025-03-26"};
constexpr std::string_view kMetaVersion = "io.modelcontextprotocol/protocolVersion";
constexpr std::string_view kMetaCapabilities = "io.modelcontextprotocol/clientCapabilities";
constexpr std::string_view kMetaServerInfo = "io.modelcontextprotocol/serverInfo";
constexpr std::string_view kMetaClientInfo = "io.modelcontextprotocol/clientInfo";
// How long a modern client may reuse server/discover and tools/list. The tool list stays the
// same for as long as this binary runs, and it is the same for every client ("public").
constexpr long long kListTtlMs = 60LL * 60 * 1000;
// Arrays and objects nested deeper than this are refused without parsing them. Tool arguments
// are shallow, and code that walks a value recursively (dump, the tool layer) would run out of
// stack on a line of a few million '['.
constexpr std::size_t kMaxDepth = 256;
constexpr std::size_t kReadChunk = 64u << 10;
// MCP tasks (2025-11-25, experimental): the version that has them, how long a task and its
// result are kept unless the client asks for less, the longest it may ask for, how often a
// client is told to poll, and how many tasks a session keeps (the oldest ended one goes first;
// with all of them running, a new one is refused).
constexpr std::string_view kTasksVersion = "2025-11-25";
constexpr long long kTaskTtlMs = 60LL * 60 * 1000;
constexpr long long kMaxTaskTtlMs = 24LL * 60 * 60 * 1000;
constexpr long long kTaskPollMs = 1000;
constexpr std::size_t kMaxTasks = 256;
constexpr std::string_view kMetaRelatedTask = "io.modelcontextprotocol/related-task";
// The 2026-07-28 tasks extension: its name (in server/discover's capabilities and the client's
// per-request capabilities), and how long a call whose client declared it runs before its
// answer becomes a task (a shorter call is answered as usual).
constexpr std::string_view kTasksExtension = "io.modelcontextprotocol/tasks";
constexpr auto kTaskAfter = std::chrono::seconds(5);
constexpr int kMissingCapability = -32021;  // the extension's "Missing required client capability"

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

json make_error(const json& id, int code, std::string message, json data = nullptr) {
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

// Reads an istream one line at a time, holding no more than `max` bytes of any line.
class LineReader {
 public:
  enum class Status { line, too_long, eof };

  LineReader(std::istream& in, std::size_t max) : in_(in), max_(max), chunk_(kReadChunk) {}

  // Reads the next line into `line`, without its '\n'. A last line with no '\n' still counts.
  // A line longer than the limit is read to its end and dropped; `length` then holds its size.
  Status next(std::string& line, std::size_t& length) {
    line.clear();
    length = 0;
    bool extracted = false;
    bool too_long = false;
    for (;;) {
      if (in_.bad()) return extracted ? finish(line, too_long) : Status::eof;
      in_.getline(chunk_.data(), static_cast<std::streamsize>(chunk_.size()));
      const auto n = static_cast<std::size_t>(in_.gcount());
      std::size_t stored = n;
      bool end_of_line = true;
      if (in_.eof()) {
        if (n == 0 && !extracted) return Status::eof;
      } else if (in_.fail()) {  // the chunk filled up before the '\n'
        in_.clear();
        end_of_line = false;
      } else {
        stored = n - 1;  // gcount counted the '\n'
      }
      extracted = true;
      length += stored;
      if (length > max_) {
        if (!too_long) std::string().swap(line);  // let go of what was kept
        too_long = true;
      } else {
        line.append(chunk_.data(), stored);
      }
      if (end_of_line) return finish(line, too_long);
    }
  }

 private:
  static Status finish(std::string& line, bool too_long) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return too_long ? Status::too_long : Status::line;
  }

  std::istream& in_;
  std::size_t max_;
  std::vector<char> chunk_;
};

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

// A task's reply, as tasks/result returns it to request `id`.
json task_reply(const TaskState& t, const json& id) {
  json msg = *t.reply;
  msg["id"] = id;
  if (msg.contains("result") && msg["result"].is_object())
    msg["result"]["_meta"][std::string(kMetaRelatedTask)] = {{"taskId", t.id}};
  return msg;
}

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

// Answers a call that may become a task (the tasks extension) with its task, unless it was
// answered already. True if it is a task now.
bool promote(const std::shared_ptr<Shared>& shared, const std::shared_ptr<CallState>& st) {
  json created;
  {
    std::lock_guard lock(shared->tasks_mutex);
    created = st->task->to_json();
  }
  created["resultType"] = "task";
  created["_meta"][std::string(kMetaServerInfo)] = server_info();
  std::lock_guard lock(st->mutex);
  if (st->promoted) return true;
  if (st->replied || st->dropped || shared->closed) return false;
  st->promoted = true;
  st->out(make_result(st->call.id, std::move(created)));
  st->settled.notify_all();
  log().info("tools/call {} (id {}) became task {}", st->call.tool, st->call.id.dump(), st->task->id);
  return true;
}

// Call::ask_client for a call that may become a task: the call becomes its task (if it is not
// one yet), which turns input_required with the request until tasks/update answers it.
std::optional<json> ask_in_task(const std::weak_ptr<CallState>& weak_state, const std::weak_ptr<Shared>& weak_shared,
                                const std::string& method, const json& params, std::chrono::milliseconds timeout) {
  auto st = weak_state.lock();
  auto shared = weak_shared.lock();
  if (!st || !shared || !promote(shared, st)) return std::nullopt;
  TaskState& t = *st->task;
  std::unique_lock lock(shared->tasks_mutex);
  if (t.terminal()) return std::nullopt;
  const std::string key = "ask-" + std::to_string(++t.next_key);
  t.input_requests[key] = {{"method", method}, {"params", params}};
  t.status = "input_required";
  t.message = "Waiting for the user's answer (inputRequests).";
  t.updated_at = iso_now();
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!t.answers.count(key) && !t.terminal() && !st->call.cancelled && !shared->closed &&
         std::chrono::steady_clock::now() < until)
    t.answered.wait_for(lock, std::chrono::milliseconds(100));
  std::optional<json> response;
  if (auto it = t.answers.find(key); it != t.answers.end()) response = json{{"result", it->second}};
  t.answers.erase(key);
  t.input_requests.erase(key);
  if (t.status == "input_required" && t.input_requests.empty()) {
    t.status = "working";
    t.message.clear();
    t.updated_at = iso_now();
  }
  return response;
}

// The body of a call's worker thread: runs the tool, then sends the reply unless the call was
// cancelled.
void run_call(const std::shared_ptr<Shared>& shared, ToolHandler& handler, const std::shared_ptr<CallState>& st,
              std::uint64_t seq, Era era) {
  Call& call = st->call;
  // A call that may become a task: answered with its task if it runs past kTaskAfter.
  std::thread promoter;
  if (st->may_become_task) {
    promoter = std::thread([st, shared] {
      {
        std::unique_lock lock(st->mutex);
        if (st->settled.wait_for(lock, kTaskAfter, [&] { return st->replied || st->promoted || st->dropped; })) return;
      }
      promote(shared, st);
    });
  }
  json msg;
  try {
    try {
      ToolReply reply = handler.call(call);
      if (reply.input_requests && era.modern) {
        json result = {{"inputRequests", std::move(*reply.input_requests)}};
        if (!reply.request_state.empty()) result["requestState"] = std::move(reply.request_state);
        result = complete(std::move(result), era);
        result["resultType"] = "input_required";
        msg = make_result(call.id, std::move(result));
      } else if (!reply.content.is_array()) {
        log().error("tools/call {} (id {}): the tool returned content that is not an array", call.tool,
                    call.id.dump());
        msg = make_error(call.id, rpc_error::kInternalError, "Internal error: the tool returned malformed content");
      } else {
        msg = make_result(call.id,
                          complete({{"content", std::move(reply.content)}, {"isError", reply.is_error}}, era));
      }
    } catch (const InvalidParams& e) {
      log().info("tools/call {} (id {}): invalid arguments: {}", call.tool, call.id.dump(), e.what());
      msg = make_result(call.id, complete({{"content", json::array({text_block(e.what())})}, {"isError", true}}, era));
    } catch (const std::exception& e) {
      log().warn("tools/call {} (id {}) failed: {}", call.tool, call.id.dump(), e.what());
      msg = make_result(call.id, complete({{"content", json::array({text_block(e.what())})}, {"isError", true}}, era));
    } catch (...) {
      log().warn("tools/call {} (id {}) failed with an exception that is not a std::exception", call.tool,
                 call.id.dump());
      msg = make_result(call.id,
                        complete({{"content", json::array({text_block("the tool failed (unknown exception)")})},
                                  {"isError", true}},
                                 era));
    }
  } catch (const std::exception& e) {  // building the reply itself failed (e.g. out of memory)
    msg = make_error(call.id, rpc_error::kInternalError, std::string("Internal error: ") + e.what());
  }
  if (st->may_become_task) {
    bool promoted;
    {
      std::lock_guard lock(st->mutex);
      promoted = st->promoted;
      if (!promoted) {
        if (!st->dropped && !shared->closed) st->out(msg);
        else if (!shared->closed) st->out(json());
      }
      st->replied = true;
      st->settled.notify_all();
    }
    promoter.join();
    std::lock_guard lock(shared->tasks_mutex);
    TaskState& t = *st->task;
    if (promoted) {  // its result is the task's, for tasks/get
      json reply = msg;
      reply.erase("id");
      t.reply = std::move(reply);
      if (!t.terminal()) {  // a cancelled task stays cancelled
        t.status = msg.contains("error") ? "failed" : "completed";
        t.message = msg.contains("error") ? "The call failed: the task's error has why." : "";
      }
      t.input_requests = json::object();
      t.updated_at = iso_now();
      t.call.reset();
      t.answered.notify_all();
    } else {  // answered as usual: the client never heard of the task
      shared->tasks.erase(t.id);
      shared->task_order.erase(std::find(shared->task_order.begin(), shared->task_order.end(), t.id));
    }
  } else if (st->task) {
    // A task: its reply is kept for tasks/result, and given to those already waiting for it.
    std::vector<std::pair<json, Sink>> waiting;
    json stored;
    {
      std::lock_guard lock(shared->tasks_mutex);
      TaskState& t = *st->task;
      json reply = msg;
      reply.erase("id");
      t.reply = std::move(reply);
      if (t.status == "working") {  // a cancelled task stays cancelled
        bool failed = msg.contains("error") || msg["result"].value("isError", false);
        t.status = failed ? "failed" : "completed";
        t.message = failed ? "The tool reported an error: tasks/result has it." : "";
      }
      t.updated_at = iso_now();
      t.call.reset();
      waiting.swap(t.waiting);
      if (!shared->closed)
        for (auto& [wid, out] : waiting) out(task_reply(t, wid));  // under the lock: t stays whole
    }
    {
      std::lock_guard lock(st->mutex);
      st->replied = true;
    }
  } else {
    std::lock_guard lock(st->mutex);
    st->replied = true;
    if (st->dropped) {
      log().debug("tools/call {} (id {}): cancelled, its reply is not sent", call.tool, call.id.dump());
      if (!shared->closed) st->out(json());  // the transport may be waiting for it (Sink)
    } else if (!shared->closed) {
      st->out(msg);
    }
  }
  {
    std::lock_guard lock(shared->calls_mutex);
    shared->in_flight.erase(st->key);
    shared->finished.push_back(seq);
  }
  shared->calls_done.notify_all();
}

// Sends a request to the client for a call and waits for its answer (see Call::ask_client).
std::optional<json> ask_client(const std::weak_ptr<CallState>& weak_state, const std::weak_ptr<Shared>& weak_shared,
                               const std::string& method, const json& params, std::chrono::milliseconds timeout) {
  auto st = weak_state.lock();
  auto shared = weak_shared.lock();
  if (!st || !shared) return std::nullopt;
  auto ask = std::make_shared<Shared::Ask>();
  std::string id;
  {
    std::lock_guard lock(shared->asks_mutex);
    id = "kgate-ask-" + std::to_string(++shared->next_ask);
    shared->asks.emplace(id, ask);
  }
  json msg = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}};
  if (st->task) msg["params"]["_meta"][std::string(kMetaRelatedTask)] = {{"taskId", st->task->id}};
  bool sent = false;
  {
    std::lock_guard lock(st->mutex);
    if (!st->replied && !st->call.cancelled && !shared->closed) sent = st->out(msg);
  }
  std::optional<json> response;
  if (sent) {
    // Waits in slices, so a cancelled call or a closed session stops waiting at once.
    const auto until = std::chrono::steady_clock::now() + timeout;
    std::unique_lock lock(ask->mutex);
    while (!ask->response && !st->call.cancelled && !shared->closed && std::chrono::steady_clock::now() < until)
      ask->answered.wait_for(lock, std::chrono::milliseconds(100));
    response = ask->response;
  }
  std::lock_guard lock(shared->asks_mutex);
  shared->asks.erase(id);
  return response;
}

// Sends notifications/progress for a call (see Call::progress), at most one per
// ServerOptions::progress_interval.
void send_progress(const std::weak_ptr<CallState>& weak_state, const std::weak_ptr<Shared>& weak_shared,
                   double progress, std::optional<double> total, const std::string& message) {
  auto st = weak_state.lock();
  auto shared = weak_shared.lock();
  if (!st || !shared || !st->call.progress_token) return;
  if (!std::isfinite(progress) || (total && !std::isfinite(*total))) return;
  std::lock_guard lock(st->mutex);
  if (st->replied || st->promoted || st->call.cancelled || shared->closed) return;  // a task has no progress
  if (st->last_progress && progress <= *st->last_progress) return;
  // At most one a second per call, whatever the tool's loop does (a cell whose input() was
  // declined keeps its input_request until the interrupt lands, and the loop spins meanwhile).
  const auto now = std::chrono::steady_clock::now();
  if (st->last_progress && now - st->last_progress_at < st->progress_interval) return;
  st->last_progress = progress;
  st->last_progress_at = now;
  json params = {{"progressToken", *st->call.progress_token}, {"progress", progress}};
  if (total) params["total"] = *total;
  if (!message.empty()) params["message"] = message;
  st->out({{"jsonrpc", "2.0"}, {"method", "notifications/progress"}, {"params", std::move(params)}});
}

}  // namespace

struct McpSession::Impl {
  Impl(ToolHandler& h, ServerOptions op) : handler(h), opts(std::move(op)), shared(std::make_shared<Shared>()) {}
  // Only reached with threads left if the session was not closed (or its transport ended by an
  // exception): a joinable std::thread must not be destroyed, and a worker thread holds `shared`
  // as long as it needs it.
  ~Impl() {
    shared->closed = true;
    std::lock_guard lock(shared->calls_mutex);
    for (auto& entry : shared->threads) entry.second.detach();
    shared->threads.clear();
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void handle_line(std::string_view line);
  void handle_message(const json& msg);
  void handle_notification(const std::string& method, const json& params);
  void handle_request(const json& id, const std::string& method, const json& params);
  // Sets `era` from the request's _meta. Returns the error to send instead, if the _meta is bad.
  std::optional<json> request_era(const json& id, const json& params, Era& era) const;
  void initialize(const json& id, const json& params);
  void discover(const json& id);
  void tools_list(const json& id, const Era& era);
  void tools_call(const json& id, const json& params, const Era& era);
  // MCP tasks (2025-11-25): tasks/get, tasks/result, tasks/cancel, tasks/list.
  bool tasks_offered(const Era& era) const { return !era.modern && era.version == kTasksVersion; }
  std::shared_ptr<TaskState> find_task(const json& id, const json& params);
  void tasks_request(const json& id, const std::string& method, const json& params, const Era& era);
  // tasks/cancel's work on a task's call (null: it had ended): cancelled, and the tool told.
  void cancel_task_call(const std::shared_ptr<CallState>& call, const std::string& task);
  // The tasks extension (2026-07-28): tasks/get, tasks/update, tasks/cancel.
  void extension_tasks_request(const json& id, const std::string& method, const json& params, const Era& era);
  void cancel(const json& params);
  void reap();
  void at_eof();
  std::string instructions() const { return opts.instructions.empty() ? handler.instructions() : opts.instructions; }

  void send(const json& msg) {
    if (!shared->closed && out) out(msg);
  }

  ToolHandler& handler;
  ServerOptions opts;
  std::shared_ptr<Shared> shared;
  std::mutex handling;  // one message at a time: handle() may be called from several threads
  Sink out;             // the sink of the message being handled
  bool client_requests = true;  // whether `out` can carry requests to the client (Call::ask_client)
  // Under `handling`.
  std::string legacy_version{kLatestLegacyVersion};  // what initialize agreed, for legacy requests
  bool initialized = false;
  json client_caps = json::object();  // initialize's capabilities
  std::uint64_t next_seq = 0;
};

void McpSession::Impl::handle_line(std::string_view line) {
  if (is_blank(line)) return;
  if (nesting_depth(line, kMaxDepth) > kMaxDepth) {
    log().warn("a message nested deeper than {} levels, refused", kMaxDepth);
    send(make_error(nullptr, rpc_error::kParseError,
                    "Parse error: arrays and objects nested deeper than " + std::to_string(kMaxDepth) +
                        " levels are not accepted"));
    return;
  }
  json msg;
  try {
    msg = json::parse(line);
  } catch (const json::exception& e) {
    log().warn("an unparsable message ({} bytes): {}", line.size(), e.what());
    send(make_error(nullptr, rpc_error::kParseError, std::string("Parse error: ") + e.what()));
    return;
  }
  if (msg.is_array()) {
    send(make_error(nullptr, rpc_error::kInvalidRequest, "Invalid Request: batches are not supported"));
    return;
  }
  if (!msg.is_object()) {
    send(make_error(nullptr, rpc_error::kInvalidRequest, "Invalid Request: a message must be a JSON object"));
    return;
  }
  handle_message(msg);
}

void McpSession::Impl::handle_message(const json& msg) {
  const auto id_it = msg.find("id");
  const bool has_id = id_it != msg.end();
  const json id = has_id && is_valid_id(*id_it) ? *id_it : json(nullptr);
  const auto method_it = msg.find("method");
  if (method_it == msg.end()) {
    if (msg.contains("result") || msg.contains("error")) {
      // The answer to a request of ours (Call::ask_client), or to none: ignored then.
      std::shared_ptr<Shared::Ask> ask;
      if (has_id && id_it->is_string()) {
        std::lock_guard lock(shared->asks_mutex);
        if (auto it = shared->asks.find(id_it->get<std::string>()); it != shared->asks.end()) ask = it->second;
      }
      if (!ask) {
        log().debug("a response to no request of ours (id {}), ignored", has_id ? id_it->dump() : "none");
        return;
      }
      std::lock_guard lock(ask->mutex);
      ask->response = msg;
      ask->answered.notify_all();
      return;
    }
    send(make_error(id, rpc_error::kInvalidRequest, "Invalid Request: no \"method\""));
    return;
  }
  if (!method_it->is_string()) {
    send(make_error(id, rpc_error::kInvalidRequest, "Invalid Request: \"method\" must be a string"));
    return;
  }
  const auto version_it = msg.find("jsonrpc");
  if (version_it == msg.end() || *version_it != "2.0") {
    send(make_error(id, rpc_error::kInvalidRequest, "Invalid Request: \"jsonrpc\" must be \"2.0\""));
    return;
  }
  if (has_id && !is_valid_id(*id_it)) {
    send(make_error(nullptr, rpc_error::kInvalidRequest, "Invalid Request: \"id\" must be a string or a number"));
    return;
  }
  const std::string& method = method_it->get_ref<const std::string&>();
  json params = json::object();
  if (const auto p = msg.find("params"); p != msg.end() && !p->is_null()) params = *p;
  if (!params.is_object()) {
    if (has_id) {
      send(make_error(id, rpc_error::kInvalidParams, "Invalid params: \"params\" must be an object"));
    } else {
      log().debug("notification {} with params that are not an object, ignored", method);
    }
    return;
  }
  if (!has_id) {
    try {
      handle_notification(method, params);
    } catch (const std::exception& e) {
      log().error("notification {}: {}", method, e.what());
    }
    return;
  }
  try {
    handle_request(id, method, params);
  } catch (const std::exception& e) {
    log().error("{} (id {}): {}", method, id.dump(), e.what());
    send(make_error(id, rpc_error::kInternalError, std::string("Internal error: ") + e.what()));
  }
}

void McpSession::Impl::handle_notification(const std::string& method, const json& params) {
  if (method == "notifications/cancelled") {
    cancel(params);
  } else if (method == "notifications/initialized") {
    // Nothing to do: the server is ready as soon as it has answered initialize.
  } else {
    log().debug("notification {} ignored", method);
  }
}

std::optional<json> McpSession::Impl::request_era(const json& id, const json& params, Era& era) const {
  era = Era{false, legacy_version};
  const auto meta = params.find("_meta");
  if (meta == params.end() || !meta->is_object()) return std::nullopt;
  const auto version = meta->find(kMetaVersion);
  if (version == meta->end()) return std::nullopt;
  if (!version->is_string()) {
    return make_error(id, rpc_error::kInvalidParams,
                      "Invalid params: _meta \"" + std::string(kMetaVersion) + "\" must be a string");
  }
  const std::string& requested = version->get_ref<const std::string&>();
  if (is_legacy_version(requested)) {
    // A legacy revision named per request: the request is served the legacy way, in that version.
    era.version = requested;
    return std::nullopt;
  }
  if (requested != kModernVersion) {
    return make_error(id, rpc_error::kUnsupportedProtocolVersion, "Unsupported protocol version: " + requested,
                      {{"supported", supported_versions()}, {"requested", requested}});
  }
  const auto caps = meta->find(kMetaCapabilities);
  if (caps == meta->end() || !caps->is_object()) {
    return make_error(id, rpc_error::kInvalidParams,
                      "Invalid params: _meta \"" + std::string(kMetaCapabilities) + "\" (an object) is required");
  }
  era.modern = true;
  era.version = requested;
  if (const auto info = meta->find(kMetaClientInfo); info != meta->end() && info->is_object()) {
    const auto name = info->find("name");
    const auto ver = info->find("version");
    if (name != info->end() && name->is_string())
      handler.client_info(name->get<std::string>(), ver != info->end() && ver->is_string() ? ver->get<std::string>() : "?");
  }
  return std::nullopt;
}

void McpSession::Impl::handle_request(const json& id, const std::string& method, const json& params) {
  Era era;
  if (auto error = request_era(id, params, era)) {
    send(*error);
    return;
  }
  // Requests before initialize: the 2025-11-25 lifecycle says a client SHOULD NOT send them
  // (ping aside), and it does not say what a server must do with them. Clients differ: the
  // inspector and some SDKs send tools/list early, and a dual-era client that falls back from
  // server/discover may have already sent requests. So they are answered as usual, in the
  // newest legacy version, rather than refused. They need nothing that initialize sets up.
  if (!initialized && !era.modern && method != "initialize" && method != "ping") {
    log().debug("{} (id {}) before initialize: answered anyway", method, id.dump());
  }
  if (method == "initialize") {
    initialize(id, params);
  } else if (method == "ping") {
    send(make_result(id, complete(json::object(), era)));
  } else if (method == "server/discover") {
    discover(id);
  } else if (method == "tools/list") {
    tools_list(id, era);
  } else if (method == "tools/call") {
    tools_call(id, params, era);
  } else if (method.rfind("tasks/", 0) == 0 && era.modern) {
    extension_tasks_request(id, method, params, era);
  } else if (method.rfind("tasks/", 0) == 0 && tasks_offered(era)) {
    tasks_request(id, method, params, era);
  } else {
    log().info("{} (id {}): method not found", method, id.dump());
    send(make_error(id, rpc_error::kMethodNotFound, "Method not found: " + method));
  }
}

void McpSession::Impl::initialize(const json& id, const json& params) {
  std::string requested;
  if (const auto v = params.find("protocolVersion"); v != params.end()) {
    if (!v->is_string()) {
      send(make_error(id, rpc_error::kInvalidParams, "Invalid params: \"protocolVersion\" must be a string"));
      return;
    }
    requested = v->get<std::string>();
  }
  legacy_version = is_legacy_version(requested) ? requested : std::string(kLatestLegacyVersion);
  initialized = true;
  if (const auto caps = params.find("capabilities"); caps != params.end() && caps->is_object()) client_caps = *caps;
  std::string client = "an unnamed client";
  if (const auto info = params.find("clientInfo"); info != params.end() && info->is_object()) {
    auto field = [&](const char* key) {
      const auto f = info->find(key);
      return f != info->end() && f->is_string() ? f->get<std::string>() : std::string("?");
    };
    client = field("name") + " " + field("version");
    handler.client_info(field("name"), field("version"));
  }
  log().info("initialize: {} asked for {}, speaking {}", client, requested.empty() ? "no version" : requested,
             legacy_version);
  json result = {{"protocolVersion", legacy_version},
                 {"capabilities", {{"tools", {{"listChanged", false}}}}},
                 {"serverInfo", server_info()}};
  if (legacy_version == kTasksVersion)  // tools/call of a tool whose execution.taskSupport allows it
    result["capabilities"]["tasks"] = {{"list", json::object()}, {"cancel", json::object()},
                                       {"requests", {{"tools", {{"call", json::object()}}}}}};
  if (auto text = instructions(); !text.empty()) result["instructions"] = std::move(text);
  send(make_result(id, std::move(result)));
}

void McpSession::Impl::discover(const json& id) {
  // server/discover is modern by nature, so it gets the modern result even without _meta.
  json result = {{"resultType", "complete"},
                 {"supportedVersions", supported_versions()},
                 {"capabilities", {{"tools", json::object()}, {"extensions", {{std::string(kTasksExtension), json::object()}}}}},
                 {"_meta", {{std::string(kMetaServerInfo), server_info()}}},
                 {"ttlMs", kListTtlMs},
                 {"cacheScope", "public"}};
  if (auto text = instructions(); !text.empty()) result["instructions"] = std::move(text);
  send(make_result(id, std::move(result)));
}

void McpSession::Impl::tools_list(const json& id, const Era& era) {
  json tools = handler.tool_list();
  if (!tools.is_array()) throw std::logic_error("the tool handler's tool list is not an array");
  json result = {{"tools", std::move(tools)}};
  if (era.modern) {
    result["ttlMs"] = kListTtlMs;
    result["cacheScope"] = "public";
  }
  send(make_result(id, complete(std::move(result), era)));
}

void McpSession::Impl::tools_call(const json& id, const json& params, const Era& era) {
  const auto name = params.find("name");
  if (name == params.end() || !name->is_string()) {
    send(make_error(id, rpc_error::kInvalidParams, "Invalid params: tools/call needs \"name\", a string"));
    return;
  }
  json arguments = json::object();
  if (const auto a = params.find("arguments"); a != params.end() && !a->is_null()) {
    if (!a->is_object()) {
      send(make_error(id, rpc_error::kInvalidParams, "Invalid params: \"arguments\" must be an object"));
      return;
    }
    arguments = *a;
  }
  const std::string& tool = name->get_ref<const std::string&>();
  const json tools = handler.tool_list();
  const json* decl = nullptr;
  if (tools.is_array())
    for (const json& t : tools)
      if (t.is_object() && t.value("name", json()) == tool) decl = &t;
  if (decl == nullptr) {
    log().info("tools/call (id {}): unknown tool {}", id.dump(), tool);
    send(make_error(id, rpc_error::kInvalidParams, "Unknown tool: " + tool));
    return;
  }
  if (const auto schema = decl->find("inputSchema"); schema != decl->end()) {
    // A tool error, not -32602: the model reads it and can correct the call.
    if (std::string wrong = check_arguments(*schema, arguments); !wrong.empty()) {
      log().info("tools/call {} (id {}): invalid arguments: {}", tool, id.dump(), wrong);
      send(make_result(id, complete({{"content", json::array({text_block("Invalid arguments for " + tool + ": " + wrong)})},
                                     {"isError", true}},
                                    era)));
      return;
    }
  }
  // A task-augmented call (2025-11-25): only for a tool whose execution.taskSupport allows it.
  std::string support = "forbidden";
  if (const auto ex = decl->find("execution"); ex != decl->end() && ex->is_object())
    support = ex->value("taskSupport", std::string("forbidden"));
  const auto task_param = params.find("task");
  const bool as_task = task_param != params.end() && task_param->is_object() && tasks_offered(era);
  if (as_task && support == "forbidden") {
    send(make_error(id, rpc_error::kMethodNotFound, "Method not found: tool " + tool + " does not run as a task"));
    return;
  }
  if (!as_task && support == "required" && tasks_offered(era)) {
    send(make_error(id, rpc_error::kMethodNotFound, "Method not found: tool " + tool + " runs only as a task"));
    return;
  }
  // The tasks extension (2026-07-28): the server decides. A call of a tool that may run as a
  // task, from a client that declared the extension on this request, becomes one if it runs
  // long (kTaskAfter) or asks the client something; else it is answered as usual.
  const bool may_become_task = era.modern && support != "forbidden" && declares_tasks(params);
  std::shared_ptr<TaskState> task;
  if (as_task || may_become_task) {
    task = std::make_shared<TaskState>();
    task->modern = may_become_task;
    task->id = new_uuid();
    task->created = std::chrono::steady_clock::now();
    task->created_at = task->updated_at = iso_now();
    if (as_task) {  // the extension's client asks no ttl: the server's is given
      const json ttl = task_param->value("ttl", json());
      if (ttl.is_number() && ttl.get<double>() > 0)
        task->ttl_ms = std::clamp<long long>(static_cast<long long>(ttl.get<double>()), 1000, kMaxTaskTtlMs);
    }
  }
  std::optional<json> token;
  if (const auto meta = params.find("_meta"); meta != params.end() && meta->is_object()) {
    if (const auto t = meta->find("progressToken"); t != meta->end()) {
      if (t->is_string() || t->is_number_integer()) {
        token = *t;
      } else {
        log().debug("tools/call (id {}): progressToken {} is not a string or an integer, ignored", id.dump(),
                    t->dump());
      }
    }
  }

  // A retry of a call that was answered input_required (MRTR, modern era only).
  json input_responses;
  std::string request_state;
  if (era.modern) {
    if (const auto r = params.find("inputResponses"); r != params.end() && !r->is_null()) {
      if (!r->is_object()) {
        send(make_error(id, rpc_error::kInvalidParams, "Invalid params: \"inputResponses\" must be an object"));
        return;
      }
      input_responses = *r;
    }
    if (const auto s = params.find("requestState"); s != params.end() && !s->is_null()) {
      if (!s->is_string()) {
        send(make_error(id, rpc_error::kInvalidParams, "Invalid params: \"requestState\" must be a string"));
        return;
      }
      request_state = s->get<std::string>();
    }
  }

  auto st = std::make_shared<CallState>();
  st->out = out;
  st->task = task;
  st->may_become_task = may_become_task;
  Call& call = st->call;
  call.task = task != nullptr;
  call.client_capabilities = client_caps;
  if (era.modern) {
    const auto meta = params.find("_meta");
    call.client_capabilities = meta->value(std::string(kMetaCapabilities), json::object());
    if (may_become_task)  // it asks through its task (inputRequests, answered by tasks/update)
      call.ask_client = [weak_state = std::weak_ptr<CallState>(st), weak_shared = std::weak_ptr<Shared>(shared)](
                            const std::string& method, const json& ask_params,
                            std::chrono::milliseconds timeout) -> std::optional<json> {
        return ask_in_task(weak_state, weak_shared, method, ask_params, timeout);
      };
  } else if (client_requests) {
    call.ask_client = [weak_state = std::weak_ptr<CallState>(st), weak_shared = std::weak_ptr<Shared>(shared)](
                          const std::string& method, const json& ask_params,
                          std::chrono::milliseconds timeout) -> std::optional<json> {
      return ask_client(weak_state, weak_shared, method, ask_params, timeout);
    };
  }
  call.id = id;
  call.tool = tool;
  call.arguments = std::move(arguments);
  call.progress_token = std::move(token);
  call.protocol_version = era.version;
  call.modern = era.modern;
  call.input_responses = std::move(input_responses);
  call.request_state = std::move(request_state);
  st->progress_interval = opts.progress_interval;
  call.progress = [weak_state = std::weak_ptr<CallState>(st), weak_shared = std::weak_ptr<Shared>(shared)](
                      double progress, std::optional<double> total, const std::string& message) {
    send_progress(weak_state, weak_shared, progress, total, message);
  };

  reap();
  // A task's call is keyed by its task: the request's id is free again once it is answered.
  const std::string key = task && !may_become_task ? "task:" + task->id : id_key(id);
  st->key = key;
  if (task) {
    std::lock_guard lock(shared->tasks_mutex);
    if (shared->task_order.size() >= kMaxTasks) {
      // Make room: the oldest task that has ended goes.
      auto it = std::find_if(shared->task_order.begin(), shared->task_order.end(),
                             [&](const std::string& t) { return shared->tasks.at(t)->terminal(); });
      if (it == shared->task_order.end()) {
        send(make_error(id, rpc_error::kTooManyCalls,
                        "too many tasks (" + std::to_string(kMaxTasks) + ", all running); wait for one to end"));
        return;
      }
      shared->tasks.erase(*it);
      shared->task_order.erase(it);
    }
    task->call = st;
    shared->tasks.emplace(task->id, task);
    shared->task_order.push_back(task->id);
  }
  std::optional<json> refusal;
  {
    std::lock_guard lock(shared->calls_mutex);
    if (shared->in_flight.count(key) != 0) {
      refusal = make_error(id, rpc_error::kInvalidRequest,
                           "Invalid Request: id " + key + " is already used by a call in flight");
    } else if (shared->in_flight.size() >= opts.max_concurrent) {
      refusal = make_error(id, rpc_error::kTooManyCalls,
                           "too many calls in flight (" + std::to_string(opts.max_concurrent) +
                               "); wait for one to finish, or cancel one");
    } else {
      const std::uint64_t seq = next_seq++;
      shared->in_flight.emplace(key, st);
      try {
        // The thread's last step takes calls_mutex, so it cannot report itself finished before
        // it is in `threads`.
        shared->threads.emplace(seq, std::thread(run_call, shared, std::ref(handler), st, seq, era));
      } catch (const std::system_error& e) {
        shared->in_flight.erase(key);
        refusal = make_error(id, rpc_error::kInternalError,
                             std::string("Internal error: cannot start a thread for the call: ") + e.what());
      }
    }
  }
  if (refusal) {
    log().warn("tools/call {} (id {}) refused: {}", tool, id.dump(), (*refusal)["error"]["message"].get<std::string>());
    if (task) {
      std::lock_guard lock(shared->tasks_mutex);
      shared->tasks.erase(task->id);
      shared->task_order.erase(std::find(shared->task_order.begin(), shared->task_order.end(), task->id));
    }
    send(*refusal);
    return;
  }
  if (task && !may_become_task) {
    json created;
    {
      std::lock_guard lock(shared->tasks_mutex);
      created = {{"task", task->to_json()}};
    }
    created["_meta"]["io.modelcontextprotocol/model-immediate-response"] =
        "Started as task " + task->id + "; its result comes with tasks/result.";
    send(make_result(id, std::move(created)));
  }
  log().debug("tools/call {} (id {}) started{}", tool, id.dump(), task ? " as task " + task->id : "");
}

std::shared_ptr<TaskState> McpSession::Impl::find_task(const json& id, const json& params) {
  const auto tid = params.find("taskId");
  if (tid == params.end() || !tid->is_string()) {
    send(make_error(id, rpc_error::kInvalidParams, "Invalid params: \"taskId\" (a string) is required"));
    return nullptr;
  }
  {
    std::lock_guard lock(shared->tasks_mutex);
    if (auto it = shared->tasks.find(tid->get<std::string>()); it != shared->tasks.end()) return it->second;
  }
  send(make_error(id, rpc_error::kInvalidParams,
                  "Invalid params: no task " + tid->get<std::string>() + " (unknown, or its ttl ran out)"));
  return nullptr;
}

void McpSession::Impl::tasks_request(const json& id, const std::string& method, const json& params, const Era&) {
  if (method == "tasks/list") {
    json list = json::array();
    {
      std::lock_guard lock(shared->tasks_mutex);
      for (const auto& t : shared->task_order) list.push_back(shared->tasks.at(t)->to_json());
    }
    send(make_result(id, {{"tasks", std::move(list)}}));  // all of them: at most kMaxTasks
    return;
  }
  if (method != "tasks/get" && method != "tasks/result" && method != "tasks/cancel") {
    send(make_error(id, rpc_error::kMethodNotFound, "Method not found: " + method));
    return;
  }
  auto t = find_task(id, params);
  if (!t) return;
  if (method == "tasks/get") {
    std::lock_guard lock(shared->tasks_mutex);
    send(make_result(id, t->to_json()));
    return;
  }
  if (method == "tasks/result") {
    std::unique_lock lock(shared->tasks_mutex);
    if (t->reply) {
      json msg = task_reply(*t, id);
      lock.unlock();
      send(msg);
    } else {
      t->waiting.emplace_back(id, out);  // answered when the call ends (run_call)
    }
    return;
  }
  // tasks/cancel: interrupts the call (the translator stops its job), the task is cancelled.
  std::shared_ptr<CallState> call;
  json state;
  {
    std::lock_guard lock(shared->tasks_mutex);
    if (t->terminal()) {
      send(make_error(id, rpc_error::kInvalidParams, "Invalid params: task " + t->id + " has ended (" + t->status + ")"));
      return;
    }
    t->status = "cancelled";
    t->message = "The task was cancelled by request; tasks/result has what the call returned.";
    t->updated_at = iso_now();
    call = t->call;
    state = t->to_json();
  }
  cancel_task_call(call, t->id);
  send(make_result(id, std::move(state)));
}

void McpSession::Impl::cancel_task_call(const std::shared_ptr<CallState>& call, const std::string& task) {
  if (call) {
    {
      std::lock_guard lock(call->mutex);
      call->call.cancelled = true;
    }
    try {
      handler.cancelled(call->call);
    } catch (const std::exception& e) {
      log().error("task {}: the tool's cancel hook failed: {}", task, e.what());
    }
  }
  log().info("task {} cancelled by the client", task);
}

void McpSession::Impl::extension_tasks_request(const json& id, const std::string& method, const json& params,
                                               const Era& era) {
  if (method != "tasks/get" && method != "tasks/update" && method != "tasks/cancel") {
    send(make_error(id, rpc_error::kMethodNotFound, "Method not found: " + method));
    return;
  }
  if (!declares_tasks(params)) {
    send(make_error(id, kMissingCapability,
                    "Missing required client capability: " + method + " is the tasks extension's (" +
                        std::string(kTasksExtension) + "), which this request's clientCapabilities do not declare",
                    {{"requiredCapabilities", {{"extensions", {{std::string(kTasksExtension), json::object()}}}}}}));
    return;
  }
  auto t = find_task(id, params);
  if (!t) return;
  if (method == "tasks/get") {
    json state;
    {
      std::lock_guard lock(shared->tasks_mutex);
      state = t->detailed();
    }
    send(make_result(id, complete(std::move(state), era)));
    return;
  }
  if (method == "tasks/update") {
    const auto responses = params.find("inputResponses");
    if (responses == params.end() || !responses->is_object()) {
      send(make_error(id, rpc_error::kInvalidParams, "Invalid params: \"inputResponses\" (an object) is required"));
      return;
    }
    {
      std::lock_guard lock(shared->tasks_mutex);
      // Only answers to what is outstanding; others (unknown, answered already) are ignored.
      for (const auto& [key, value] : responses->items())
        if (t->input_requests.contains(key)) t->answers[key] = value;
      t->answered.notify_all();
    }
    send(make_result(id, complete(json::object(), era)));
    return;
  }
  // tasks/cancel: the call is cancelled (its cell interrupted); the task is cancelled unless it
  // had ended.
  std::shared_ptr<CallState> call;
  {
    std::lock_guard lock(shared->tasks_mutex);
    if (!t->terminal()) {
      t->status = "cancelled";
      t->message = "The task was cancelled by request.";
      t->updated_at = iso_now();
      call = t->call;
      t->answered.notify_all();
    }
  }
  if (call) cancel_task_call(call, t->id);
  send(make_result(id, complete(json::object(), era)));
}

void McpSession::Impl::cancel(const json& params) {
  const auto request_id = params.find("requestId");
  if (request_id == params.end() || !is_valid_id(*request_id)) {
    log().debug("notifications/cancelled without a valid requestId, ignored");
    return;
  }
  std::shared_ptr<CallState> st;
  {
    std::lock_guard lock(shared->calls_mutex);
    if (const auto it = shared->in_flight.find(id_key(*request_id)); it != shared->in_flight.end()) st = it->second;
  }
  if (!st) {
    // Finished already (the reply may be on its way), or not a tools/call: nothing to stop.
    log().debug("notifications/cancelled for {}: not in flight, ignored", request_id->dump());
    return;
  }
  {
    std::lock_guard lock(st->mutex);
    if (st->replied || st->dropped) return;
    st->dropped = true;
    st->call.cancelled = true;
  }
  std::string reason;
  if (const auto r = params.find("reason"); r != params.end() && r->is_string()) reason = r->get<std::string>();
  log().info("tools/call {} (id {}) cancelled by the client{}{}", st->call.tool, request_id->dump(),
             reason.empty() ? "" : ": ", reason);
  try {
    handler.cancelled(st->call);
  } catch (const std::exception& e) {
    log().error("tools/call {} (id {}): the tool's cancel hook failed: {}", st->call.tool, request_id->dump(),
                e.what());
  }
}

void McpSession::Impl::reap() {
  {
    // Ended tasks whose ttl ran out go, with their results.
    std::lock_guard lock(shared->tasks_mutex);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = shared->task_order.begin(); it != shared->task_order.end();) {
      const auto& t = *shared->tasks.at(*it);
      if (t.terminal() && t.waiting.empty() && now - t.created > std::chrono::milliseconds(t.ttl_ms)) {
        shared->tasks.erase(*it);
        it = shared->task_order.erase(it);
      } else {
        ++it;
      }
    }
  }
  std::vector<std::thread> done;
  {
    std::lock_guard lock(shared->calls_mutex);
    for (std::uint64_t seq : shared->finished) {
      if (auto it = shared->threads.find(seq); it != shared->threads.end()) {
        done.push_back(std::move(it->second));
        shared->threads.erase(it);
      }
    }
    shared->finished.clear();
  }
  for (std::thread& t : done) t.join();  // each is at its last line, or past it
}

void McpSession::Impl::at_eof() {
  std::vector<std::shared_ptr<CallState>> running;
  {
    std::lock_guard lock(shared->calls_mutex);
    for (const auto& entry : shared->in_flight) running.push_back(entry.second);
  }
  for (const auto& st : running) {
    std::lock_guard lock(st->mutex);
    st->call.cancelled = true;
  }
  if (!running.empty()) {
    log().info("the session ended with {} call(s) in flight; waiting up to {} ms for them", running.size(),
               opts.eof_grace.count());
    std::unique_lock lock(shared->calls_mutex);
    shared->calls_done.wait_for(lock, opts.eof_grace, [&] { return shared->in_flight.empty(); });
  }
  reap();
  {
    std::lock_guard lock(shared->calls_mutex);
    if (!shared->threads.empty()) {
      log().warn("{} call(s) still running after {} ms; abandoned", shared->threads.size(), opts.eof_grace.count());
      for (auto& entry : shared->threads) entry.second.detach();
      shared->threads.clear();
    }
  }
  shared->closed = true;
  try {
    handler.shutdown();
  } catch (const std::exception& e) {
    log().error("tool handler shutdown failed: {}", e.what());
  }
}

// ---------------------------------------------------------------------------------------
// Arguments against a tool's inputSchema

namespace {

std::string type_of(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

bool has_type(const json& v, const std::string& type) {
  if (type == "number") return v.is_number();
  if (type == "integer") {
    if (v.is_number_integer() || v.is_number_unsigned()) return true;
    return v.is_number_float() && std::isfinite(v.get<double>()) && std::trunc(v.get<double>()) == v.get<double>();
  }
  return type_of(v) == type;
}

std::string article(const std::string& type) {
  return (type == "integer" || type == "array" || type == "object" ? "an " : "a ") + type;
}

// The value as the message shows it: JSON, cut to a few dozen characters.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) {
    std::size_t cut = 37;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    s = s.substr(0, cut) + "...";
  }
  return s;
}

std::string number_text(const json& n) { return n.dump(); }

std::size_t code_points(const std::string& s) {
  return static_cast<std::size_t>(std::count_if(s.begin(), s.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

void check_value(const json& schema, const json& v, const std::string& where, std::vector<std::string>& out);

void check_object(const json& schema, const json& v, const std::string& where, std::vector<std::string>& out) {
  const json empty = json::object();
  const auto props_it = schema.find("properties");
  const json& props = props_it != schema.end() && props_it->is_object() ? *props_it : empty;
  auto name_of = [&](const std::string& key) { return where.empty() ? "'" + key + "'" : "'" + where + "." + key + "'"; };
  if (const auto req = schema.find("required"); req != schema.end() && req->is_array()) {
    for (const json& r : *req) {
      if (!r.is_string() || v.contains(r.get<std::string>())) continue;
      std::string what;
      if (const auto p = props.find(r.get<std::string>()); p != props.end() && p->is_object()) {
        if (const auto t = p->find("type"); t != p->end() && t->is_string()) what = " (" + article(t->get<std::string>()) + ")";
      }
      out.push_back(name_of(r.get<std::string>()) + what + " is required");
    }
  }
  const auto extra = schema.find("additionalProperties");
  for (const auto& [key, value] : v.items()) {
    if (const auto p = props.find(key); p != props.end()) {
      check_value(*p, value, where.empty() ? key : where + "." + key, out);
    } else if (extra != schema.end() && extra->is_boolean() && !extra->get<bool>()) {
      std::string known;
      for (const auto& [name, ignored] : props.items()) known += (known.empty() ? "" : ", ") + name;
      out.push_back("unknown argument " + name_of(key) +
                    (known.empty() ? " (this tool takes no arguments)" : " (the arguments are: " + known + ")"));
    } else if (extra != schema.end() && extra->is_object()) {
      check_value(*extra, value, where.empty() ? key : where + "." + key, out);
    }
  }
}

void check_value(const json& schema, const json& v, const std::string& where, std::vector<std::string>& out) {
  if (!schema.is_object()) return;  // `true` and other trivial schemas accept anything
  const std::string name = where.empty() ? "the arguments" : "'" + where + "'";
  if (const auto t = schema.find("type"); t != schema.end()) {
    std::vector<std::string> types;
    if (t->is_string()) types.push_back(t->get<std::string>());
    if (t->is_array())
      for (const json& e : *t)
        if (e.is_string()) types.push_back(e.get<std::string>());
    if (!types.empty() && std::none_of(types.begin(), types.end(), [&](const std::string& ty) { return has_type(v, ty); })) {
      std::string want;
      for (std::size_t i = 0; i < types.size(); ++i)
        want += (i == 0 ? "" : i + 1 == types.size() ? " or " : ", ") + article(types[i]);
      out.push_back(name + " must be " + want + ", not " + article(type_of(v)) + " (" + shown(v) + ")");
      return;  // the other keywords say nothing useful about a value of the wrong type
    }
  }
  if (const auto e = schema.find("enum"); e != schema.end() && e->is_array() &&
                                          std::find(e->begin(), e->end(), v) == e->end()) {
    std::string list;
    for (const json& option : *e) list += (list.empty() ? "" : ", ") + shown(option);
    out.push_back(name + " must be one of " + list + ", not " + shown(v));
  }
  if (const auto c = schema.find("const"); c != schema.end() && *c != v)
    out.push_back(name + " must be " + shown(*c) + ", not " + shown(v));
  if (v.is_number()) {
    const double x = v.get<double>();
    auto bound = [&](const char* key, const char* words, auto ok) {
      if (const auto b = schema.find(key); b != schema.end() && b->is_number() && !ok(x, b->get<double>()))
        out.push_back(name + " must be " + words + " " + number_text(*b) + ", not " + shown(v));
    };
    bound("minimum", "at least", [](double a, double b) { return a >= b; });
    bound("maximum", "at most", [](double a, double b) { return a <= b; });
    bound("exclusiveMinimum", "greater than", [](double a, double b) { return a > b; });
    bound("exclusiveMaximum", "less than", [](double a, double b) { return a < b; });
  }
  // A count keyword (minLength, maxItems, ...): a non-negative integer, or none.
  auto count = [&](const char* key) -> std::optional<std::size_t> {
    const auto b = schema.find(key);
    if (b == schema.end() || !b->is_number_integer() || b->get<long long>() < 0) return std::nullopt;
    return b->get<std::size_t>();
  };
  if (v.is_string()) {
    const std::size_t n = code_points(v.get_ref<const std::string&>());
    if (auto b = count("minLength"); b && n < *b)
      out.push_back(name + " must be at least " + std::to_string(*b) + " characters long");
    if (auto b = count("maxLength"); b && n > *b)
      out.push_back(name + " must be at most " + std::to_string(*b) + " characters long, not " + std::to_string(n));
  }
  if (v.is_array()) {
    if (auto b = count("minItems"); b && v.size() < *b)
      out.push_back(name + " must have at least " + std::to_string(*b) + " items");
    if (auto b = count("maxItems"); b && v.size() > *b)
      out.push_back(name + " must have at most " + std::to_string(*b) + " items, not " + std::to_string(v.size()));
    if (const auto items = schema.find("items"); items != schema.end())
      for (std::size_t i = 0; i < v.size(); ++i) check_value(*items, v[i], where + "[" + std::to_string(i) + "]", out);
  }
  if (v.is_object()) check_object(schema, v, where, out);
}

}  // namespace

std::string check_arguments(const json& schema, const json& arguments) {
  std::vector<std::string> problems;
  check_value(schema, arguments, "", problems);
  std::string text;
  for (const std::string& p : problems) text += (text.empty() ? "" : " ") + p + ".";
  return text;
}

McpSession::McpSession(ToolHandler& handler, ServerOptions opts)
    : impl_(std::make_unique<Impl>(handler, std::move(opts))) {}

McpSession::~McpSession() = default;

void McpSession::handle(std::string_view text, Sink out) {
  handle(text, std::move(out), impl_->opts.client_requests);
}

void McpSession::handle(std::string_view text, Sink out, bool client_requests) {
  Impl& s = *impl_;
  std::lock_guard lock(s.handling);
  if (s.shared->closed) return;
  s.out = std::move(out);
  s.client_requests = client_requests;
  try {
    s.handle_line(text);
  } catch (const std::exception& e) {  // e.g. out of memory while building a reply
    log().error("a message was dropped: {}", e.what());
  }
  s.out = nullptr;
  s.reap();
}

void McpSession::close() {
  Impl& s = *impl_;
  std::lock_guard lock(s.handling);
  if (s.shared->closed) return;
  s.at_eof();
}

bool McpSession::closed() const { return impl_->shared->closed; }

std::size_t McpSession::in_flight() const {
  std::lock_guard lock(impl_->shared->calls_mutex);
  return impl_->shared->in_flight.size();
}

// ---------------------------------------------------------------------------------------
// stdio

struct StdioServer::Impl {
  Impl(ToolHandler& h, std::istream& i, std::ostream& o, ServerOptions op)
      : in(i), out(o), opts(op), session(h, std::move(op)) {}

  // Writes one message as one line, from any thread. False if it was not written.
  bool write(const json& msg) {
    std::string line;
    try {
      line = msg.dump(-1, ' ', false, json::error_handler_t::replace);
    } catch (const std::exception& e) {
      log().error("cannot serialize a message: {}", e.what());
      return false;
    }
    std::lock_guard lock(write_mutex);
    out.write(line.data(), static_cast<std::streamsize>(line.size()));
    out.put('\n');
    out.flush();
    if (!out) {
      if (!failed) log().warn("stdout: write failed; replies from now on are lost");
      failed = true;
      return false;
    }
    return true;
  }

  std::istream& in;
  std::ostream& out;
  ServerOptions opts;
  std::mutex write_mutex;
  bool failed = false;
  McpSession session;
};

StdioServer::StdioServer(ToolHandler& handler, std::istream& in, std::ostream& out, ServerOptions opts)
    : impl_(std::make_unique<Impl>(handler, in, out, std::move(opts))) {}

StdioServer::~StdioServer() = default;

void StdioServer::stop() { impl_->session.close(); }

int StdioServer::run() {
  Impl& s = *impl_;
  // std::cin is tied to std::cout: each read would flush cout from this thread, unlocked,
  // while a worker thread writes to it under the write mutex.
  s.in.tie(nullptr);
  // Every message goes out as one line; the impl (and so the sink) outlives any call's thread
  // that may still write: a call abandoned at EOF writes nothing once the session is closed.
  Sink line = [&s](const json& msg) { return msg.is_null() || s.write(msg); };
  LineReader reader(s.in, s.opts.max_line_bytes);
  std::string text;
  std::size_t length = 0;
  for (;;) {
    const LineReader::Status status = reader.next(text, length);
    if (status == LineReader::Status::eof) break;
    if (status == LineReader::Status::too_long) {
      log().warn("stdin: a message of {} bytes is over the {} byte limit, skipped", length, s.opts.max_line_bytes);
      s.write(make_error(nullptr, rpc_error::kParseError,
                         "Parse error: a message of " + std::to_string(length) + " bytes exceeds the limit of " +
                             std::to_string(s.opts.max_line_bytes) + " bytes; it was skipped"));
      continue;
    }
    s.session.handle(text, line);
  }
  log().debug("stdin: EOF");
  s.session.close();
  return 0;
}

}  // namespace kgate::mcp
