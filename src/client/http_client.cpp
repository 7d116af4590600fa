// The HTTP client of a gateway: a pool of keep-alive connections, each request on the caller's
// thread with its own deadline.
#include "kgate/client/http_client.hpp"

#include "kgate/client/gateways_toml.hpp"

#include "http_exchange.hpp"

namespace kgate::client {

namespace {

constexpr auto kConnectTimeout = std::chrono::seconds(5);
constexpr std::size_t kMaxResponseBytes = 256u << 20;   // a notebook export can be large

}  // namespace

json HttpResult::json_body() const { return json::parse(body, nullptr, false); }

std::string HttpResult::message() const {
  if (status == 0) return error;
  json j = json_body();
  if (j.is_object() && j.contains("message") && j["message"].is_string()) return j["message"].get<std::string>();
  return "HTTP " + std::to_string(status);
}

// ---------------------------------------------------------------------------------------
// HttpClient

struct HttpClient::Conn {
  Conn(const Endpoint& ep, std::shared_ptr<ssl::context> tls) : stream(ep, std::move(tls), ioc) {}
  net::io_context ioc{1};
  tls::Stream stream;  // TCP, TLS over TCP, or a Unix socket
  beast::flat_buffer buffer;
  bool connected = false;
  // The token its requests carry, chosen (send_token) as it was opened: a kept-alive connection
  // goes on to the server that was checked, so the owner's kgate's listener is looked up once
  // per connection, not per request (/proc/net/tcp costs milliseconds on a busy machine).
  std::string token;
};

HttpClient::HttpClient(Endpoint ep) : ep_(std::move(ep)) { tls_ = tls::client_context(ep_, tls_error_); }
HttpClient::~HttpClient() = default;

std::unique_ptr<HttpClient::Conn> HttpClient::take() {
  std::lock_guard lk(mu_);
  if (idle_.empty()) return std::make_unique<Conn>(ep_, tls_);
  auto c = std::move(idle_.back());
  idle_.pop_back();
  return c;
}

void HttpClient::give_back(std::unique_ptr<Conn> c) {
  std::lock_guard lk(mu_);
  if (idle_.size() < 4) idle_.push_back(std::move(c));
}

HttpResult HttpClient::request(const std::string& method, const std::string& path, const json* body,
                               std::chrono::milliseconds timeout,
                               const std::vector<std::pair<std::string, std::string>>& headers) {
  HttpResult out;
  if (!tls_error_.empty()) {
    out.error = tls_error_;
    return out;
  }
  http::request<http::string_body> req{http::string_to_verb(method), ep_.base + path, 11};
  req.set(http::field::host, ep_.host_header());
  req.set(http::field::user_agent, user_agent());
  for (const auto& [name, value] : headers) req.set(name, value);
  if (body) {
    req.set(http::field::content_type, "application/json");
    req.body() = body->dump();
  }
  req.keep_alive(true);
  req.prepare_payload();

  for (int attempt = 0; attempt < 2; ++attempt) {
    auto c = take();
    bool reused = c->connected;
    if (!reused) c->token = send_token(ep_);
    if (!c->token.empty()) req.set(http::field::authorization, "token " + c->token);
    else req.erase(http::field::authorization);
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxResponseBytes);
    c->ioc.restart();
    tcp::resolver resolver(c->ioc);  // outlives run(): destroying it would cancel the resolve
    Exchange x{ep_, req, parser, c->buffer, timeout, kConnectTimeout, c->connected, {}, 0, {}};
    c->stream.visit([&](auto& s) { start_exchange(s, resolver, x); });
    c->ioc.run();
    const beast::error_code& ec = x.ec;
    if (!ec) {
      auto& res = parser.get();
      out.status = static_cast<int>(res.result_int());
      out.body = std::move(res.body());
      out.error.clear();
      if (res.keep_alive()) give_back(std::move(c));
      return out;
    }
    // A kept-alive connection the server had closed fails before any response: retry once on a
    // fresh one (the request was not processed).
    if (reused && x.response_bytes == 0 &&
        (ec == http::error::end_of_stream || ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == net::error::eof || ec == ssl::error::stream_truncated) &&
        attempt == 0)
      continue;
    out.status = 0;
    if (!x.open_error.empty())
      out.error = x.open_error;
    else if (ec == beast::error::timeout)
      out.error = "no answer from " + ep_.url + " within " + std::to_string(timeout.count() / 1000) + " s";
    else if (ec == net::error::connection_refused)
      out.error = "connection refused by " + ep_.url + " (is the gateway running?)";
    else
      out.error = ep_.url + ": " + ec.message();
    return out;
  }
  return out;
}
}  // namespace kgate::client
