// McpHttp (mcp_http.hpp): MCP's Streamable HTTP transport at {base}mcp, over kgate_mcp's sessions.
#include "api/mcp_http.hpp"

#include <atomic>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "kgate/jupyter/connection.hpp"
#include "kgate/mcp/jsonrpc.hpp"
#include "kgate/mcp/tools.hpp"
#include "kgate/jupyter/utf8.hpp"
#include "kgate/version.hpp"
#include "kgate/jupyter/wire.hpp"
#include "handlers.hpp"
#include "services.hpp"

namespace kgate::gw {

namespace {

constexpr int kSessionNotFound = -32001;  // what the MCP SDKs' servers send for an unknown session
constexpr int kServerError = -32000;
constexpr std::string_view kVersions[] = {"2025-11-25", "2025-06-18", "2025-03-26", "2026-07-28"};

json rpc_error(const json& id, int code, const std::string& message) {
  return {{"jsonrpc", "2.0"}, {"error", {{"code", code}, {"message", message}}}, {"id", id}};
}

Response json_rpc_response(unsigned version, bool keep_alive, http::status st, const json* body) {
  Response res{st, version};
  res.set(http::field::server, kgate::server_header());
  res.keep_alive(keep_alive);
  if (body) {
    res.set(http::field::content_type, "application/json");
    res.body() = body->dump(-1, ' ', false, json::error_handler_t::replace);
  }
  res.prepare_payload();
  return res;
}

// The Translator's way back to this kgate: as any client, with kgate's token, over the Unix
// socket when there is one (and base_url is "/"), else over TCP on loopback (or the bound
// address). Over TLS the certificate is not checked: the connection is to this process's own
// listener on this machine, and its name (if any) need not be 127.0.0.1.
mcp::Config self_config(const Services& server) {
  const auto& o = server.options();
  mcp::Config cfg;
  cfg.dir = kgate_config_dir();
  cfg.default_token = o.token;
  if (!o.tcp || (server.unix_socket().string().size() && o.base_url == "/")) {
    cfg.default_url = "unix://" + server.unix_socket().string();
  } else {
    std::string host = o.ip;
    if (host.empty() || host == "0.0.0.0" || host == "localhost") host = "127.0.0.1";
    if (host == "::") host = "::1";
    if (host.find(':') != std::string::npos) host = "[" + host + "]";
    cfg.default_url = std::string(server.tls() ? "https" : "http") + "://" + host + ":" +
                      std::to_string(server.endpoint().port()) + o.base_url;
    cfg.default_verify = !server.tls();
  }
  return cfg;
}

// What Pending::gone does: the call of request `id` is cancelled as if the client had sent
// notifications/cancelled (the Translator interrupts its cell; no reply is sent).
std::function<void()> cancel_when_gone(const std::shared_ptr<mcp::McpSession>& session, const json& id) {
  return [weak = std::weak_ptr<mcp::McpSession>(session), id] {
    auto s = weak.lock();
    if (!s) return;
    spdlog::info("mcp: the client of call {} went away before its reply: the call is cancelled", id.dump());
    json note = {{"jsonrpc", "2.0"},
                 {"method", "notifications/cancelled"},
                 {"params", {{"requestId", id}, {"reason", "the client closed the connection"}}}};
    s->handle(note.dump(), [](const json&) { return true; });
  };
}

// After McpSession::close: a call that outlived the close grace still runs on its thread and uses
// the translator, which is then never freed, as kgate-mcp never frees its own (it leaves with _Exit).
void keep_if_in_use(const mcp::McpSession& session, std::shared_ptr<mcp::Translator> translator) {
  if (session.in_flight() == 0) return;
  static std::mutex mu;
  static std::vector<std::shared_ptr<mcp::Translator>> kept;
  std::lock_guard lk(mu);
  kept.push_back(std::move(translator));
}

bool accepts_json(std::string_view accept) {
  if (accept.empty()) return true;
  for (std::string_view t : {"application/json", "application/*", "*/*"})
    if (accept.find(t) != std::string_view::npos) return true;
  return false;
}

bool accepts_event_stream(std::string_view accept) { return accept.find("text/event-stream") != std::string_view::npos; }

}  // namespace

// One POST waiting for its answer: exactly one, from whichever thread has it first (the
// request's reply, a cancelled call's end, the session's end), always written on the Asio thread.
//
// A tools/call whose POST accepts text/event-stream may be answered with an event stream: the
// stream opens with the first message that is not the reply (a progress notification, or a
// request to the client such as elicitation/create), carries each as one SSE event, and ends
// with the reply. A call that sends nothing else is answered with plain JSON, as every other
// request is: no stream unless something needs one.
struct McpHttp::Pending : std::enable_shared_from_this<McpHttp::Pending> {
  net::io_context& ioc;
  Respond respond;
  RespondInParts respond_in_parts;  // null: JSON answers only
  unsigned version;
  bool keep_alive;
  json id;                     // the request's id (null: a notification or a response)
  std::string session_header;  // initialize: the new session's id, sent back in Mcp-Session-Id
  // Runs (on the Asio thread) if the client goes away while its event stream is open: the call is
  // cancelled then (its cell interrupted), since nobody will read its reply.
  std::function<void()> gone;

