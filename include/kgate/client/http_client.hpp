// The HTTP client of a gateway (kgate or any Jupyter server), over TCP, TLS or a Unix socket.
//
// Thread-safe: each call runs its own I/O on the calling thread, over a pooled keep-alive
// connection.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kgate/client/endpoint.hpp"
#include "kgate/jupyter/wire.hpp"

namespace boost::asio::ssl {
class context;
}

namespace kgate::client {

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
  // `path` is relative to the base ("api/kernels").  `body` null = no body.  `headers`: more
  // request headers, as (name, value).
  HttpResult request(const std::string& method, const std::string& path, const json* body,
                     std::chrono::milliseconds timeout,
                     const std::vector<std::pair<std::string, std::string>>& headers = {});
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

}  // namespace kgate::client
