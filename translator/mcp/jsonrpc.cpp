// MCP (see jsonrpc.hpp): the session engine, dispatch for both protocol eras.  Its parts:
// session.hpp (the state of calls and tasks), calls.cpp (a call's worker thread), arguments.cpp
// (the inputSchema check), stdio.cpp (the stdio transport's line framing).
#include "session.hpp"

namespace kgate::mcp {

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
    try {
      handler.ending();
    } catch (const std::exception& e) {
      log().error("tool handler ending failed: {}", e.what());
    }
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

}  // namespace kgate::mcp