  Pending(net::io_context& i, Respond r, unsigned v, bool k, json request_id)
      : ioc(i), respond(std::move(r)), version(v), keep_alive(k), id(std::move(request_id)) {}

  // The answer: a JSON body (or none) with `st`, or, on a stream, the body as its last event.
  void answer(http::status st, std::optional<json> body = std::nullopt) {
    std::lock_guard lk(mu);
    if (answered) return;
    answered = true;
    if (streaming) {
      net::post(ioc, [self = shared_from_this(), body = std::move(body)] {
        if (!self->writer) return;
        if (body) self->writer->send(sse_event(*body));
        self->writer->end();
        self->writer.reset();
      });
      return;
    }
    net::post(ioc, [respond = respond, version = version, keep_alive = keep_alive, st, body = std::move(body),
                    sid = session_header] {
      Response res = json_rpc_response(version, keep_alive, st, body ? &*body : nullptr);
      if (!sid.empty()) res.set("Mcp-Session-Id", sid);
      respond(std::move(res));
    });
  }

  // The client closed the connection before the reply (Asio thread).
  void client_gone() {
    std::function<void()> fn;
    {
      std::lock_guard lk(mu);
      if (answered) return;
      answered = true;
      fn = std::move(gone);
    }
    writer.reset();
    if (fn) fn();
  }

  // A message before the answer (a notification, a request to the client): sent on the event
  // stream, which it opens if need be. False when there is no stream to send it on.
  bool event(const json& m) {
    std::lock_guard lk(mu);
    if (answered || !respond_in_parts) return false;
    if (!streaming) {
      streaming = true;
      net::post(ioc, [self = shared_from_this()] {
        Response head{http::status::ok, self->version};
        head.set(http::field::server, kgate::server_header());
        head.set(http::field::content_type, "text/event-stream");
        head.set(http::field::cache_control, "no-cache");
        head.keep_alive(self->keep_alive);
        if (!self->session_header.empty()) head.set("Mcp-Session-Id", self->session_header);
        self->writer = self->respond_in_parts(std::move(head));
        if (self->writer)
          self->writer->on_gone([weak = std::weak_ptr<Pending>(self)] {
            if (auto s = weak.lock()) s->client_gone();
          });
      });
    }
    net::post(ioc, [self = shared_from_this(), text = sse_event(m)]() mutable {
      if (self->writer) self->writer->send(std::move(text));
    });
    return true;
  }


 private:
  static std::string sse_event(const json& m) {
    return "event: message\ndata: " + m.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  }

