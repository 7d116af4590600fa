// Unit tests for the REST helpers: the route table and its matching, target splitting, query parameters, the Host/Origin/token
// checks of check_request, CORS (preflights and response headers), kernel_id's UUID check, the
// kernelspec file lookup and its content types, the default_kernel warning, and the json_error body.
#include "api/api.hpp"
#include "api/jobs_api.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "routes.hpp"
#include "server.hpp"
#include "support.hpp"
#include "kgate/jupyter/state_dir.hpp"

namespace kgate::gw {
namespace {

namespace fs = std::filesystem;

using kgate::test::TempDir;

// ---- the route table ----------------------------------------------------------------------

RouteMatch resolve(const std::string& path, unsigned method) { return match_route(routes(), split_path(path), method); }

TEST(Routes, EachPathReachesItsHandler) {
  struct Case {
    const char* path;
    unsigned method;
    Handler handler;
    std::vector<std::string> params;
  };
  const Case cases[] = {
      {"/", on::get, root_redirect, {}},
      {"/api", on::get, api_root, {}},
      {"/api/kernels/", on::post, kernels_start, {}},  // a trailing '/' is the same path
      {"/api/kernels/k1", on::del, kernel_delete, {"k1"}},
      {"/api/kernels/k1/restart", on::post, kernel_restart, {"k1"}},
      {"/api/kernels/k1/channels", on::ws, kernel_channels, {"k1"}},
      {"/api/kgate/kernels/k1/restart", on::post, kgate_restart, {"k1"}},
      {"/api/kgate/kernels/k1/digest/ack", on::post, kgate_digest_ack, {"k1"}},
      {"/api/kgate/jobs/job-3/interrupt", on::post, job_interrupt, {"job-3"}},
      {"/kernelspecs/python3/logo-64x64.png", on::head, kernelspec_resource, {"python3", "logo-64x64.png"}},
      {"/kernelspecs/python3/sub/dir/f.js", on::get, kernelspec_resource, {"python3", "sub/dir/f.js"}},
  };
  for (const auto& c : cases) {
    auto m = resolve(c.path, c.method);
    ASSERT_NE(m.route, nullptr) << c.path;
    EXPECT_EQ(m.route->handler, c.handler) << c.path;
    EXPECT_EQ(m.params, c.params) << c.path;
  }
}

TEST(Routes, RecordsRoutesAreMarked) {
  EXPECT_TRUE(resolve("/api/kgate/jobs", on::get).route->records);
  EXPECT_TRUE(resolve("/api/kgate/kernels/k/execute", on::post).route->records);
  EXPECT_FALSE(resolve("/api/kgate/kernels/k", on::get).route->records);
  EXPECT_FALSE(resolve("/api/kgate/pool", on::get).route->records);
}

TEST(Routes, AWrongMethodListsThePathsMethods) {
  auto m = resolve("/api/kernels/k1", on::post);
  EXPECT_EQ(m.route, nullptr);
  EXPECT_EQ(allow_list(m.path_methods), "GET, DELETE");
  m = resolve("/api/kernels", on::del);
  EXPECT_EQ(allow_list(m.path_methods), "GET, POST");
  m = resolve("/observe", on::post);
  EXPECT_EQ(allow_list(m.path_methods), "GET, HEAD");
  // A websocket-only path: no plain method at all.
  m = resolve("/api/kgate/agent", on::get);
  EXPECT_EQ(m.route, nullptr);
  EXPECT_EQ(m.path_methods, on::ws);
  EXPECT_EQ(allow_list(m.path_methods), "");
}

TEST(Routes, UnknownPathsMatchNothing) {
  for (const char* p : {"/api/kernel", "/api/kernels/a/b", "/api/kernels/k1/interrupt/x", "/kernelspecs/python3",
                        "/api/kgate", "/api/kgate/jobs/j/x", "/observe/x", "/x"}) {
    auto m = resolve(p, on::get);
    EXPECT_EQ(m.route, nullptr) << p;
    EXPECT_EQ(m.path_methods, 0u) << p;
  }
}

TEST(Routes, EveryPatternIsWellFormed) {
  // Literal segments, {name}, and a {name*} only last; no two routes share path and method.
  for (const auto& r : routes()) {
    EXPECT_NE(r.methods, 0u) << r.pattern;
    EXPECT_NE(r.handler, nullptr) << r.pattern;
    auto star = r.pattern.find("*}");
    if (star != std::string_view::npos) {
      EXPECT_EQ(star + 2, r.pattern.size()) << r.pattern;
    }
    EXPECT_EQ(r.pattern.find("//"), std::string_view::npos) << r.pattern;
    for (const auto& o : routes())
      if (&o != &r && o.pattern == r.pattern) {
        EXPECT_EQ(o.methods & r.methods, 0u) << r.pattern;
      }
  }
}

// ---- split_target ------------------------------------------------------------------------

TEST(SplitTarget, PathAndQuery) {
  std::string path, query;
  ASSERT_TRUE(split_target("/api/kernels?token=abc&x=1", path, query));
  EXPECT_EQ(path, "/api/kernels");
  EXPECT_EQ(query, "token=abc&x=1");
  ASSERT_TRUE(split_target("/api", path, query));
  EXPECT_EQ(path, "/api");
  EXPECT_EQ(query, "");
  ASSERT_TRUE(split_target("/api?", path, query));
  EXPECT_EQ(path, "/api");
  EXPECT_EQ(query, "");
  ASSERT_TRUE(split_target("", path, query));
  EXPECT_EQ(path, "");
  EXPECT_EQ(query, "");
}

TEST(SplitTarget, PercentDecodesThePathOnly) {
  std::string path, query;
  ASSERT_TRUE(split_target("/kernelspecs/my%20kernel/logo%2D64x64.png?a=%41+b", path, query));
  EXPECT_EQ(path, "/kernelspecs/my kernel/logo-64x64.png");
  EXPECT_EQ(query, "a=%41+b") << "the query is returned raw";
  ASSERT_TRUE(split_target("/a%2fb%2Fc", path, query));
  EXPECT_EQ(path, "/a/b/c");
  ASSERT_TRUE(split_target("/%e2%98%83", path, query));
  EXPECT_EQ(path, "/\xe2\x98\x83");
  ASSERT_TRUE(split_target("/end%41", path, query));
  EXPECT_EQ(path, "/endA") << "an escape at the very end";
  ASSERT_TRUE(split_target("%41", path, query));
  EXPECT_EQ(path, "A");
}

TEST(SplitTarget, AnEscapedNulIsKeptAndDecodingGoesOnAfterIt) {
  std::string path, query;
  ASSERT_TRUE(split_target("/a%00b%41", path, query));
  EXPECT_EQ(path, std::string("/a\0bA", 5));
}

TEST(SplitTarget, PlusInThePathIsLiteral) {
  std::string path, query;
  ASSERT_TRUE(split_target("/a+b", path, query));
  EXPECT_EQ(path, "/a+b");
}

TEST(SplitTarget, BadEscapesAreRejected) {
  for (const char* t : {"/%zz", "/a%", "/a%4", "%", "%4", "/%4g/x", "/%g4", "/ok%?q=1", "/ok%4?q=1", "/%%41"}) {
    std::string path, query;
    EXPECT_FALSE(split_target(t, path, query)) << t << " -> " << path;
  }
}

// ---- query_param -------------------------------------------------------------------------

TEST(SplitTarget, WhatDoesNotDecodeToUtf8IsRejected) {
  std::string path, query;
  for (const char* t : {"/api/kerne%FFlspecs", "/%C0%AF", "/%E2%98", "/%ED%A0%80", "/%F4%90%80%80",
                        "/a?x=%FF", "/a?%FE=1", "/a?x=1&y=%C3", "/\xff"}) {
    EXPECT_FALSE(split_target(t, path, query)) << t;
  }
  ASSERT_TRUE(split_target("/%E2%98%83?x=%F0%9F%94%91&y=caf%C3%A9", path, query));
  EXPECT_EQ(path, "/\xe2\x98\x83");
}

TEST(QueryParam, Values) {
  EXPECT_EQ(query_param("token=abc", "token"), "abc");
  EXPECT_EQ(query_param("a=1&token=abc&b=2", "token"), "abc");
  EXPECT_EQ(query_param("a=1&b=2", "b"), "2");
  EXPECT_EQ(query_param("token=first&token=second", "token"), "first");
  EXPECT_EQ(query_param("session_id=x&&token=t&", "token"), "t");
  EXPECT_EQ(query_param("tokens=no&xtoken=no&token=yes", "token"), "yes");
}

TEST(QueryParam, MissingKeyIsEmpty) {
  EXPECT_EQ(query_param("", "token"), "");
  EXPECT_EQ(query_param("a=1&b=2", "token"), "");
  EXPECT_EQ(query_param("token", "token"), "") << "key without '='";
  EXPECT_EQ(query_param("token=", "token"), "");
  EXPECT_EQ(query_param("&&&", "token"), "");
}

TEST(QueryParam, PercentAndPlusDecoding) {
  EXPECT_EQ(query_param("q=a+b", "q"), "a b");
  EXPECT_EQ(query_param("q=a%20b%2Bc", "q"), "a b+c");
  EXPECT_EQ(query_param("q=%26%3D", "q"), "&=");
  EXPECT_EQ(query_param("my+key=v", "my key"), "v") << "keys are decoded too";
  EXPECT_EQ(query_param("t%6Fken=v", "token"), "v");
  EXPECT_EQ(query_param("q=%e2%98%83", "q"), "\xe2\x98\x83");
  EXPECT_EQ(query_param("q=a=b", "q"), "a=b") << "only the first '=' separates";
}

TEST(QueryParam, BadEscapesGiveNothing) {
  EXPECT_EQ(query_param("token=%zz", "token"), "");
  EXPECT_EQ(query_param("token=abc%", "token"), "");
  EXPECT_EQ(query_param("token=abc%4", "token"), "");
  EXPECT_EQ(query_param("x=%zz&token=ok", "token"), "ok") << "a bad pair elsewhere does not matter";
  EXPECT_EQ(query_param("%zz=1&token=ok", "token"), "ok");
}

// ---- json_error --------------------------------------------------------------------------

// ---- request_token: jupyter_server's order and spellings ---------------------------------

TEST(RequestToken, SchemeInAnyCaseThenAnyWhitespace) {
  for (const char* h : {"token T0k", "Token T0k", "TOKEN T0k", "bearer T0k", "Bearer T0k", "BEARER T0k",
                        "token  T0k", "token\tT0k", "bearer \t  T0k", "  token T0k  "})
    EXPECT_EQ(request_token("/api/kernels", h), "T0k") << h;
}

TEST(RequestToken, OtherHeadersGiveNoToken) {
  for (const char* h : {"", "token", "token   ", "Basic T0k", "tokens T0k", "tokenT0k", "T0k", "bearer"})
    EXPECT_EQ(request_token("/api/kernels", h), "") << h;
  EXPECT_EQ(request_token("/api/kernels", "token a b"), "a b") << "(.+) keeps the rest of the value";
}

TEST(RequestToken, QueryArgumentComesFirst) {
  EXPECT_EQ(request_token("/api/kernelspecs?token=right", "token wrong"), "right");
  EXPECT_EQ(request_token("/api/kernelspecs?token=wrong", "token right"), "wrong");
  EXPECT_EQ(request_token("/api/kernelspecs?token=", "Bearer right"), "right") << "empty is none";
  EXPECT_EQ(request_token("/api/kernelspecs?a=1", "Bearer right"), "right");
  EXPECT_EQ(request_token("/api/kernelspecs?tokens=x&xtoken=y", ""), "");
}

TEST(RequestToken, QueryArgumentAsTornadoReadsIt) {
  EXPECT_EQ(request_token("/x?token=first&token=last", ""), "last") << "the last one when repeated";
  EXPECT_EQ(request_token("/x?token=%20T0k%20", ""), "T0k") << "whitespace stripped";
  EXPECT_EQ(request_token("/x?t%6Fken=a%2Bb", ""), "a+b") << "keys and values are decoded";
  EXPECT_EQ(request_token("/x?token=a+b", ""), "a b");
  EXPECT_EQ(request_token("/x?token=%zz", "token h"), "h") << "a bad escape is no token";
}

TEST(JsonError, Body) {
  Request req{http::verb::get, "/api/kernels/x", 11};
  for (auto [status, reason] : {std::pair{http::status::not_found, "Not Found"},
                                std::pair{http::status::forbidden, "Forbidden"},
                                std::pair{http::status::unauthorized, "Unauthorized"},
                                std::pair{http::status::bad_request, "Bad Request"},
                                std::pair{http::status::internal_server_error, "Internal Server Error"},
                                std::pair{http::status::method_not_allowed, "Method Not Allowed"}}) {
    Response res = json_error(req, status, "Kernel does not exist: x \"q\"");
    EXPECT_EQ(res.result(), status);
    EXPECT_EQ(res[http::field::content_type], "application/json");
    const json body = json::parse(res.body(), nullptr, false);
    ASSERT_TRUE(body.is_object()) << res.body();
    EXPECT_EQ(body.size(), 2u) << res.body();
    EXPECT_EQ(body.value("message", ""), "Kernel does not exist: x \"q\"");
    EXPECT_EQ(body.value("reason", ""), reason);
    EXPECT_EQ(res[http::field::content_length], std::to_string(res.body().size()));
  }
}

TEST(JsonError, KeepsVersionAndKeepAlive) {
  Request req{http::verb::get, "/", 10};
  req.keep_alive(false);
  Response res = json_error(req, http::status::not_found, "m");
  EXPECT_EQ(res.version(), 10u);
  EXPECT_FALSE(res.keep_alive());
  Request req11{http::verb::get, "/", 11};
  EXPECT_TRUE(json_error(req11, http::status::not_found, "m").keep_alive());
}

// ---- check_request -----------------------------------------------------------------------

// One Server per set of options: it makes its runtime dir and starts the kernel I/O thread,
// but does not listen.
class CheckRequest : public ::testing::Test {
 protected:
  void SetUp() override { spdlog::set_level(spdlog::level::err); }  // refusals log warnings
  void TearDown() override { spdlog::set_level(spdlog::level::info); }
  // Without a token of the test's, none (kgate's own is made only with own_token).
  Server& server(GatewayOptions opts = {}, bool own_token = false) {
    if (opts.token.empty() && !own_token) opts.token_source = TokenSource::none;
    opts.runtime_dir = tmp_.path() / ("rt" + std::to_string(servers_.size()));
    if (opts.state_dir.empty())
      opts.state_dir = tmp_.path() / ("st" + std::to_string(servers_.size()));  // one Server per state dir
    opts.root_dir = tmp_.path();
    servers_.push_back(std::make_unique<Server>(std::move(opts)));
    return *servers_.back();
  }
  static GatewayOptions with_token(std::string token) {
    GatewayOptions o;
    o.token = std::move(token);
    o.token_source = TokenSource::given;
    return o;
  }
  static Request get(std::string target, std::string host = "localhost:8787") {
    Request req{http::verb::get, target, 11};
    if (!host.empty()) req.set(http::field::host, host);
    return req;
  }
  // The status check_request answers, or 200 when it lets the request through.
  static unsigned status(const Server& s, const Request& req) {
    auto r = check_request(s.options(), req);
    if (!r) return 200;
    const json body = json::parse(r->body(), nullptr, false);
    EXPECT_TRUE(body.is_object() && body.contains("message") && body.contains("reason")) << r->body();
    return r->result_int();
  }

