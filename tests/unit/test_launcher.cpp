// Unit tests for the remote launchers' pure parts (launcher.hpp, DEV.md §4f): the sbatch and
// ssh command lines, POST overrides, the kernel table's copy of a launcher, the control link's
// challenge answer.
#include "kgate/launcher.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "kgate/supervisor.hpp"

namespace kgate {
namespace {

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

LauncherConfig slurm_launcher() {
  LauncherConfig l;
  l.name = "gpu";
  l.kind = LauncherConfig::Kind::slurm;
  l.slurm = {{"partition", "gpu"}, {"time", "10"}, {"cpus", "2"}};
  l.sbatch_args = {"--qos=x"};
  l.kgate_path = "/opt/k gate/kgate";
  l.allow_override = {"time"};
  return l;
}

TEST(Launcher, SbatchArgv) {
  auto a = sbatch_argv(slurm_launcher(), "0123456789abcdef", "/s/spec's.json", "/s/log");
  EXPECT_EQ(a[0], "sbatch");
  EXPECT_TRUE(has(a, "--parsable"));
  EXPECT_TRUE(has(a, "--job-name=kgate-01234567"));
  EXPECT_TRUE(has(a, "--partition=gpu"));
  EXPECT_TRUE(has(a, "--time=10"));
  EXPECT_TRUE(has(a, "--cpus-per-task=2"));
  EXPECT_TRUE(has(a, "--output=/s/log"));
  EXPECT_TRUE(has(a, "--qos=x"));
  // The two paths are quoted for the batch shell, a quote in them too.
  EXPECT_EQ(a.back(), "--wrap=exec '/opt/k gate/kgate' node-launch '/s/spec'\\''s.json'");
}

TEST(Launcher, OverridesOnlyWhatIsAllowed) {
  auto l = with_overrides(slurm_launcher(), json{{"time", "30"}});
  EXPECT_EQ(l->slurm.at("time"), "30");
  EXPECT_EQ(l->slurm.at("partition"), "gpu");
  EXPECT_EQ(with_overrides(slurm_launcher(), json{{"time", 5}})->slurm.at("time"), "5");
  try {
    with_overrides(slurm_launcher(), json{{"partition", "cpu"}});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kgate_launcher_options.partition"), std::string::npos) << e.what();
  }
  EXPECT_THROW(with_overrides(slurm_launcher(), json{{"time", "1 --wrap=x"}}), std::invalid_argument);
  EXPECT_THROW(with_overrides(slurm_launcher(), json{{"time", ""}}), std::invalid_argument);
  EXPECT_THROW(with_overrides(slurm_launcher(), json{{"time", true}}), std::invalid_argument);
  EXPECT_THROW(with_overrides(slurm_launcher(), json::array()), std::invalid_argument);
}

TEST(Launcher, SshArgvNeverTurnsHostKeyCheckingOff) {
  LauncherConfig l;
  l.kind = LauncherConfig::Kind::ssh;
  l.host = "box";
  l.port = 2222;
  l.user = "me";
  l.identity_file = "/k/id";
  l.kgate_path = "/usr/bin/kgate";
  auto a = ssh_launch_argv(l);
  EXPECT_EQ(a[0], "ssh");
  EXPECT_TRUE(has(a, "BatchMode=yes"));
  EXPECT_TRUE(has(a, "2222"));
  EXPECT_TRUE(has(a, "/k/id"));
  for (const auto& x : a) EXPECT_EQ(x.find("StrictHostKeyChecking"), std::string::npos) << x;
  auto host = std::find(a.begin(), a.end(), "box");
  ASSERT_NE(host, a.end());
  EXPECT_EQ(*(host + 1), "--");
  EXPECT_EQ(*(host + 2), "'/usr/bin/kgate'");
  auto t = ssh_tunnel_argv(l, {1, 2}, {3, 4});
  EXPECT_TRUE(has(t, "-N"));
  EXPECT_TRUE(has(t, "ExitOnForwardFailure=yes"));
  EXPECT_TRUE(has(t, "127.0.0.1:1:127.0.0.1:3"));
  EXPECT_TRUE(has(t, "127.0.0.1:2:127.0.0.1:4"));
  EXPECT_EQ(t.back(), "box");
}

TEST(Launcher, TableCopyRoundTrips) {
  LauncherConfig l = slurm_launcher();
  auto back = launcher_from_json(launcher_to_json(l));
  EXPECT_EQ(back->name, l.name);
  EXPECT_EQ(back->slurm, l.slurm);
  EXPECT_EQ(back->sbatch_args, l.sbatch_args);
  EXPECT_EQ(back->kgate_path, l.kgate_path);
  EXPECT_THROW(launcher_from_json(json{{"name", "x"}}), std::runtime_error);
  EXPECT_THROW(launcher_from_json(json{{"name", "x"}, {"kind", "pbs"}}), std::runtime_error);
}

TEST(ControlLink, AnswerIsCheckedInFull) {
  const std::string a = control_link_answer("key", "kernel", "challenge");
  EXPECT_TRUE(control_link_check("key", "kernel", "challenge", a));
  EXPECT_FALSE(control_link_check("other", "kernel", "challenge", a));
  EXPECT_FALSE(control_link_check("key", "kernel2", "challenge", a));
  EXPECT_FALSE(control_link_check("key", "kernel", "challenge2", a));
  EXPECT_FALSE(control_link_check("key", "kernel", "challenge", a.substr(1)));
  EXPECT_FALSE(control_link_check("key", "kernel", "challenge", ""));
  EXPECT_FALSE(control_link_check("", "kernel", "challenge", control_link_answer("", "kernel", "challenge")));
}

}  // namespace
}  // namespace kgate
