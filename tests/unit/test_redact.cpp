// What of a request target reaches kgate's log: credentials in the query are blanked.
#include <gtest/gtest.h>

#include "redact.hpp"

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
