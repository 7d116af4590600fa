// Unit tests for the remote launchers' pure parts (launcher.hpp, docs/dev/remote-launchers.md): the sbatch and
// ssh command lines, POST overrides, the kernel table's copy of a launcher, the control link's
// challenge answer.
#include "kgate/process/launcher.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <thread>

#include "kgate/process/process.hpp"
#include "kgate/process/supervisor.hpp"

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

// ---- the control link's handshake, both ways (issue 42, point 3) ----------------------------

// A node launcher of the test's on 127.0.0.1: sends `first`, then plays `script` with each line
// kgate sends (its reply, "" for none), and keeps every line kgate sent.
class FakeLauncher {
 public:
  using Script = std::function<std::string(const std::string& line)>;
  FakeLauncher(std::string first, Script script) : first_(std::move(first)), script_(std::move(script)) {
    lfd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(::bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(lfd_, 4), 0);
    ::getsockname(lfd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~FakeLauncher() {
    join();
    ::close(lfd_);
  }
  int port() const { return port_; }
  std::vector<std::string> heard;  // read after the thread ends (the destructor joins it)
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    const int c = ::accept(lfd_, nullptr, nullptr);
    if (c < 0) return;
    auto send_line = [c](const std::string& l) { std::string m = l + "\n"; ::send(c, m.data(), m.size(), MSG_NOSIGNAL); };
    send_line(first_);
    std::string in;
    char buf[512];
    for (;;) {
      ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      in.append(buf, std::size_t(n));
      for (auto nl = in.find('\n'); nl != std::string::npos; nl = in.find('\n')) {
        std::string line = in.substr(0, nl);
        in.erase(0, nl + 1);
        heard.push_back(line);
        std::string reply = script_(line);
        if (!reply.empty()) send_line(reply);
      }
    }
    ::close(c);
  }
  std::string first_;
  Script script_;
  int lfd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

const std::string kNodeChallenge = "00112233445566778899aabbccddeeff";

TEST(ControlLink, AFakeLauncherWithoutTheKeyHearsNoAnswer) {
  ChildProcess::SupervisorHello h;
  std::vector<std::string> heard;
  {
    FakeLauncher fake("challenge2 " + kNodeChallenge, [](const std::string& line) -> std::string {
      if (line.rfind("prove ", 0) == 0)  // it does not hold the key: it makes up a proof
        return "proof " + control_link_proof("guessed key", "k1", line.substr(6), kNodeChallenge);
      return "";
    });
    h = ChildProcess::connect_node("127.0.0.1", fake.port(), "the kernel's key", "k1", 3000);
    fake.join();
    heard = fake.heard;
  }
  EXPECT_EQ(h.fd, -1);
  EXPECT_NE(h.why.find("failed kgate's challenge"), std::string::npos) << h.why;
  ASSERT_EQ(heard.size(), 1u);  // kgate's challenge, and never its answer
  EXPECT_EQ(heard[0].rfind("prove ", 0), 0u) << heard[0];
  EXPECT_EQ(heard[0].size(), 6u + 32u) << heard[0];
}

TEST(ControlLink, ALauncherThatHoldsTheKeyIsAnswered) {
  ChildProcess::SupervisorHello h;
  std::vector<std::string> heard;
  {
    FakeLauncher fake("challenge2 " + kNodeChallenge, [](const std::string& line) -> std::string {
      if (line.rfind("prove ", 0) == 0)
        return "proof " + control_link_proof("the kernel's key", "k1", line.substr(6), kNodeChallenge);
      if (line.rfind("auth ", 0) == 0 && control_link_check("the kernel's key", "k1", kNodeChallenge, line.substr(5)))
        return "pid 4242 777";
      return "";
    });
    h = ChildProcess::connect_node("127.0.0.1", fake.port(), "the kernel's key", "k1", 3000);
    if (h.fd >= 0) ::close(h.fd);
    fake.join();
    heard = fake.heard;
  }
  EXPECT_EQ(h.pid, 4242) << h.why;
  EXPECT_EQ(h.start_time, 777u);
  ASSERT_EQ(heard.size(), 2u);
  EXPECT_EQ(heard[1].rfind("auth ", 0), 0u);
}

TEST(ControlLink, TheOneWayLinkOfAnOlderLauncherIsRefused) {
  ChildProcess::SupervisorHello h;
  std::vector<std::string> heard;
  {
    FakeLauncher fake("challenge " + kNodeChallenge, [](const std::string&) { return std::string(); });
    h = ChildProcess::connect_node("127.0.0.1", fake.port(), "the kernel's key", "k1", 3000);
    fake.join();
    heard = fake.heard;
  }
  EXPECT_EQ(h.fd, -1);
  EXPECT_NE(h.why.find("one-way control link of an older kgate"), std::string::npos) << h.why;
  EXPECT_TRUE(heard.empty()) << heard.front();
}

TEST(ControlLink, EachSidesAnswerIsNoProofOfTheOther) {
  // kgate's answer to a challenge c never passes for the launcher's proof, nor the reverse.
  const std::string a = control_link_answer("key", "k", "c");
  EXPECT_FALSE(control_link_proof_check("key", "k", "c", "", a));
  const std::string p = control_link_proof("key", "k", "c", "n");
  EXPECT_TRUE(control_link_proof_check("key", "k", "c", "n", p));
  EXPECT_FALSE(control_link_proof_check("key", "k", "n", "c", p));
  EXPECT_FALSE(control_link_check("key", "k", "c", p));
  EXPECT_FALSE(control_link_proof_check("", "k", "c", "n", control_link_proof("", "k", "c", "n")));
}

}  // namespace
}  // namespace kgate