  std::mutex mu;  // orders answer() and event(): what they post runs in that order
  bool answered = false;
  bool streaming = false;
  std::shared_ptr<PartsWriter> writer;  // on the Asio thread only
};

McpHttp::McpHttp(Services& server) : server_(server), reaper_(server.ioc()) { reap(); }

McpHttp::~McpHttp() = default;

void McpHttp::post(Call& c) {
  const Request& req = c.req;
  const unsigned version = req.version();
  const bool keep_alive = req.keep_alive();
  auto refuse = [&](http::status st, int code, const std::string& message) {
    json body = rpc_error(nullptr, code, message);
    c.respond(json_rpc_response(version, keep_alive, st, &body));
  };
  std::string_view type = req[http::field::content_type];
  if (type.substr(0, 16) != "application/json")
    return refuse(http::status::unsupported_media_type, kServerError,
                  "Unsupported Media Type: a POST to /mcp carries one JSON-RPC message as application/json");
  if (!accepts_json(req[http::field::accept]))
    return refuse(http::status::not_acceptable, kServerError,
                  "Not Acceptable: kgate answers with application/json; the Accept header must allow it");
  if (std::string_view pv = req["MCP-Protocol-Version"]; !pv.empty()) {
    bool known = false;
    for (auto v : kVersions) known = known || v == pv;
    if (!known)
      return refuse(http::status::bad_request, kServerError,
                    "Bad Request: MCP-Protocol-Version " + std::string(pv) +
                        " is not supported (2026-07-28, 2025-11-25, 2025-06-18, 2025-03-26)");
  }
  json msg = json_depth_within(req.body()) ? json::parse(req.body(), nullptr, false) : json();
  if (msg.is_discarded() || msg.is_null())
    return refuse(http::status::bad_request, -32700, "Parse error: the body is not one JSON-RPC message");
  if (msg.is_array())
    return refuse(http::status::bad_request, -32600, "Invalid Request: batches are not supported");
  const bool request = msg.is_object() && msg.contains("method") && msg.contains("id") &&
                       (msg["id"].is_string() || msg["id"].is_number());
  const bool initialize = request && msg["method"] == "initialize";
  const std::string sid(req["Mcp-Session-Id"]);

  std::string id = sid;
  if (initialize) {
    if (!sid.empty())
      return refuse(http::status::bad_request, kServerError,
                    "Bad Request: initialize opens a new session; send it without Mcp-Session-Id");
    if (sessions_.size() >= kMaxSessions)
      return refuse(http::status::service_unavailable, kServerError,
                    "kgate serves " + std::to_string(kMaxSessions) +
                        " MCP sessions, its limit: end one (DELETE /mcp) or wait for an idle one to end");
    id = new_hex_id();
    mcp::Hosting hosting{"kgate /mcp session " + id.substr(0, 8), false, true};
    Entry e;
    e.translator = std::make_shared<mcp::Translator>(self_config(server_), std::move(hosting));
    mcp::ServerOptions opts;
    opts.client_requests = false;  // answers are JSON, not an event stream: nothing can carry a request
    e.session = std::make_shared<mcp::McpSession>(*e.translator, opts);
    sessions_.emplace(id, std::move(e));
    spdlog::info("mcp: session {} opened", id.substr(0, 8));
  } else if (sid.empty()) {
    // The stateless era (2026-07-28): a request that names its version in _meta needs no session.
    const bool modern = msg.is_object() && msg["params"].is_object() && msg["params"]["_meta"].is_object() &&
                        msg["params"]["_meta"].value("io.modelcontextprotocol/protocolVersion", "") == "2026-07-28";
    if (modern || (!request && req["MCP-Protocol-Version"] == "2026-07-28")) return stateless(c, msg, request);
    return refuse(http::status::bad_request, kServerError,
                  "Bad Request: no Mcp-Session-Id; a session starts with initialize (or send 2026-07-28 requests, "
                  "with the version in params._meta, which need none)");
  }
  auto it = sessions_.find(id);
  if (it == sessions_.end())
    return refuse(http::status::not_found, kSessionNotFound,
                  "Session not found: it ended (deleted, idle, or kgate restarted); initialize a new one");
  Entry& e = it->second;
  e.last_used = std::chrono::steady_clock::now();

  auto p = std::make_shared<Pending>(server_.ioc(), std::move(c.respond), version, keep_alive,
                                     request ? msg["id"] : json());
  if (initialize) p->session_header = id;
  // A tools/call may be answered with an event stream (Pending), which can carry its progress
  // and its questions to the client (input() through elicitation). Not a task's: its POST is
  // answered at once, and nothing would carry what the task asks later.
  const bool tool_call = request && msg["method"] == "tools/call";
  const bool as_task = tool_call && msg["params"].is_object() && msg["params"].contains("task");
  const bool streamable = tool_call && !as_task && c.respond_in_parts && accepts_event_stream(req[http::field::accept]);
  if (streamable) {
    p->respond_in_parts = std::move(c.respond_in_parts);
    p->gone = cancel_when_gone(e.session, p->id);
  }
  mcp::Sink sink;
  if (request) {
    e.pending.erase(std::remove_if(e.pending.begin(), e.pending.end(), [](auto& w) { return w.expired(); }),
                    e.pending.end());
    e.pending.push_back(p);
    // Its reply is the answer; anything before it goes on the event stream, if there can be one.
    sink = [p](const json& m) {
      if (m.is_null()) {
        p->answer(http::status::accepted);  // cancelled: no reply will come
      } else if (m.is_object() && m.value("id", json()) == p->id && (m.contains("result") || m.contains("error"))) {
        p->answer(http::status::ok, m);
      } else {
        return p->event(m);
      }
      return true;
    };
  } else {
    // A notification or a response: 202, unless it was malformed (then the error, with 400).
    sink = [p](const json& m) {
      if (m.is_object() && m.contains("error")) p->answer(http::status::bad_request, m);
      return true;
    };
  }
  e.session->handle(req.body(), sink, streamable);
  if (!request) p->answer(http::status::accepted);
  else if (e.session->closed()) p->answer(http::status::not_found, rpc_error(p->id, kSessionNotFound, "Session not found"));
}

void McpHttp::stateless(Call& c, const json& msg, bool request) {
  const unsigned version = c.req.version();
  const bool keep_alive = c.req.keep_alive();
  auto p = std::make_shared<Pending>(server_.ioc(), std::move(c.respond), version, keep_alive,
                                     request ? msg["id"] : json());
  if (!request) return p->answer(http::status::accepted);  // a notification: nothing to keep
  // A tools/call whose POST accepts an event stream gets its progress on it, as in a session: so
  // no client's timeout cuts a long cell (Claude Code's HTTP transport gives up after 60 s of
  // silence).
  const bool streamable = msg["method"] == "tools/call" && c.respond_in_parts &&
                          accepts_event_stream(c.req[http::field::accept]);
  if (streamable) p->respond_in_parts = std::move(c.respond_in_parts);
  // tasks/* naming a task that a stateless call became: that call's session answers.
  const std::string method = msg.value("method", "");
  if (method.rfind("tasks/", 0) == 0 && msg["params"].is_object() && msg["params"]["taskId"].is_string()) {
    if (auto it = task_sessions_.find(msg["params"]["taskId"].get<std::string>()); it != task_sessions_.end()) {
      it->second.last_used = std::chrono::steady_clock::now();
      it->second.session->handle(c.req.body(), [p](const json& m) {
        if (m.is_object() && m.value("id", json()) == p->id && (m.contains("result") || m.contains("error")))
          p->answer(http::status::ok, m);
        return true;
      });
      return;
    }
  }
  // A translator and a session for this request alone, ended once it is answered: the client
  // names every kernel it acts on (mcp::Hosting::stateless). A tools/call that becomes a task
  // keeps them (task_sessions_).
  mcp::Hosting hosting{"kgate /mcp, stateless", false, true, true};
  auto translator = std::make_shared<mcp::Translator>(self_config(server_), std::move(hosting));
  mcp::ServerOptions opts;
  opts.client_requests = false;
  auto session = std::make_shared<mcp::McpSession>(*translator, opts);
  if (streamable) p->gone = cancel_when_gone(session, p->id);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  auto end = [translator, session, finished] {
    if (finished->exchange(true)) return;
    std::thread([translator, session] {
      session->close();
      keep_if_in_use(*session, translator);
    }).detach();
  };
  // (The sink may run on a call's thread after kgate stopped: it touches this McpHttp only in
  // what it posts to the Asio thread, which runs no more by then.)
  mcp::Sink sink = [this, &ioc = server_.ioc(), p, end, translator, session, finished](const json& m) {
    if (m.is_null()) {
      p->answer(http::status::accepted);
      end();
    } else if (m.is_object() && m.value("id", json()) == p->id && m.contains("result") && m["result"].is_object() &&
               m["result"].value("resultType", "") == "task" && m["result"]["taskId"].is_string()) {
      // The call became a task: its session stays, found by the task's id (posted before the
      // answer, so a tasks/get that follows finds it).
      finished->store(true);
      const std::string task = m["result"]["taskId"].get<std::string>();
      net::post(ioc, [this, task, translator, session] {
        Entry e;
        e.translator = translator;
        e.session = session;
        e.last_used = std::chrono::steady_clock::now();
        task_sessions_.emplace(task, std::move(e));
        spdlog::info("mcp: a stateless call became task {}", task);
      });
      p->answer(http::status::ok, m);
    } else if (m.is_object() && m.value("id", json()) == p->id && (m.contains("result") || m.contains("error"))) {
      p->answer(http::status::ok, m);
      end();
    } else {
      return p->event(m);  // progress, on the event stream (dropped when there is none)
    }
    return true;
  };
  session->handle(c.req.body(), sink);
}

void McpHttp::del(Call& c) {
  const std::string sid(c.req["Mcp-Session-Id"]);
  if (sid.empty())
    return c.respond(json_error(c.req, http::status::bad_request, "DELETE /mcp needs the session's Mcp-Session-Id"));
  if (!sessions_.count(sid))
    return c.respond(json_error(c.req, http::status::not_found, "Session not found"));
  end(sid, "the client deleted it");
  Response res{http::status::ok, c.req.version()};
  res.set(http::field::server, kgate::server_header());
  res.keep_alive(c.req.keep_alive());
  res.prepare_payload();
  c.respond(std::move(res));
}

void McpHttp::end(const std::string& id, const std::string& why) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Entry e = std::move(it->second);
  sessions_.erase(it);
  spdlog::info("mcp: session {} ended: {}", id.substr(0, 8), why);
  // Closing waits for the calls in flight (up to the grace) and stops the auto kernel through
  // this kgate's own API: never on the Asio thread.
  std::thread([e = std::move(e), why]() mutable {
    e.session->close();
    for (auto& w : e.pending)
      if (auto p = w.lock()) {
        json body = rpc_error(p->id, kServerError, "the MCP session ended (" + why + ") before this request's reply");
        p->answer(http::status::not_found, body);
      }
    keep_if_in_use(*e.session, e.translator);
  }).detach();
}

