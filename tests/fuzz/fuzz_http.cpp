// Fuzz target: an HTTP request as kgate reads it (Beast's parser with kgate's header and body
// limits), then the Host/Origin/token checks and the REST router with its JSON bodies.
//
// The requests go to two real, never-listening Servers on the harness thread (their Asio
// thread): one without a token and one with.  Each Server's one max_kernels slot is taken
// before the first input, so a well-formed POST /api/kernels is answered 503 and no kernel is
// ever launched; the warm pool and interpreter probes are off.  Invariants: exactly one reply
// per request, and a JSON reply whose body is valid JSON.  Websocket upgrades are left out:
// they need a socket (tests/integration covers them).
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include <boost/beast/http/parser.hpp>
#include <boost/beast/websocket/rfc6455.hpp>

#include "routes.hpp"
#include "server.hpp"

namespace fs = std::filesystem;
using namespace kgate::gw;

namespace {

void must(bool ok) {
  if (!ok) std::abort();
}

Server* make_server(const fs::path& root, const std::string& token) {
  GatewayOptions o;
  o.port = 0;
  o.token = token;
  o.token_source = token.empty() ? TokenSource::none : TokenSource::given;
  o.runtime_dir = root / ("runtime" + token);
  o.state_dir = root / ("state" + token);  // one kgate per state directory
  o.root_dir = root;
  o.discovery.interpreters = false;
  o.pool.size = 0;
  o.max_kernels = 1;
  o.max_body_bytes = 1 << 16;
  o.max_header_bytes = 1 << 14;
  auto* s = new Server(o);  // never deleted: the process ends with the fuzzer
  must(!s->admit());        // the only slot, never given back
  bool ready = false;
  s->with_catalog([&](auto) { ready = true; });
  while (!ready) s->ioc().run_one_for(std::chrono::milliseconds(50));
  return s;
}

struct Harness {
  fs::path root;
  Server* open = nullptr;
  Server* guarded = nullptr;
  Harness() {
    spdlog::set_level(spdlog::level::off);
    root = fs::temp_directory_path() / ("kgate-fuzz-http-" + std::to_string(::getpid()));
    fs::create_directories(root);
    open = make_server(root, "");
    guarded = make_server(root, "fuzz-token");
  }
};

void serve(Server& server, Request req, const RequestContext& ctx) {
  auto replies = std::make_shared<int>(0);
  auto check = [replies](const Response& res) {
    must(++*replies == 1);
    if (res[http::field::content_type] == "application/json") must(nlohmann::json::accept(res.body()));
  };
  if (auto refusal = check_request(server.options(), req, ctx)) return check(*refusal);
  if (websocket::is_upgrade(req)) return;
  route(server, req, ctx, [check](Response res) { check(res); });
  // Most replies are immediate; a long poll is given 20 ms and then left pending (the server's
  // waiters are bounded: max_waiters).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  while (*replies == 0 && std::chrono::steady_clock::now() < deadline) {
    if (server.ioc().stopped()) server.ioc().restart();
    server.ioc().run_one_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Harness h;
  if (size == 0) return 0;
  // The first byte picks the server and the peer; the rest is the request as sent.
  const std::uint8_t mode = data[0];
  Server& server = (mode & 1) ? *h.guarded : *h.open;
  RequestContext ctx{(mode & 2) == 0, (mode & 4) != 0};
  http::request_parser<http::string_body> parser;
  parser.eager(true);
  parser.body_limit(server.options().max_body_bytes);
  parser.header_limit(static_cast<std::uint32_t>(server.options().max_header_bytes));
  beast::error_code ec;
  parser.put(net::buffer(data + 1, size - 1), ec);
  if (ec || !parser.is_done()) return 0;
  serve(server, parser.get(), ctx);
  return 0;
}
