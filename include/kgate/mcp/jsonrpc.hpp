// MCP: JSON-RPC 2.0 for both protocol eras, tools handed to a ToolHandler.
//
// McpSession is one conversation, whatever carries its messages: it answers the protocol itself
// (initialize, ping, server/discover, tools/list, errors) and passes each tools/call to the
// ToolHandler on a thread of its own. StdioServer carries one over stdio (kgate-mcp): one
// message per line from `in`, one per line to `out`. kgate's /mcp carries them over HTTP
// (gateway/api/mcp_http.cpp).
//
// Protocol eras (MCP):
// - legacy (2025-03-26, 2025-06-18, 2025-11-25): `initialize` picks the version. Requests that
//   arrive before it are answered anyway; see the comment on requests before initialize in jsonrpc.cpp.
// - modern (2026-07-28): no handshake. A request is modern when its params._meta carries
//   "io.modelcontextprotocol/protocolVersion". Its result then also carries resultType:"complete"
//   and _meta serverInfo (tools/list and server/discover also ttlMs and cacheScope).
//
// Error codes: the JSON-RPC ones (-32700, -32600, -32601, -32602, -32603), MCP's -32022
// (UnsupportedProtocolVersion), and kgate's own kTooManyCalls (-32010); see rpc_error below.
//
// Threads:
// - McpSession::handle() runs on its caller's thread (StdioServer::run(), the reader thread; or
//   kgate's Asio thread), one message at a time. It sends every reply to a request other than
//   tools/call, and it calls ToolHandler::tool_list() and ToolHandler::cancelled().
// - Each tools/call runs ToolHandler::call() on its own std::thread. Its reply is written from
//   that thread, and so is its progress.
// - Writes to `out` are serialized under one mutex. Each message is one line, and `out` is
//   flushed after each line. Nothing else may use `out` while run() runs. run() unties `in`
//   (std::cin is tied to std::cout, which would flush it from the reader thread). A stream tied
//   to `out` flushes it without the mutex: std::cerr is tied to std::cout, so don't write to
//   std::cerr while serving (spdlog's stderr sinks don't use it).
//
// The process must ignore SIGPIPE. If it doesn't, a reply written after the client has closed
// stdout kills it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kgate/jupyter/wire.hpp"

