// A tools/call's worker thread: runs the tool, sends its reply or keeps it for its task, and
// carries the call's requests to the client (elicitation), its progress and its promotion to a
// task (session.hpp).
#include "session.hpp"

namespace kgate::mcp::session_detail {

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

}  // namespace kgate::mcp::session_detail
