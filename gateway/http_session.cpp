// One HTTP connection: reads requests one at a time, checks them, dispatches them.
#include "http_session.hpp"

#include <spdlog/spdlog.h>

#include "api.hpp"
#include "agent_session.hpp"
#include "server.hpp"
#include "ws_session.hpp"

namespace kgate::gw {

namespace {
constexpr auto kReadTimeout = std::chrono::seconds(300);  // an idle keep-alive connection
}

HttpSession::HttpSession(tcp::socket socket, Server& server)
    : stream_(std::move(socket)), server_(server) {
  beast::error_code ec;
  auto peer = stream_.socket().remote_endpoint(ec);
  peer_loopback_ = !ec && peer.address().is_loopback();
  stream_.socket().set_option(tcp::no_delay(true), ec);
}

void HttpSession::run() {
  net::dispatch(stream_.get_executor(),
                beast::bind_front_handler(&HttpSession::do_read, shared_from_this()));
}

void HttpSession::do_read() {
  parser_.emplace();
  parser_->body_limit(server_.options().max_body_bytes);
  parser_->header_limit(static_cast<std::uint32_t>(server_.options().max_header_bytes));
  stream_.expires_after(kReadTimeout);
  http::async_read(stream_, buffer_, *parser_,
                   beast::bind_front_handler(&HttpSession::on_read, shared_from_this()));
}

void HttpSession::on_read(beast::error_code ec, std::size_t) {
  if (ec == http::error::end_of_stream) return do_close();
  if (ec == http::error::body_limit || ec == http::error::header_limit) {
    Request req;
    req.version(11);
    req.keep_alive(false);
    bool body = ec == http::error::body_limit;
    auto res = json_error(req, body ? http::status::payload_too_large : http::status::request_header_fields_too_large,
                          body ? "The request body is over the limit of " +
                                     std::to_string(server_.options().max_body_bytes) + " bytes"
                               : "The request header is over the limit of " +
                                     std::to_string(server_.options().max_header_bytes) + " bytes");
    return write(std::move(res));
  }
  if (ec) {
    if (ec != beast::error::timeout && ec != net::error::operation_aborted &&
        ec != net::error::connection_reset)
      spdlog::debug("http read: {}", ec.message());
    return do_close();
  }
  Request req = parser_->release();
  if (auto refusal = check_request(server_, req)) return write(std::move(*refusal));

  if (websocket::is_upgrade(req)) {
    std::string path, query;
    split_target(req.target(), path, query);
    const std::string& base = server_.options().base_url;
    std::string rel = path.substr(0, base.size()) == base ? path.substr(base.size()) : "";
    // api/kernels/{id}/channels
    static const std::string prefix = "api/kernels/";
    static const std::string suffix = "/channels";
    if (rel.size() > prefix.size() + suffix.size() && rel.compare(0, prefix.size(), prefix) == 0 &&
        rel.compare(rel.size() - suffix.size(), suffix.size(), suffix) == 0) {
      std::string id = rel.substr(prefix.size(), rel.size() - prefix.size() - suffix.size());
      auto kernel = server_.manager().get(id);
      if (!kernel) return write(json_error(req, http::status::not_found, "Kernel does not exist: " + id));
      std::string session = query_param(query, "session_id");
      stream_.expires_never();
      std::make_shared<WsSession>(stream_.release_socket(), server_, kernel, session)->run(std::move(req));
      return;
    }
    if (rel == "api/kgate/agent") {
      std::string agent = query_param(query, "agent");
      std::string label = query_param(query, "label");
      if (agent.empty() || agent.size() > 256 || label.size() > 256)
        return write(json_error(req, http::status::bad_request,
                                "agent=ID is required (at most 256 bytes; label too)"));
      stream_.expires_never();
      std::make_shared<AgentSession>(stream_.release_socket(), server_, AgentRef{agent, label})->run(std::move(req));
      return;
    }
    return write(json_error(req, http::status::not_found, "No websocket endpoint at " + path));
  }
  server_.touch();
  RequestContext ctx{peer_loopback_};
  handle_api(server_, req, ctx, [self = shared_from_this()](Response res) { self->write(std::move(res)); });
}

void HttpSession::write(Response res) {
  bool keep_alive = res.keep_alive();
  // A response may come long after the read (a wait of up to 600 s): give the write its own
  // deadline rather than what is left of the read's.
  stream_.expires_after(kReadTimeout);
  res_ = std::make_shared<Response>(std::move(res));
  http::async_write(stream_, *res_,
                    beast::bind_front_handler(&HttpSession::on_write, shared_from_this(), keep_alive));
}

void HttpSession::on_write(bool keep_alive, beast::error_code ec, std::size_t) {
  res_.reset();
  if (ec) return do_close();
  if (!keep_alive) return do_close();
  do_read();
}

void HttpSession::do_close() {
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
}

}  // namespace kgate::gw