namespace kgate::mcp {

using kgate::json;

// The error codes StdioServer sends.
namespace rpc_error {
inline constexpr int kParseError = -32700;      // not JSON, too long, or nested too deep; the id is null
inline constexpr int kInvalidRequest = -32600;  // not a JSON-RPC 2.0 request, a bad id, a batch, or an id already in flight
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;   // bad params, an unknown tool, InvalidParams, missing modern _meta
inline constexpr int kInternalError = -32603;   // an exception escaped the server's own code
// From the -32000..-32099 range that JSON-RPC leaves to servers. The numbers that were passed over:
// -32000 and -32001 (the MCP SDKs' ConnectionClosed and RequestTimeout), -32002 (MCP's resource
// not found), and -32020..-32099 (reserved by MCP 2026-07-28).
inline constexpr int kTooManyCalls = -32010;    // max_concurrent tools/call already in flight
inline constexpr int kUnsupportedProtocolVersion = -32022;  // MCP 2026-07-28; data {supported, requested}
}  // namespace rpc_error

// The versions StdioServer speaks, newest first.
inline constexpr std::string_view kModernVersion = "2026-07-28";
inline constexpr std::string_view kLatestLegacyVersion = "2025-11-25";

// A tool's arguments were wrong in a way its inputSchema cannot say. StdioServer turns it into a
// tool error (isError true) with this message, as it does for arguments that break the schema.
struct InvalidParams : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One tools/call in flight. StdioServer owns it until ToolHandler::call returns.
struct Call {
  json id;                               // the request id
  std::string tool;
  json arguments = json::object();
  std::optional<json> progress_token;    // params._meta.progressToken (a string or an integer)
  // Set when notifications/cancelled names this id, and at stdin EOF. Read it while waiting.
  std::atomic<bool> cancelled{false};
  // A task-augmented call (MCP tasks, 2025-11-25): its reply is kept for tasks/result instead of
  // awaited, so the tool may take the time the work needs; tasks/cancel sets `cancelled`.
  bool task = false;
  // What the client declared it can do (initialize's capabilities, or a modern request's
  // _meta clientCapabilities): "elicitation", "roots", ...
  json client_capabilities = json::object();
  // Asks the client (a JSON-RPC request from the server, e.g. elicitation/create) and waits up
  // to `timeout` for its answer: the response message (with "result" or "error"), or nullopt
  // (no answer in time, the call cancelled, the session closed). Null when the transport cannot
  // carry requests to the client (a /mcp POST answered in JSON, or a task's, whose POST is
  // answered at once), or in the modern era, which has no server-to-client requests.
  std::function<std::optional<json>(const std::string& method, const json& params, std::chrono::milliseconds timeout)>
      ask_client;
  std::string protocol_version;          // negotiated (legacy: initialize, or 2025-11-25 before it) or from _meta (modern)
  bool modern = false;
  // The modern era's multi round-trip requests (MRTR): a retry carries the client's answers
  // (params.inputResponses, an object; null when none) and the requestState it was given ("" when none).
  json input_responses;
  std::string request_state;
  // Sends notifications/progress {progressToken, progress, total?, message?} if the request had a
  // progressToken, and does nothing otherwise. Thread-safe. A value that isn't finite, or doesn't
  // exceed the last one sent, is dropped. Nothing is sent once the call has its reply or has been
  // cancelled, even if the function is called later from another thread.
  std::function<void(double progress, std::optional<double> total, const std::string& message)> progress;
};

// What a tool returns: MCP content blocks, and whether they describe a failure.
struct ToolReply {
  json content = json::array();
  bool is_error = false;
  // MRTR (modern era): the call needs the client's input first. When set, the result is an
  // InputRequiredResult with these inputRequests and `request_state`, and `content` is unused.
  std::optional<json> input_requests;
  std::string request_state;
};

// Checks a tool's arguments against its inputSchema, the schema tools/list publishes, so what a
// tool declares and what it accepts cannot differ. The JSON Schema keywords it knows: type (a name
// or a list of names), properties, required, additionalProperties (false or a schema), enum,
// const, minimum, maximum, exclusiveMinimum, exclusiveMaximum, minLength and maxLength (in code
// points), items, minItems and maxItems; others (description, default, ...) are ignored. Returns
// "" when the arguments fit, else one sentence per problem, each naming the argument and what
// was expected. StdioServer answers a call that does not fit with a tool error (isError true)
// and does not run it.
std::string check_arguments(const json& schema, const json& arguments);

// The tools. Implemented by the translator's tool layer and by test fakes.
class ToolHandler {
 public:
  virtual ~ToolHandler() = default;
  // The "tools" array of tools/list, always in the same order. StdioServer calls it on the reader
  // thread, for each tools/list and each tools/call, which is how it checks the tool name.
  virtual json tool_list() const = 0;
  // The server's "instructions" (initialize and server/discover) when ServerOptions has none;
  // "" leaves them out.
  virtual std::string instructions() const { return {}; }
  // Runs one call on its own worker thread and may block for minutes; calls can run concurrently.
  // Arguments that break the tool's inputSchema never reach it (see check_arguments). Throw
  // InvalidParams for other bad arguments. It, and any other exception, becomes a tool result
  // with isError true and the exception's message as text, not a JSON-RPC error.
  virtual ToolReply call(Call& call) = 0;
  // notifications/cancelled arrived for `call` (call.cancelled is already set). The server then
  // sends no reply for it. Runs on the reader thread and must not block. It can race with call()
  // returning, but `call` stays valid until both are done. At stdin EOF the server sets
  // call.cancelled and calls ending() instead, once for all of them.
  virtual void cancelled(Call& /*call*/) {}
  // The conversation ends (stdin EOF, a signal, a hosted session closed) with calls in flight,
  // already `cancelled`: stop at once what they started, so they end within eof_grace. Runs on
  // the thread that ends the session, before the grace; may block briefly.
  virtual void ending() {}
  // The client named itself: initialize's clientInfo, or a modern request's _meta clientInfo.
  // Runs on the reader thread, before the calls that follow it; must not block.
  virtual void client_info(const std::string& /*name*/, const std::string& /*version*/) {}
  // Stdin reached EOF and the in-flight calls ended (or eof_grace ran out). Runs on the reader
  // thread, just before run() returns.
  virtual void shutdown() {}
};

struct ServerOptions {
  // A longer line gets -32700 ("... exceeds the limit ..."). It is skipped and the server goes on.
  std::size_t max_line_bytes = 64u << 20;
  // How many tools/call may be in flight at once. One more gets rpc_error::kTooManyCalls.
  std::size_t max_concurrent = 16;
  // At stdin EOF, the server sets `cancelled` on every call in flight, calls ending() and waits
  // up to this long for them to end. Replies that come in this time are still written, since a
  // client may close stdin and go on reading stdout. Then it calls shutdown() and run() returns.
  // Short, because Claude Code sends SIGKILL 500 ms after its SIGINT (SIGTERM at 100 ms), and
  // the grace and shutdown() must both fit in that. A call still
  // running after that is abandoned: its thread is detached, nothing more from it is written,
  // and it may still be inside ToolHandler::call. The process should exit without destroying
  // the handler, e.g. with std::_Exit after flushing.
  std::chrono::milliseconds eof_grace{250};
  // At most one notifications/progress per call this often (the first always goes out): a
  // tool's loop may report far more often than a client wants to hear.
  std::chrono::milliseconds progress_interval{1000};
  // The "instructions" of the initialize and server/discover results; left out when empty.
  std::string instructions;
  // Whether the transport carries requests to the client (Call::ask_client): stdio does; an
  // HTTP transport that answers each POST with JSON does not. McpSession::handle may say it
  // per message instead.
  bool client_requests = true;
};

// Where a session's messages go: one JSON-RPC message each. Returns false when it could not be
// sent. Called from the thread that handles a message and from tool calls' threads, never two
// at once for one call. A null message is no message: a tools/call was cancelled and ended, so
// its reply will never come (an HTTP transport still owes its POST an answer).
using Sink = std::function<bool(const json& msg)>;

// One MCP conversation, whatever carries it: stdio (StdioServer) or kgate's /mcp over HTTP. It
// answers the protocol itself (initialize, ping, server/discover, tools/list, errors) and runs
// each tools/call on a thread of its own through the ToolHandler.
class McpSession {
 public:
  explicit McpSession(ToolHandler& handler, ServerOptions opts = {});
  ~McpSession();
  McpSession(const McpSession&) = delete;
  McpSession& operator=(const McpSession&) = delete;

