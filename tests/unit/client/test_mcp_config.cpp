// Unit tests for kgate-mcp's configuration: gateways.toml parsing and gateway resolution.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kgate/client/gateways_toml.hpp"

using namespace kgate::client;

namespace {

Config parsed(const std::string& text) {
  Config cfg;
  cfg.dir = "/nonexistent/kgate";
  parse_gateways(text, "gateways.toml", cfg);
  return cfg;
}

std::string parse_error(const std::string& text) {
  try {
    parsed(text);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Gateways, ParsesEntries) {
  Config cfg = parsed(R"(
[gateways.lab]
url = "http://lab.example:8888/base"
token = "abc"
[gateways.box]
url = "http://10.0.0.2:8787/"
token_env = "BOX_TOKEN"
verify = false
)");
  ASSERT_EQ(cfg.gateways.size(), 2u);
  EXPECT_EQ(cfg.gateways["lab"].token, "abc");
  EXPECT_EQ(cfg.gateways["box"].token_env, "BOX_TOKEN");
  EXPECT_FALSE(cfg.gateways["box"].verify);
}

TEST(Gateways, ErrorsNameTheProblem) {
  EXPECT_NE(parse_error("[gateways.x]\nurl = 1\n").find("gateways.x.url must be a string"), std::string::npos);
  EXPECT_NE(parse_error("[gateways.x]\nurl = \"http://a\"\nfoo = 1\n").find("unknown key"), std::string::npos);
  EXPECT_NE(parse_error("[gateways.x]\ntoken = \"t\"\n").find("has no url"), std::string::npos);
  EXPECT_NE(parse_error("[gateways.x]\nurl = \"http://a\"\ntoken = \"t\"\ntoken_env = \"E\"\n").find("both"),
            std::string::npos);
  EXPECT_NE(parse_error("[other]\n").find("unknown table"), std::string::npos);
  EXPECT_NE(parse_error("[gateways.x\n").find("gateways.toml:1:"), std::string::npos);
}

TEST(Gateways, ResolveDefaultNameAndUrl) {
  Config cfg = parsed("[gateways.lab]\nurl = \"http://lab:9000/jp\"\ntoken = \"sekrit\"\n");
  cfg.default_url = "http://127.0.0.1:8787";
  cfg.default_token = "deftok";
  Endpoint ep;
  std::string err;
  ASSERT_TRUE(resolve_gateway(cfg, "", ep, err)) << err;
  EXPECT_TRUE(ep.is_default);
  EXPECT_EQ(ep.host, "127.0.0.1");
  EXPECT_EQ(ep.port, "8787");
  EXPECT_EQ(ep.base, "/");
  EXPECT_EQ(ep.token, "deftok");

  ASSERT_TRUE(resolve_gateway(cfg, "lab", ep, err)) << err;
  EXPECT_FALSE(ep.is_default);
  EXPECT_EQ(ep.host, "lab");
  EXPECT_EQ(ep.port, "9000");
  EXPECT_EQ(ep.base, "/jp/");
  EXPECT_EQ(ep.token, "sekrit");

  ASSERT_TRUE(resolve_gateway(cfg, "http://[::1]:8000", ep, err)) << err;
  EXPECT_EQ(ep.host, "::1");
  EXPECT_EQ(ep.port, "8000");

  EXPECT_FALSE(resolve_gateway(cfg, "nope", ep, err));
  EXPECT_NE(err.find("unknown gateway 'nope'"), std::string::npos);
  EXPECT_FALSE(resolve_gateway(cfg, "ftp://x/", ep, err));
  EXPECT_NE(err.find("expected http, https or unix"), std::string::npos);
}

TEST(Gateways, HttpsUrls) {
  Endpoint ep;
  std::string err;
  ASSERT_TRUE(parse_endpoint_url("https://lab.example.org", ep, err)) << err;
  EXPECT_EQ(ep.scheme, "https");
  EXPECT_EQ(ep.host, "lab.example.org");
  EXPECT_EQ(ep.port, "443");
  EXPECT_EQ(ep.base, "/");
  ASSERT_TRUE(parse_endpoint_url("HTTPS://lab:8443/jupyter", ep, err)) << err;
  EXPECT_EQ(ep.scheme, "https");
  EXPECT_EQ(ep.port, "8443");
  EXPECT_EQ(ep.base, "/jupyter/");
  ASSERT_TRUE(parse_endpoint_url("https://[::1]/x/", ep, err)) << err;
  EXPECT_EQ(ep.host, "::1");
  EXPECT_EQ(ep.port, "443");
  ASSERT_TRUE(parse_endpoint_url("http://lab", ep, err)) << err;
  EXPECT_EQ(ep.port, "80");
  EXPECT_FALSE(parse_endpoint_url("https://lab:44x/", ep, err));
  EXPECT_NE(err.find("bad port"), std::string::npos);
  EXPECT_FALSE(parse_endpoint_url("https:///base", ep, err));
  EXPECT_NE(err.find("no host"), std::string::npos);
}

TEST(Gateways, UnixSocketUrls) {
  Endpoint ep;
  std::string err;
  ASSERT_TRUE(parse_endpoint_url("unix:///run/user/1000/kgate/kgate.sock", ep, err)) << err;
  EXPECT_EQ(ep.scheme, "unix");
  EXPECT_TRUE(ep.is_unix());
  EXPECT_EQ(ep.socket_path, "/run/user/1000/kgate/kgate.sock");
  EXPECT_EQ(ep.host, "localhost");
  EXPECT_EQ(ep.host_header(), "localhost");  // no port in the Host header
  EXPECT_EQ(ep.base, "/");
  ASSERT_TRUE(parse_endpoint_url("UNIX:///tmp/k.sock", ep, err)) << err;
  EXPECT_EQ(ep.socket_path, "/tmp/k.sock");

  EXPECT_FALSE(parse_endpoint_url("unix://tmp/k.sock", ep, err));  // two slashes: a relative path
  EXPECT_NE(err.find("unix:///path/to/kgate.sock"), std::string::npos) << err;
  EXPECT_FALSE(parse_endpoint_url("unix://", ep, err));
  EXPECT_NE(err.find("no absolute socket path"), std::string::npos) << err;
  EXPECT_FALSE(parse_endpoint_url("unix:///" + std::string(200, 'a') + ".sock", ep, err));
  EXPECT_NE(err.find("too long"), std::string::npos) << err;

  // The same Endpoint parsed again as http keeps nothing of the socket.
  ASSERT_TRUE(parse_endpoint_url("http://h:1", ep, err)) << err;
  EXPECT_FALSE(ep.is_unix());
  EXPECT_EQ(ep.socket_path, "");
  EXPECT_EQ(ep.host_header(), "h:1");
}

TEST(Gateways, UnixSocketGateways) {
  Config cfg = parsed("[gateways.local]\nurl = \"unix:///tmp/kgate-test/kgate.sock\"\ntoken = \"t\"\n");
  Endpoint ep;
  std::string err;
  ASSERT_TRUE(resolve_gateway(cfg, "local", ep, err)) << err;
  EXPECT_TRUE(ep.is_unix());
  EXPECT_EQ(ep.socket_path, "/tmp/kgate-test/kgate.sock");
  EXPECT_EQ(ep.token, "t");
  ASSERT_TRUE(resolve_gateway(cfg, "unix:///tmp/other.sock", ep, err)) << err;
  EXPECT_EQ(ep.socket_path, "/tmp/other.sock");

  // KGATE_URL=unix:///... is the default gateway.
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  std::string saved_xdg = xdg ? xdg : "";
  const char* url = std::getenv("KGATE_URL");
  std::string saved_url = url ? url : "";
  ::setenv("XDG_CONFIG_HOME", "/nonexistent-kgate-test", 1);
  ::setenv("KGATE_URL", "unix:///tmp/default.sock", 1);
  ASSERT_TRUE(resolve_gateway(load_config(), "", ep, err)) << err;
  EXPECT_TRUE(ep.is_default);
  EXPECT_EQ(ep.socket_path, "/tmp/default.sock");
  if (url) ::setenv("KGATE_URL", saved_url.c_str(), 1);
  else ::unsetenv("KGATE_URL");
  if (xdg) ::setenv("XDG_CONFIG_HOME", saved_xdg.c_str(), 1);
  else ::unsetenv("XDG_CONFIG_HOME");
}

TEST(Gateways, TlsSettings) {
  Config cfg = parsed(R"(
[gateways.lab]
url = "https://lab.example.org"
token = "t"
ca_file = "/etc/lab/ca.pem"
[gateways.rel]
url = "https://rel:8443/"
ca_file = "certs/rel.pem"
[gateways.self]
url = "https://self:8443/"
verify = false
)");
  EXPECT_EQ(cfg.gateways["lab"].ca_file, "/etc/lab/ca.pem");
  EXPECT_TRUE(cfg.gateways["lab"].verify);
  EXPECT_FALSE(cfg.gateways["self"].verify);
  EXPECT_EQ(cfg.gateways["self"].ca_file, "");
  Endpoint ep;
  std::string err;
  ASSERT_TRUE(resolve_gateway(cfg, "lab", ep, err)) << err;
  EXPECT_EQ(ep.scheme, "https");
  EXPECT_EQ(ep.port, "443");
  EXPECT_EQ(ep.ca_file, "/etc/lab/ca.pem");
  EXPECT_TRUE(ep.verify);
  ASSERT_TRUE(resolve_gateway(cfg, "rel", ep, err)) << err;
  EXPECT_EQ(ep.ca_file, "/nonexistent/kgate/certs/rel.pem");  // relative to the config dir
  ASSERT_TRUE(resolve_gateway(cfg, "self", ep, err)) << err;
  EXPECT_FALSE(ep.verify);

  // The default gateway and URL hosts take the environment's settings.
  cfg.default_url = "https://gw.example.org:8787/";
  cfg.default_ca_file = "/tmp/ca.pem";
  cfg.default_verify = false;
  ASSERT_TRUE(resolve_gateway(cfg, "", ep, err)) << err;
  EXPECT_EQ(ep.port, "8787");
  EXPECT_EQ(ep.ca_file, "/tmp/ca.pem");
  EXPECT_FALSE(ep.verify);
  ASSERT_TRUE(resolve_gateway(cfg, "https://other", ep, err)) << err;
  EXPECT_EQ(ep.port, "443");
  EXPECT_EQ(ep.ca_file, "/tmp/ca.pem");
  EXPECT_FALSE(ep.verify);
}

TEST(Gateways, BadTlsValues) {
  EXPECT_NE(parse_error("[gateways.x]\nurl = \"https://a\"\nca_file = 1\n").find("gateways.x.ca_file must be the path"),
            std::string::npos);
  EXPECT_NE(parse_error("[gateways.x]\nurl = \"https://a\"\nca_file = \"\"\n").find("ca_file must be the path"),
            std::string::npos);
  EXPECT_NE(parse_error("[gateways.x]\nurl = \"https://a\"\nverify = \"no\"\n").find("must be true or false"),
            std::string::npos);
  EXPECT_NE(parse_error("[gateways.x]\nurl = \"https://a\"\ncafile = \"a\"\n").find("ca_file)"), std::string::npos);
}

TEST(Gateways, TlsEnvironment) {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  std::string saved_xdg = xdg ? xdg : "";
  ::setenv("XDG_CONFIG_HOME", "/nonexistent-kgate-test", 1);
  ::setenv("KGATE_CA_FILE", "/etc/ca.pem", 1);
  for (const char* off : {"0", "false", "NO", "off"}) {
    ::setenv("KGATE_TLS_VERIFY", off, 1);
    Config cfg = load_config();
    EXPECT_FALSE(cfg.default_verify) << off;
    EXPECT_EQ(cfg.default_ca_file, "/etc/ca.pem");
  }
  for (const char* on : {"1", "true", "maybe"}) {  // anything else keeps the checks on
    ::setenv("KGATE_TLS_VERIFY", on, 1);
    EXPECT_TRUE(load_config().default_verify) << on;
  }
  ::unsetenv("KGATE_TLS_VERIFY");
  ::unsetenv("KGATE_CA_FILE");
  Config cfg = load_config();
  EXPECT_TRUE(cfg.default_verify);
  EXPECT_EQ(cfg.default_ca_file, "");
  if (xdg) ::setenv("XDG_CONFIG_HOME", saved_xdg.c_str(), 1);
  else ::unsetenv("XDG_CONFIG_HOME");
}

TEST(Gateways, TokenFromTheEnvironment) {
  Config cfg = parsed("[gateways.e]\nurl = \"http://h:1\"\ntoken_env = \"KGATE_TEST_GW_TOKEN\"\n");
  Endpoint ep;
  std::string err;
  ::unsetenv("KGATE_TEST_GW_TOKEN");
  EXPECT_FALSE(resolve_gateway(cfg, "e", ep, err));
  EXPECT_NE(err.find("$KGATE_TEST_GW_TOKEN"), std::string::npos);
  ::setenv("KGATE_TEST_GW_TOKEN", "fromenv", 1);
  ASSERT_TRUE(resolve_gateway(cfg, "e", ep, err)) << err;
  EXPECT_EQ(ep.token, "fromenv");
  ::unsetenv("KGATE_TEST_GW_TOKEN");
}

TEST(Gateways, BrokenFileIsReportedOnUse) {
  Config cfg;
  cfg.gateways_error = "gateways.toml:3:1: bad";
  Endpoint ep;
  std::string err;
  EXPECT_TRUE(resolve_gateway(cfg, "", ep, err));  // the default gateway does not need the file
  EXPECT_FALSE(resolve_gateway(cfg, "lab", ep, err));
  EXPECT_NE(err.find("broken"), std::string::npos);
}