void McpHttp::end_task_session(const std::string& task, const std::string& why) {
  auto it = task_sessions_.find(task);
  if (it == task_sessions_.end()) return;
  Entry e = std::move(it->second);
  task_sessions_.erase(it);
  spdlog::info("mcp: the session of task {} ended: {}", task, why);
  std::thread([e = std::move(e)]() mutable {
    e.session->close();
    keep_if_in_use(*e.session, e.translator);
  }).detach();
}

void McpHttp::close_all() {
  reaper_.cancel();
  std::vector<std::string> ids;
  for (const auto& [id, e] : sessions_) ids.push_back(id);
  for (const auto& id : ids) end(id, "kgate is stopping");
  ids.clear();
  for (const auto& [id, e] : task_sessions_) ids.push_back(id);
  for (const auto& id : ids) end_task_session(id, "kgate is stopping");
}

void McpHttp::reap() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> idle;
  for (const auto& [id, e] : sessions_) {
    bool waiting = std::any_of(e.pending.begin(), e.pending.end(), [](auto& w) { return !w.expired(); });
    if (!waiting && e.session->in_flight() == 0 && now - e.last_used > kIdleTimeout) idle.push_back(id);
  }
  for (const auto& id : idle) end(id, "idle for " + std::to_string(kIdleTimeout.count()) + " min");
  idle.clear();
  for (const auto& [id, e] : task_sessions_)
    if (e.session->in_flight() == 0 && now - e.last_used > kIdleTimeout) idle.push_back(id);
  for (const auto& id : idle) end_task_session(id, "idle for " + std::to_string(kIdleTimeout.count()) + " min");
  reaper_.expires_after(std::chrono::seconds(30));
  reaper_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) reap();
  });
}

// ---- The routes (routes.cpp) ----

void mcp_post(Call& c) { c.services.mcp().post(c); }
void mcp_delete(Call& c) { c.services.mcp().del(c); }

}  // namespace kgate::gw