  // Handles one message, the text of one JSON-RPC message (no batches). What it causes goes to
  // `out`: replies to requests other than tools/call before handle() returns; a tools/call's
  // progress and reply later, from the call's thread (`out` is kept until then). Messages are
  // handled one at a time; any thread may call it.
  void handle(std::string_view text, Sink out);
  // The same, for a transport that can carry requests to the client for some messages only
  // (kgate's /mcp: a POST answered with an event stream can, one answered with JSON cannot):
  // `client_requests` says it for this message, in place of ServerOptions::client_requests.
  void handle(std::string_view text, Sink out, bool client_requests);
  // The conversation is over (stdin EOF, an HTTP session deleted or idle too long): sets
  // `cancelled` on the calls in flight, waits up to eof_grace for them (their replies still go
  // out), then sends nothing more and calls ToolHandler::shutdown(). Idempotent.
  void close();
  bool closed() const;
  std::size_t in_flight() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Serves one client over stdin and stdout until EOF on `in`. The constructor does no I/O.
class StdioServer {
 public:
  StdioServer(ToolHandler& handler, std::istream& in, std::ostream& out, ServerOptions opts = {});
  ~StdioServer();
  StdioServer(const StdioServer&) = delete;
  StdioServer& operator=(const StdioServer&) = delete;

  // Reads until EOF and returns the exit code (0). Call it once.
  int run();
  // The same end as EOF, from any thread (a signal: Claude Code ends its servers with SIGINT,
  // then SIGTERM): McpSession::close(). run() may still be blocked on stdin; the caller exits.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kgate::mcp
