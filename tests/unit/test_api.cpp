// Unit tests for the REST helpers: target splitting, query parameters, the Host/Origin/token
// checks of check_request, and the json_error body.
#include "api.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "server.hpp"
#include "support.hpp"

namespace kgate::gw {
namespace {

namespace fs = std::filesystem;

using kgate::test::TempDir;

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

TEST(ValidUtf8, Cases) {
  EXPECT_TRUE(valid_utf8(""));
  EXPECT_TRUE(valid_utf8("plain ascii"));
  EXPECT_TRUE(valid_utf8("caf\xc3\xa9 \xe2\x98\x83 \xf0\x9f\x94\x91 \xf4\x8f\xbf\xbf"));
  EXPECT_FALSE(valid_utf8("\xff"));
  EXPECT_FALSE(valid_utf8("\x80"));              // a continuation byte first
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(valid_utf8("\xe0\x80\xaf"));      // overlong, 3 bytes
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(valid_utf8("\xe2\x98"));          // cut short
  EXPECT_FALSE(valid_utf8("\xc3("));              // a bad continuation
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
  Server& server(GatewayOptions opts = {}) {
    opts.runtime_dir = tmp_.path() / ("rt" + std::to_string(servers_.size()));
    opts.root_dir = tmp_.path();
    servers_.push_back(std::make_unique<Server>(std::move(opts)));
    return *servers_.back();
  }
  static GatewayOptions with_token(std::string token) {
    GatewayOptions o;
    o.token = std::move(token);
    return o;
  }
  static Request get(std::string target, std::string host = "localhost:8787") {
    Request req{http::verb::get, target, 11};
    if (!host.empty()) req.set(http::field::host, host);
    return req;
  }
  // The status check_request answers, or 200 when it lets the request through.
  static unsigned status(const Server& s, const Request& req) {
    auto r = check_request(s, req);
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
    auto r = check_request(s, get("/api/kernels", host));
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
  auto r = check_request(s, req);
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

  auto r = check_request(s, get("/api/kernels"));
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

TEST_F(CheckRequest, WrongHeaderTokenIsNotRescuedByQuery) {
  Server& s = server(with_token("s3cret"));
  Request req = get("/api/kernels?token=s3cret");
  req.set(http::field::authorization, "token wrong");
  EXPECT_EQ(status(s, req), 401u);
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

}  // namespace
}  // namespace kgate::gw
