// The kernel side's host rule and how its install reply is read (kernel_side.hpp). The Python
// itself runs in real kernels in tests/integration/test_kernel_side.py.
#include <gtest/gtest.h>

#include "kgate/kernel/kernel_side.hpp"

namespace kgate {
namespace {

TEST(KernelSide, TheHostIsItsSessionOrItWithASuffix) {
  const std::string host = "kgate-0123456789abcdef0123456789abcdef";
  EXPECT_TRUE(is_host_session(host, host));
  EXPECT_TRUE(is_host_session(host + ".a1b2c3", host));
  EXPECT_FALSE(is_host_session(host + "x", host));
  EXPECT_FALSE(is_host_session(host.substr(0, 20), host));
  EXPECT_FALSE(is_host_session("", host));
  EXPECT_FALSE(is_host_session(host, ""));  // no host: nobody is it
  EXPECT_FALSE(is_host_session("other." + host, host));
}

TEST(KernelSide, TheInstallRequestIsSilentAndReportsThroughAUserExpression) {
  json c = kernel_side_install_request("kgate-host\"quote");
  EXPECT_EQ(c["silent"], true);
  EXPECT_EQ(c["store_history"], false);
  EXPECT_EQ(c["allow_stdin"], false);
  EXPECT_EQ(c["stop_on_error"], false);
  EXPECT_TRUE(c["user_expressions"].contains("kgate"));
  const std::string code = c["code"];
  // The host goes in as a string literal, escaped.
  EXPECT_NE(code.find(R"(.install("kgate-host\"quote"))"), std::string::npos) << code;
  // Nothing is bound in the user's namespace: the loader runs in a dict of its own.
  EXPECT_NE(code.find(", {})"), std::string::npos) << code;
}

json report_reply(const std::string& text) {
  return {{"status", "ok"},
          {"user_expressions",
           {{"kgate", {{"status", "ok"}, {"data", {{"text/plain", text}}}, {"metadata", json::object()}}}}}};
}

TEST(KernelSide, AReportNamesTheRunningTaskFromVersionTwoOn) {
  json side = kernel_side_from_reply(report_reply(R"({"version": 2, "features": ["tasks"], "task": "msg-1"})"));
  EXPECT_EQ(side["running_task"], "msg-1");
  side = kernel_side_from_reply(report_reply(R"({"version": 2, "features": ["tasks"], "task": null})"));
  ASSERT_TRUE(side.contains("running_task"));
  EXPECT_TRUE(side["running_task"].is_null());
  // Version 1 does not say: nothing may be concluded (a re-adopted kernel keeps its old side).
  side = kernel_side_from_reply(report_reply(R"({"version": 1, "features": ["tasks"]})"));
  EXPECT_FALSE(side.contains("running_task"));
}

TEST(KernelSide, AReportSaysWhichFeaturesAreOnAndWhyTheOthersAreOff) {
  json side = kernel_side_from_reply(report_reply(
      R"({"version": 1, "features": ["shutdown_guard"], "off": {"silent_echo": "ipykernel lacks _publish_execute_input"}})"));
  EXPECT_EQ(side["installed"], true);
  EXPECT_EQ(side["version"], 1);
  EXPECT_EQ(side["features"]["shutdown_guard"], true);
  EXPECT_EQ(side["features"]["silent_echo"], "ipykernel lacks _publish_execute_input");
  // A feature this kgate knows and the kernel side does not mention is off, with a reason.
  side = kernel_side_from_reply(report_reply(R"({"version": 1, "features": ["shutdown_guard"]})"));
  EXPECT_TRUE(side["features"]["silent_echo"].is_string());
}

TEST(KernelSide, AFailedOrUnreadableInstallTurnsEverythingOff) {
  json side = kernel_side_from_reply({{"status", "error"}, {"ename", "PermissionError"}, {"evalue", "another host"}});
  EXPECT_EQ(side["installed"], false);
  EXPECT_EQ(side["reason"], "installing it failed: PermissionError: another host");
  for (auto f : kKernelSideFeatures) EXPECT_TRUE(side["features"][std::string(f)].is_string());
  EXPECT_EQ(kernel_side_from_reply(json("x"))["installed"], false);
  EXPECT_EQ(kernel_side_from_reply(report_reply("not json"))["installed"], false);
  EXPECT_EQ(kernel_side_from_reply({{"status", "ok"}})["installed"], false);
}

}  // namespace
}  // namespace kgate
