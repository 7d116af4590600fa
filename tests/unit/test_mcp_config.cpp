// Unit tests for kgate-mcp's configuration: gateways.toml parsing and gateway resolution.
#include <gtest/gtest.h>

#include <cstdlib>

#include "mcp_config.hpp"

using namespace kgate::mcp;

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
  EXPECT_FALSE(resolve_gateway(cfg, "https://x:1/", ep, err));
  EXPECT_NE(err.find("https"), std::string::npos);
  EXPECT_FALSE(resolve_gateway(cfg, "ftp://x/", ep, err));
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