  ~CheckRequest() override {
    servers_.clear();  // before the temp dir goes
  }

  TempDir tmp_{"kgate-api"};
  std::vector<std::unique_ptr<Server>> servers_;
};

TEST_F(CheckRequest, RuntimeDirIsPrivate) {
  Server& s = server();
  const auto perms = fs::status(s.options().runtime_dir).permissions();
  EXPECT_EQ(perms & fs::perms::all, fs::perms::owner_all);
}

TEST_F(CheckRequest, LoopbackHosts) {
  Server& s = server();
  for (const char* host : {"localhost:8787", "localhost", "LOCALHOST:8787", "127.0.0.1:8787", "127.0.0.1",
                           "127.1.2.3:80", "[::1]:8787", "[::1]"}) {
    EXPECT_EQ(status(s, get("/api/kernels", host)), 200u) << host;
  }
}

TEST_F(CheckRequest, NoHostHeaderIsAllowed) {
  Server& s = server();
  EXPECT_EQ(status(s, get("/api", "")), 200u);
}

TEST_F(CheckRequest, ForeignHostIsRefusedOnLoopback) {
  Server& s = server();
  for (const char* host : {"evil.example:8787", "evil.example", "10.0.0.1:8787", "[2001:db8::1]:8787",
                           "0.0.0.0:8787", "localhost.evil.example", "localhostx:8787"}) {
    auto r = check_request(s.options(), get("/api/kernels", host));
    ASSERT_TRUE(r.has_value()) << host;
    EXPECT_EQ(r->result(), http::status::forbidden) << host;
    EXPECT_EQ(json::parse(r->body()).value("reason", ""), "Forbidden");
  }
}

// A DNS name that merely starts with "127." is not a loopback address: an attacker's
// "127.attacker.example" can be rebound to 127.0.0.1 (jupyter_server only accepts names that
// parse as loopback IP addresses, or "localhost").
TEST_F(CheckRequest, HostStartingWith127IsNotLoopback) {
  Server& s = server();
  for (const char* host : {"127.evil.example:8787", "127.0.0.1.evil.example", "127.example"})
    EXPECT_EQ(status(s, get("/api/kernels", host)), 403u) << host;
}

TEST_F(CheckRequest, AllowHosts) {
  GatewayOptions o;
  o.allow_hosts = {"mybox.lan"};
  Server& s = server(o);
  EXPECT_EQ(status(s, get("/api", "mybox.lan:8787")), 200u);
  EXPECT_EQ(status(s, get("/api", "mybox.lan")), 200u);
  EXPECT_EQ(status(s, get("/api", "MyBox.LAN:8787")), 200u) << "host names are case-insensitive";
  EXPECT_EQ(status(s, get("/api", "evil.example:8787")), 403u);
  EXPECT_EQ(status(s, get("/api", "other.lan")), 403u);
}

// Host names are case-insensitive: a name written in the config with capitals still matches.
TEST_F(CheckRequest, AllowHostsEntryWithCapitals) {
  GatewayOptions o;
  o.allow_hosts = {"MyBox.lan"};
  Server& s = server(o);
  EXPECT_EQ(status(s, get("/api", "mybox.lan:8787")), 200u);
}

TEST_F(CheckRequest, NonLoopbackBindSkipsTheHostCheck) {
  GatewayOptions o = with_token("t");
  o.ip = "0.0.0.0";
  Server& s = server(o);
  Request req = get("/api?token=t", "evil.example:8787");
  EXPECT_EQ(status(s, req), 200u);
}

TEST_F(CheckRequest, Origin) {
  Server& s = server();
  Request req = get("/api/kernels", "localhost:8787");
  req.set(http::field::origin, "http://evil.example");
  EXPECT_EQ(status(s, req), 403u);
  req.set(http::field::origin, "http://localhost:8787");
  EXPECT_EQ(status(s, req), 200u);
  req.set(http::field::origin, "https://localhost:8787");
  EXPECT_EQ(status(s, req), 200u);
  req.set(http::field::origin, "http://LocalHost:8787");
  EXPECT_EQ(status(s, req), 200u) << "case-insensitive";
  req.set(http::field::origin, "http://localhost:9999");
  EXPECT_EQ(status(s, req), 403u) << "another port is another origin";
  req.set(http::field::origin, "http://localhost");
  EXPECT_EQ(status(s, req), 403u);
  req.set(http::field::origin, "null");
  EXPECT_EQ(status(s, req), 403u);
  req.set(http::field::origin, "");
  EXPECT_EQ(status(s, req), 403u);

  Request ip = get("/api", "127.0.0.1:8787");
  ip.set(http::field::origin, "http://127.0.0.1:8787");
  EXPECT_EQ(status(s, ip), 200u);
  ip.set(http::field::origin, "http://localhost:8787");
  EXPECT_EQ(status(s, ip), 403u) << "the Origin must equal the Host";
}

TEST_F(CheckRequest, OriginRefusalBody) {
  Server& s = server();
  Request req = get("/api/kernels");
  req.set(http::field::origin, "http://evil.example");
  auto r = check_request(s.options(), req);
  ASSERT_TRUE(r.has_value());
  const json body = json::parse(r->body());
  EXPECT_EQ(body.value("reason", ""), "Forbidden");
  EXPECT_NE(body.value("message", "").find("http://evil.example"), std::string::npos) << r->body();
}

TEST_F(CheckRequest, AllowOrigins) {
  GatewayOptions listed;
  listed.allow_origins = {"https://app.example"};
  Server& s1 = server(listed);
  Request req = get("/api");
  req.set(http::field::origin, "https://app.example");
  EXPECT_EQ(status(s1, req), 200u);
  req.set(http::field::origin, "https://other.example");
  EXPECT_EQ(status(s1, req), 403u);

  GatewayOptions star;
  star.allow_origins = {"*"};
  Server& s2 = server(star);
  req.set(http::field::origin, "http://evil.example");
  EXPECT_EQ(status(s2, req), 200u);
  req.set(http::field::origin, "null");
  EXPECT_EQ(status(s2, req), 200u);
}

TEST_F(CheckRequest, AllowOriginsDoesNotBypassHostCheck) {
  GatewayOptions star;
  star.allow_origins = {"*"};
  Server& s = server(star);
  Request req = get("/api", "evil.example");
  req.set(http::field::origin, "http://evil.example");
  EXPECT_EQ(status(s, req), 403u);
}

TEST_F(CheckRequest, NoTokenConfiguredAllowsAll) {
  Server& s = server();
  EXPECT_EQ(status(s, get("/api/kernels")), 200u);
  Request req = get("/api/kernels?token=whatever");
  req.set(http::field::authorization, "token whatever");
  EXPECT_EQ(status(s, req), 200u);
}

TEST_F(CheckRequest, Token) {
  Server& s = server(with_token("s3cret"));

  auto r = check_request(s.options(), get("/api/kernels"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result(), http::status::unauthorized);
  EXPECT_EQ(json::parse(r->body()).value("reason", ""), "Unauthorized");

  Request req = get("/api/kernels");
  req.set(http::field::authorization, "token s3cret");
  EXPECT_EQ(status(s, req), 200u);
  req.set(http::field::authorization, "Bearer s3cret");
  EXPECT_EQ(status(s, req), 200u);
  EXPECT_EQ(status(s, get("/api/kernels?token=s3cret")), 200u);
  EXPECT_EQ(status(s, get("/api/kernels/abc/channels?session_id=x&token=s3cret")), 200u);
  EXPECT_EQ(status(s, get("/api/kernels?token=s3%63ret")), 200u) << "the query value is decoded";

  for (const char* bad : {"token wrong", "token s3cre", "token s3cretX",
                          "Bearer S3CRET", "s3cret", "Basic czNjcmV0", "token "}) {
    Request b = get("/api/kernels");
    b.set(http::field::authorization, bad);
    EXPECT_EQ(status(s, b), 401u) << bad;
  }
  for (const char* bad : {"/api/kernels?token=wrong", "/api/kernels?token=s3cre", "/api/kernels?token=s3cretX",
                          "/api/kernels?token=", "/api/kernels?tok=s3cret", "/api/kernels?token=%zz"}) {
    EXPECT_EQ(status(s, get(bad)), 401u) << bad;
  }
}

TEST_F(CheckRequest, OwnTokenIsMadeOnceKeptAndAskedOnTcpOnly) {
  std::string token;
  const auto state = tmp_.path() / "own";
  {
    GatewayOptions o;
    o.state_dir = state;
    Server& s = server(o, true);
    token = s.options().token;
    ASSERT_EQ(token.size(), 64u);
    EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << token;
    struct stat st {};
    ASSERT_EQ(::stat((state / "token").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(kgate::read_local_token(state), token);  // what the owner's clients read

    EXPECT_EQ(status(s, get("/api/kernels")), 401u);
    EXPECT_EQ(status(s, get("/api/kernels?token=" + token)), 200u);
    RequestContext unix_peer{true, true, nullptr};  // the owner on the Unix socket: its uid was checked
    EXPECT_FALSE(check_request(s.options(), get("/api/kernels"), unix_peer).has_value());
    servers_.clear();  // frees the state dir
  }
  GatewayOptions again;
  again.state_dir = state;
  EXPECT_EQ(server(again, true).options().token, token) << "the next kgate keeps the token";
  // Another's: the file opened to others is not trusted by a client.
  ::chmod((state / "token").c_str(), 0644);
  std::string why;
  EXPECT_EQ(kgate::read_local_token(state, &why), "");
  EXPECT_NE(why.find("not this user's alone"), std::string::npos) << why;
}

TEST_F(CheckRequest, GivenTokenIsAskedOnTheUnixSocketToo) {
  Server& s = server(with_token("s3cret"));
  RequestContext unix_peer{true, true, nullptr};
  EXPECT_EQ(check_request(s.options(), get("/api/kernels"), unix_peer)->result(), http::status::unauthorized);
}

TEST_F(CheckRequest, QueryTokenIsReadBeforeTheHeader) {
  // jupyter_server's order (IdentityProvider.get_token): ?token= first, the header only without it.
  Server& s = server(with_token("s3cret"));
  Request right_query = get("/api/kernels?token=s3cret");
  right_query.set(http::field::authorization, "token wrong");
  EXPECT_EQ(status(s, right_query), 200u);
  Request wrong_query = get("/api/kernels?token=wrong");
  wrong_query.set(http::field::authorization, "token s3cret");
  EXPECT_EQ(status(s, wrong_query), 401u);
  Request spelled = get("/api/kernels");
  for (const char* h : {"Token s3cret", "bearer s3cret", "TOKEN  s3cret", "BEARER\ts3cret"}) {
    spelled.set(http::field::authorization, h);
    EXPECT_EQ(status(s, spelled), 200u) << h;
  }
}

TEST_F(CheckRequest, HostCheckComesBeforeToken) {
  Server& s = server(with_token("s3cret"));
  Request req = get("/api?token=s3cret", "evil.example:8787");
  EXPECT_EQ(status(s, req), 403u);
  Request bad = get("/api", "localhost:8787");
  bad.set(http::field::origin, "http://evil.example");
  bad.set(http::field::authorization, "token s3cret");
  EXPECT_EQ(status(s, bad), 403u);
}

// ---- CORS --------------------------------------------------------------------------------

Request preflight(std::string origin, std::string method = "POST", std::string headers = "") {
  Request req{http::verb::options, "/api/kernels", 11};
  req.set(http::field::host, "localhost:8787");
  req.set(http::field::origin, origin);
  req.set(http::field::access_control_request_method, method);
  if (!headers.empty()) req.set(http::field::access_control_request_headers, headers);
  return req;
}

TEST_F(CheckRequest, PreflightFromAListedOriginIsAnsweredWithoutAToken) {
  GatewayOptions o = with_token("s3cret");
  o.allow_origins = {"https://app.example"};
  Server& s = server(o);
  auto r = check_request(s.options(), preflight("https://app.example", "POST", "authorization, content-type"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result(), http::status::no_content) << r->body();
  EXPECT_EQ((*r)[http::field::access_control_allow_origin], "https://app.example");
  EXPECT_EQ((*r)[http::field::access_control_allow_credentials], "true");
  EXPECT_EQ((*r)[http::field::access_control_allow_headers], "authorization, content-type") << "echoed";
  const std::string methods((*r)[http::field::access_control_allow_methods]);
  for (const char* m : {"GET", "POST", "DELETE"}) EXPECT_NE(methods.find(m), std::string::npos) << methods;
  EXPECT_FALSE((*r)[http::field::access_control_max_age].empty());
  EXPECT_NE(std::string((*r)[http::field::vary]).find("Origin"), std::string::npos);
  EXPECT_TRUE(r->body().empty());
}

TEST_F(CheckRequest, PreflightWithoutRequestedHeadersGetsTheJupyterList) {
  GatewayOptions o;
  o.allow_origins = {"https://app.example/"};  // a trailing slash in the config still matches
  Server& s = server(o);
  auto r = check_request(s.options(), preflight("https://App.Example", "DELETE"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result(), http::status::no_content);
  EXPECT_EQ((*r)[http::field::access_control_allow_origin], "https://App.Example") << "the origin as sent";
  const std::string allowed((*r)[http::field::access_control_allow_headers]);
  for (const char* h : {"Authorization", "Content-Type", "X-XSRFToken"})
    EXPECT_NE(allowed.find(h), std::string::npos) << allowed;
}

TEST_F(CheckRequest, PreflightFromAnUnlistedOriginIsRefused) {
  GatewayOptions o;
  o.allow_origins = {"https://app.example"};
  Server& s = server(o);
  for (const char* origin : {"https://evil.example", "http://app.example", "https://app.example:444", "null",
                             "http://localhost:8787"}) {
    auto r = check_request(s.options(), preflight(origin));
    ASSERT_TRUE(r.has_value()) << origin;
    EXPECT_EQ(r->result(), http::status::forbidden) << origin;
    EXPECT_EQ(r->find(http::field::access_control_allow_origin), r->end()) << origin;
    EXPECT_EQ(r->find(http::field::access_control_allow_credentials), r->end()) << origin;
  }
}

TEST_F(CheckRequest, PreflightStillNeedsALoopbackHost) {
  GatewayOptions o;
  o.allow_origins = {"*"};
  Server& s = server(o);
  Request req = preflight("http://evil.example");
  req.set(http::field::host, "evil.example:8787");
  auto r = check_request(s.options(), req);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result(), http::status::forbidden);
  EXPECT_EQ(r->find(http::field::access_control_allow_origin), r->end());
}

TEST_F(CheckRequest, StarAllowsEveryOriginWithoutCredentials) {
  GatewayOptions o;
  o.allow_origins = {"*"};
  Server& s = server(o);
  auto r = check_request(s.options(), preflight("http://anything.example"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->result(), http::status::no_content);
  EXPECT_EQ((*r)[http::field::access_control_allow_origin], "*");
  EXPECT_EQ(r->find(http::field::access_control_allow_credentials), r->end()) << "never * with credentials";
}

TEST_F(CheckRequest, OptionsWithoutRequestMethodIsNoPreflight) {
  GatewayOptions o = with_token("s3cret");
  o.allow_origins = {"https://app.example"};
  Server& s = server(o);
  Request req = preflight("https://app.example");
  req.erase(http::field::access_control_request_method);
  EXPECT_FALSE(is_cors_preflight(req));
  EXPECT_EQ(status(s, req), 401u) << "a plain OPTIONS is an ordinary request: it needs the token";
}

TEST(Cors, ActualResponseHeadersOnlyForListedOrigins) {
  GatewayOptions o;
  o.allow_origins = {"https://app.example"};
  Request req{http::verb::get, "/api", 11};
  Response listed = json_response(req, http::status::ok, "{}");
  add_cors_headers(o, "https://app.example", listed);
  EXPECT_EQ(listed[http::field::access_control_allow_origin], "https://app.example");
  EXPECT_EQ(listed[http::field::access_control_allow_credentials], "true");
  EXPECT_EQ(listed[http::field::vary], "Origin");
  EXPECT_NE(std::string(listed[http::field::access_control_expose_headers]).find("Location"), std::string::npos);

  for (const char* origin : {"", "https://evil.example", "https://app.example.evil.example", "null"}) {
    Response res = json_response(req, http::status::ok, "{}");
    add_cors_headers(o, origin, res);
    EXPECT_EQ(res.find(http::field::access_control_allow_origin), res.end()) << origin;
    EXPECT_EQ(res.find(http::field::access_control_allow_credentials), res.end()) << origin;
  }
  GatewayOptions none;  // the default: no origin listed
  Response res = json_response(req, http::status::ok, "{}");
  add_cors_headers(none, "http://localhost:8787", res);
  EXPECT_EQ(res.find(http::field::access_control_allow_origin), res.end()) << "same-origin needs no CORS";
}

TEST(Cors, OriginListing) {
  GatewayOptions o;
  o.allow_origins = {"https://a.example", "http://B.example:8080/"};
  EXPECT_EQ(origin_listing(o, "https://a.example"), OriginListing::exact);
  EXPECT_EQ(origin_listing(o, "http://b.example:8080"), OriginListing::exact);
  EXPECT_EQ(origin_listing(o, "http://b.example"), OriginListing::none);
  EXPECT_EQ(origin_listing(o, ""), OriginListing::none);
  o.allow_origins.push_back("*");
  EXPECT_EQ(origin_listing(o, "https://a.example"), OriginListing::exact) << "an exact entry wins over *";
  EXPECT_EQ(origin_listing(o, "https://c.example"), OriginListing::any);
}

// ---- kernel_id ---------------------------------------------------------------------------

TEST(IsUuid, Cases) {
  EXPECT_TRUE(is_uuid("9078f9cc-81b1-4a03-95af-2ea4ca17b4b3"));
  EXPECT_TRUE(is_uuid("9078F9CC-81B1-4A03-95AF-2EA4CA17B4B3"));
  EXPECT_TRUE(is_uuid("00000000-0000-0000-0000-000000000000"));
  for (const char* bad : {"", "9078f9cc81b14a0395af2ea4ca17b4b3", "9078f9cc-81b1-4a03-95af-2ea4ca17b4b",
                          "9078f9cc-81b1-4a03-95af-2ea4ca17b4b33", "9078f9cg-81b1-4a03-95af-2ea4ca17b4b3",
                          "9078f9cc_81b1-4a03-95af-2ea4ca17b4b3", "../../../../../../../../../etc/passwd",
                          "{9078f9cc-81b1-4a03-95af-2ea4ca17b4b}", "9078f9cc-81b1-4a03-95af-2ea4ca17b4b/"})
    EXPECT_FALSE(is_uuid(bad)) << bad;
}

// ---- kernelspec files --------------------------------------------------------------------

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

TEST(KernelspecFile, ServesRegularFilesInsideTheDirectory) {
  TempDir tmp{"kgate-specfile", TempDir::canonical};
  const fs::path dir = tmp.path() / "kernels" / "k";
  write(dir / "kernel.json", "{}");
  write(dir / "logo-64x64.png", "png");
  write(dir / "static" / "ext" / "main.js", "js");
  write(dir / "README.md", "md");
  fs::create_symlink("static/ext/main.js", dir / "inside-link.js");
  EXPECT_EQ(kernelspec_file(dir, "logo-64x64.png"), dir / "logo-64x64.png");
  EXPECT_EQ(kernelspec_file(dir, "kernel.json"), dir / "kernel.json");
  EXPECT_EQ(kernelspec_file(dir, "static/ext/main.js"), dir / "static" / "ext" / "main.js");
  EXPECT_EQ(kernelspec_file(dir, "static//ext/main.js"), dir / "static" / "ext" / "main.js");
  EXPECT_EQ(kernelspec_file(dir, "README.md"), dir / "README.md");
  EXPECT_EQ(kernelspec_file(dir, "inside-link.js"), dir / "static" / "ext" / "main.js")
      << "a symlink that stays inside is fine";
  // The kernelspec directory reached through a symlink (as in a conda env) still works.
  fs::create_directory_symlink(dir, tmp.path() / "linked");
  EXPECT_EQ(kernelspec_file(tmp.path() / "linked", "logo-64x64.png"), dir / "logo-64x64.png");
}

TEST(KernelspecFile, NoEscapes) {
  TempDir tmp{"kgate-specfile", TempDir::canonical};
  const fs::path dir = tmp.path() / "kernels" / "k";
  write(dir / "kernel.json", "{}");
  write(dir / "sub" / "a.txt", "a");
  write(tmp.path() / "kernels" / "secret.txt", "secret");
  write(tmp.path() / "kernels" / "k-other" / "x.txt", "x");
  fs::create_symlink(tmp.path() / "kernels" / "secret.txt", dir / "out-link.txt");
  fs::create_directory_symlink(tmp.path() / "kernels", dir / "out-dir");
  fs::create_symlink("../secret.txt", dir / "rel-out-link.txt");
  for (const char* rel : {"../secret.txt", "sub/../../secret.txt", "./kernel.json", "sub/./a.txt", "..",
                          "/etc/passwd", "out-link.txt", "rel-out-link.txt", "out-dir/secret.txt",
                          "../k-other/x.txt", "sub", "", "nothing.png", "sub/"}) {
    EXPECT_FALSE(kernelspec_file(dir, rel).has_value()) << rel;
  }
  EXPECT_FALSE(kernelspec_file(dir, std::string("kernel.json\0.txt", 16)).has_value()) << "a NUL";
  EXPECT_FALSE(kernelspec_file("", "kernel.json").has_value());
  EXPECT_FALSE(kernelspec_file(tmp.path() / "absent", "kernel.json").has_value());
}

TEST(KernelspecFile, ContentTypes) {
  EXPECT_EQ(kernelspec_content_type("logo-64x64.png"), "image/png");
  EXPECT_EQ(kernelspec_content_type("LOGO.PNG"), "image/png");
  EXPECT_EQ(kernelspec_content_type("logo-svg.svg"), "image/svg+xml");
  EXPECT_EQ(kernelspec_content_type("kernel.js"), "text/javascript; charset=utf-8");
  EXPECT_EQ(kernelspec_content_type("kernel.css"), "text/css; charset=utf-8");
  EXPECT_EQ(kernelspec_content_type("kernel.json"), "application/json");
  EXPECT_EQ(kernelspec_content_type("sub.dir/notes.txt"), "text/plain; charset=utf-8");
  EXPECT_EQ(kernelspec_content_type("a/b.woff2"), "font/woff2");
  EXPECT_EQ(kernelspec_content_type("page.html"), "application/octet-stream") << "no pages from the API origin";
  EXPECT_EQ(kernelspec_content_type("Makefile"), "application/octet-stream");
  EXPECT_EQ(kernelspec_content_type("dir.png/file"), "application/octet-stream");
}

// ---- default_kernel ----------------------------------------------------------------------

Catalog catalog_of(std::vector<std::pair<std::string, bool>> specs, std::string default_name) {
  Catalog cat;
  for (auto& [name, ok] : specs) {
    CatalogEntry e;
    e.spec.name = name;
    e.spec.language = "python";
    e.launchable = ok;
    if (!ok) e.reason = "ipykernel not installed";
    cat.entries.push_back(std::move(e));
  }
  cat.default_name = std::move(default_name);
  return cat;
}

TEST(DefaultKernelWarning, NoneWhenItNamesALaunchableSpec) {
  auto cat = catalog_of({{"python3", true}, {"ir", true}}, "ir");
  EXPECT_EQ(default_kernel_warning(cat, "ir"), "");
  EXPECT_EQ(default_kernel_warning(cat, "python3"), "");
}

TEST(DefaultKernelWarning, NamesTheSettingTheFallbackAndTheSpecs) {
  auto cat = catalog_of({{"python3", true}, {"ir", true}, {"broken", false}}, "python3");
  const std::string w = default_kernel_warning(cat, "no-such-kernel");
  EXPECT_NE(w.find("default_kernel = \"no-such-kernel\""), std::string::npos) << w;
  EXPECT_NE(w.find("names no kernelspec"), std::string::npos) << w;
  EXPECT_NE(w.find("start python3 instead"), std::string::npos) << w;
  EXPECT_NE(w.find("Kernelspecs: python3, ir"), std::string::npos) << w;
  EXPECT_EQ(w.find("broken"), std::string::npos) << "only launchable ones are listed: " << w;

  const std::string b = default_kernel_warning(cat, "broken");
  EXPECT_NE(b.find("cannot be launched (ipykernel not installed)"), std::string::npos) << b;
}

TEST(DefaultKernelWarning, NoKernelspecAtAll) {
  auto cat = catalog_of({}, "no-such-kernel");
  const std::string w = default_kernel_warning(cat, "no-such-kernel");
  EXPECT_NE(w.find("fails"), std::string::npos) << w;
  EXPECT_NE(w.find("Kernelspecs: none"), std::string::npos) << w;
}


// Waiters::any(), which Server's on_change reads on kgate-io to skip a poke nobody waits for: a
// wait counts from before its first ready() until it fires, so a change made after that first
// ask always finds it counted.
TEST(Waiters, AWaitCountsFromBeforeItsFirstAskUntilItFires) {
  net::io_context ioc;
  Waiters w(ioc, 2);
  EXPECT_FALSE(w.any());
  bool counted_while_asked = false;
  int done = 0;
  ASSERT_TRUE(w.add(std::chrono::seconds(30), [&] { counted_while_asked = w.any(); return false; }, [&] { ++done; }));
  EXPECT_TRUE(counted_while_asked);
  EXPECT_TRUE(w.any());
  bool ready = false;
  ASSERT_TRUE(w.add(std::chrono::seconds(30), [&] { return ready; }, [&] { ++done; }));
  EXPECT_FALSE(w.add(std::chrono::seconds(30), [] { return false; }, [&] { ++done; }));  // past max: refused
  EXPECT_EQ(w.size(), 2u);
  ready = true;
  w.poke();  // the second is ready: it fires, the first still waits
  EXPECT_EQ(done, 1);
  EXPECT_TRUE(w.any());
  w.cancel_all();
  EXPECT_EQ(done, 2);
  EXPECT_FALSE(w.any());
  ioc.poll();  // the cancelled timers' handlers: nothing fires twice
  EXPECT_EQ(done, 2);
  // Ready at once: answered, and not counted after.
  ASSERT_TRUE(w.add(std::chrono::seconds(30), [] { return true; }, [&] { ++done; }));
  EXPECT_EQ(done, 3);
  EXPECT_FALSE(w.any());
}

}  // namespace
}  // namespace kgate::gw
