// kgate-mcp's side of a gateway: HTTP calls (kgate or any Jupyter server), the agent's liveness
// websocket, and a kernel's channels websocket (every output of a cell, in order: records keep
// no display_data).
//
// All three speak TLS (tls.hpp) when the endpoint is https, and go over a Unix socket when it is
// unix:///path.
//
// Threading: HttpClient is thread-safe (each call runs its own I/O on the calling thread, over
// a pooled keep-alive connection).  AgentLink and KernelChannel each own one background thread
// with its own io_context.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kgate/wire.hpp"
#include "render.hpp"

namespace boost::asio::ssl {
class context;
}

namespace kgate::mcp {

// A gateway, resolved from `connect(host=...)` and gateways.toml.  The token is never logged.
struct Endpoint {
  std::string name;     // "" for the default gateway, else the gateways.toml name or the URL
  std::string url;      // as configured
  std::string scheme;   // "http", "https" (TLS, and wss:// for the websockets) or "unix"
  std::string host;     // unix: "localhost" (the Host header)
  std::string port;     // unix: ""
  std::string socket_path;  // unix: the socket file
  std::string base;     // the base path, ends with '/'
  std::string token;
  bool verify = true;   // https: check the certificate and the host name
  std::string ca_file;  // https: trust this PEM bundle instead of the system store ("" = system)
  bool is_default = false;
  std::string display() const { return url; }
  bool is_unix() const { return scheme == "unix"; }
  // The HTTP Host header: host:port, or localhost for a Unix socket.
  std::string host_header() const { return is_unix() ? host : host + ":" + port; }
};

// Parses http://host[:port][/base] (port 80), https://host[:port][/base] (port 443) or
// unix:///absolute/path/to.sock (base "/"); false and `error` set if it is not such a URL.
bool parse_endpoint_url(const std::string& url, Endpoint& ep, std::string& error);

struct HttpResult {
  int status = 0;         // 0: the request did not complete (`error` says why)
  std::string body;
  std::string error;
  json json_body() const;  // the body as JSON (discarded value if it is not)
  // The server's {"message": ...}, else the status line, else the transport error.
  std::string message() const;
};

class HttpClient {
 public:
  explicit HttpClient(Endpoint ep);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  const Endpoint& endpoint() const { return ep_; }
  // `path` is relative to the base ("api/kernels").  `body` null = no body.
  HttpResult request(const std::string& method, const std::string& path, const json* body,
                     std::chrono::milliseconds timeout);
  HttpResult get(const std::string& path, std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    return request("GET", path, nullptr, timeout);
  }
  HttpResult post(const std::string& path, const json& body,
                  std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    return request("POST", path, &body, timeout);
  }

 private:
  struct Conn;
  std::unique_ptr<Conn> take();
  void give_back(std::unique_ptr<Conn> c);

  Endpoint ep_;
  std::shared_ptr<boost::asio::ssl::context> tls_;  // https only
  std::string tls_error_;                           // the context could not be made (ca_file)
  std::mutex mu_;
  std::vector<std::unique_ptr<Conn>> idle_;
};

// The agent's liveness connection to kgate (GET api/kgate/agent): kgate holds the agent's claim
// while it is open.  Reconnects with backoff while started; stop() closes it with code 1000
// ("exited"), which frees the claim at once.
class AgentLink {
 public:
  AgentLink() = default;
  ~AgentLink();
  void start(const Endpoint& ep, const std::string& agent, const std::string& label);
  void stop();
  bool connected() const { return connected_; }

 private:
  void run(Endpoint ep, std::string agent, std::string label);
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> connected_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> close_;  // set while connected: closes from another thread
};

// A kernel's channels websocket, read in the background: keeps the outputs of recent requests
// (by parent msg_id, in the order the kernel sent them, bounded) so that a cell's every output
// can be rendered, and can run a cell directly (a stock Jupyter server without kgate's agent
// path).
class KernelChannel {
 public:
  KernelChannel() = default;
  ~KernelChannel();
  // Connects (blocking up to `timeout`); false and `error` if it could not.
  bool open(const Endpoint& ep, const std::string& kernel, const std::string& session,
            std::chrono::milliseconds timeout, std::string& error);
  void close();
  bool is_open() const { return open_; }
  const std::string& kernel() const { return kernel_; }

  // Sends a message on a channel ("shell"); false if not connected.
  bool send(const std::string& channel, const json& msg);

  // What was seen of one request.  Consecutive stream messages of one name are one output.
  // Bounds: stream text past kMaxStreamBytes is cut from the front of the oldest streams (their
  // `cut` counts it); other outputs past kMaxOutputs or kMaxDataBytes are not kept (`dropped`).
  struct Collected {
    std::vector<CellOutput> outputs;
    bool began = false;       // its status: busy or execute_input was seen: `outputs` has all
    bool idle = false;        // status: idle for the request was seen
    bool replied = false;     // its execute_reply was seen
    json reply;               // the execute_reply content
    std::size_t dropped = 0;  // outputs not kept (over the bounds)
    std::size_t stream_bytes = 0, data_bytes = 0;
  };
  static constexpr std::size_t kMaxStreamBytes = std::size_t(4) << 20;
  static constexpr std::size_t kMaxDataBytes = std::size_t(32) << 20;   // messages of other outputs
  static constexpr std::size_t kMaxOutputs = 1000;
  static constexpr std::size_t kMaxRequests = 64;                       // requests kept
  static constexpr std::size_t kMaxKeptBytes = std::size_t(256) << 20;  // in all requests kept
  // What was seen for `msg_id` so far; waits up to `timeout` until `done(collected)` holds.
  Collected wait_for(const std::string& msg_id, std::chrono::milliseconds timeout,
                     const std::function<bool(const Collected&)>& done,
                     const std::atomic<bool>* cancelled = nullptr);
  // Makes the entry of `msg_id` before it is sent (the outputs of every request with iopub
  // traffic are kept anyway, from its first message on).  Past kMaxRequests or kMaxKeptBytes,
  // the oldest finished request is forgotten first (then the oldest).
  void expect(const std::string& msg_id);
  void forget(const std::string& msg_id);

 private:
  void reader();
  void on_message(const std::string& text);
  void keep(Collected& c, CellOutput o, std::size_t message_bytes);  // mu_ held
  void evict();                                                       // mu_ held

  struct Impl;
  std::shared_ptr<Impl> impl_;
  std::thread thread_;
  std::atomic<bool> open_{false};
  std::string kernel_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Collected> seen_;  // recent requests, bounded
  std::deque<std::string> order_;          // their ids, oldest first
  std::size_t kept_bytes_ = 0;             // stream_bytes + data_bytes of all in seen_
};

}  // namespace kgate::mcp
