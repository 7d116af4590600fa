// What of a request target reaches kgate's log: credentials in the query are blanked.
#include <gtest/gtest.h>

#include "http/redact.hpp"

using kgate::gw::loggable_target;

TEST(Redact, PathWithoutQueryIsKept) {
  EXPECT_EQ(loggable_target("/api/kernels/abc"), "/api/kernels/abc");
  EXPECT_EQ(loggable_target("/api?"), "/api?");
}

TEST(Redact, TokenValueIsBlanked) {
  EXPECT_EQ(loggable_target("/api/kernels?token=s3cret"), "/api/kernels?token=[redacted]");
  EXPECT_EQ(loggable_target("/a?x=1&token=s3cret&y=2"), "/a?x=1&token=[redacted]&y=2");
  EXPECT_EQ(loggable_target("/a?TOKEN=s3cret"), "/a?TOKEN=[redacted]");
  EXPECT_EQ(loggable_target("/a?access_token=s3cret&_xsrf=abc"), "/a?access_token=[redacted]&_xsrf=[redacted]");
  // Every occurrence, not only the first.
  EXPECT_EQ(loggable_target("/a?token=one&token=two"), "/a?token=[redacted]&token=[redacted]");
  // Names are compared decoded, as the token reader decodes them.
  EXPECT_EQ(loggable_target("/a?%74oken=s3cret"), "/a?%74oken=[redacted]");
  EXPECT_EQ(loggable_target("/a?%54OKEN=s3cret&x=1"), "/a?%54OKEN=[redacted]&x=1");
  EXPECT_EQ(loggable_target("/a?to%6ben=s3cret"), "/a?to%6ben=[redacted]");
  EXPECT_EQ(loggable_target("/a?%zz=s3cret"), "/a?%zz=[redacted]");  // undecodable: blanked
}

TEST(Redact, OtherParametersAreKept) {
  EXPECT_EQ(loggable_target("/api/kernels/k/channels?session_id=abc&x"), "/api/kernels/k/channels?session_id=abc&x");
  EXPECT_EQ(loggable_target("/a?token"), "/a?token");  // no value: nothing to hide
}

TEST(Redact, TheCapNeverLeavesPartOfAToken) {
  std::string secret(500, 'S');
  std::string out = loggable_target("/api/kernels?token=" + secret, 200);
  EXPECT_EQ(out.find('S'), std::string::npos);
  std::string long_path = "/" + std::string(300, 'p') + "?token=" + secret;
  out = loggable_target(long_path, 200);
  EXPECT_EQ(out.find('S'), std::string::npos);
  EXPECT_EQ(out.size(), 203u);  // 200 and the "..." that marks the cut
}

#include <spdlog/sinks/ostream_sink.h>

#include <sstream>

// The catch-all of HttpSession logs through log_internal_error: what reaches the log holds the
// path and the error, never the token.
TEST(Redact, TheInternalErrorLogLineHasNoToken) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("redact-test", sink));
  kgate::gw::log_internal_error("GET", "/api/kernels/abc?token=TOPSECRET-1&x=1", "boom");
  spdlog::default_logger()->flush();
  spdlog::set_default_logger(previous);
  std::string line = out.str();
  EXPECT_EQ(line.find("TOPSECRET"), std::string::npos) << line;
  EXPECT_NE(line.find("internal error serving GET /api/kernels/abc?token=[redacted]&x=1: boom"), std::string::npos)
      << line;
}
