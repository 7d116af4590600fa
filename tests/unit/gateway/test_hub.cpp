// Unit tests for the hub (ws/hub.hpp) without a socket or a kernel process: in-memory websocket
// clients (FakeClient, the WsClient interface), kernels as plain Kernel objects, and messages
// posted as the kernel I/O thread posts them, run on an io_context the test drives.
#include "ws/hub.hpp"

#include <gtest/gtest.h>

#include <regex>

#include "options.hpp"

namespace kgate::gw {
namespace {

// A websocket connection that keeps what it is given.
struct FakeClient final : WsClient {
  std::vector<OutPtr> got;
  std::deque<OutPtr> unsent;  // handed back by replace(), as a connection with a queue would
  std::vector<std::string> gone;
  bool replaced = false;

  void deliver(const OutPtr& m) override { got.push_back(m); }
  Unsent replace() override {
    replaced = true;
    Unsent u;
    u.msgs = std::move(unsent);
    return u;
  }
  void kernel_gone(const std::string& why) override { gone.push_back(why); }
};

class HubTest : public ::testing::Test {
 protected:
  HubTest() { kernel->set_state("idle"); }

  // One message from the kernel: `route` "" is iopub (for everyone), else the reply to a client.
  void from_kernel(const std::string& text, const std::string& route = "") {
    auto m = std::make_shared<KernelMessage>(synthesize_message(
        route.empty() ? Channel::iopub : Channel::shell, route.empty() ? "stream" : "execute_reply", "kernel", "{}",
        json{{"name", "stdout"}, {"text", text}}));
    m->route = route;
    hub.on_kernel_message(kernel, m);
    hub.on_pass_end();  // posts the inbox onto the Asio thread, as the kernel's I/O thread does
    ioc.poll();
    ioc.restart();
  }
  static std::string text_of(const OutPtr& m) { return json::parse(m->msg().wire.content).value("text", ""); }
  static std::vector<std::string> texts(const std::vector<OutPtr>& v) {
    std::vector<std::string> out;
    for (auto& m : v) out.push_back(text_of(m));
    return out;
  }
  static std::vector<std::string> texts(const std::deque<OutPtr>& v) { return texts(std::vector<OutPtr>(v.begin(), v.end())); }

  net::io_context ioc;
  GatewayOptions opts;
  Hub hub{ioc, opts};
  KernelPtr kernel = std::make_shared<Kernel>("k1", KernelSpec{});
};

TEST_F(HubTest, IopubGoesToEveryClientAndAReplyOnlyToItsRoute) {
  auto a = std::make_shared<FakeClient>(), b = std::make_shared<FakeClient>();
  EXPECT_EQ(hub.attach(kernel, a, "sa").route, "sa");
  EXPECT_EQ(hub.attach(kernel, b, "sb").route, "sb");
  EXPECT_EQ(hub.connections(), 2);
  EXPECT_EQ(kernel->connections(), 2);
  from_kernel("everyone");
  from_kernel("for a", "sa");
  from_kernel("for b", "sb");
  from_kernel("for a client that never was", "nobody");
  EXPECT_EQ(texts(a->got), (std::vector<std::string>{"everyone", "for a"}));
  EXPECT_EQ(texts(b->got), (std::vector<std::string>{"everyone", "for b"}));
  // One message, encoded once: both clients hold the same OutMsg.
  EXPECT_EQ(a->got[0], b->got[0]);
}

TEST_F(HubTest, ADetachedSessionGetsWhatItMissedInOrderExactlyOnce) {
  auto a = std::make_shared<FakeClient>();
  auto route = hub.attach(kernel, a, "s").route;
  from_kernel("1");
  Unsent unsent;  // the connection had "2" queued, not written, when it closed
  auto two = std::make_shared<OutMsg>(std::make_shared<KernelMessage>(synthesize_message(
                                          Channel::iopub, "stream", "kernel", "{}", json{{"text", "2"}})),
                                      100);
  unsent.msgs.push_back(two);
  hub.detach(kernel, a.get(), route, std::move(unsent));
  EXPECT_EQ(hub.connections(), 0);
  from_kernel("3");
  from_kernel("4", "s");  // a reply to the session's request, while it is away
  auto again = std::make_shared<FakeClient>();
  auto att = hub.attach(kernel, again, "s");
  EXPECT_EQ(texts(att.replay), (std::vector<std::string>{"2", "3", "4"}));
  EXPECT_EQ(hub.counters().replayed, 3u);
  from_kernel("5");
  EXPECT_EQ(texts(again->got), std::vector<std::string>{"5"});
  // The replay was handed over once: a third connection of the session gets none of it.
  hub.detach(kernel, again.get(), "s", {});
  EXPECT_TRUE(hub.attach(kernel, std::make_shared<FakeClient>(), "s").replay.empty());
}

TEST_F(HubTest, PastTheReplayCapTheOldestGoAndOneNoticeSaysHowManyThenTheStateNow) {
  opts.replay_messages = 5;
  auto a = std::make_shared<FakeClient>();
  hub.attach(kernel, a, "s");
  hub.detach(kernel, a.get(), "s", {});
  for (int i = 0; i < 12; ++i) from_kernel("m" + std::to_string(i));
  kernel->set_state("busy");
  auto att = hub.attach(kernel, std::make_shared<FakeClient>(), "s");
  auto got = texts(att.replay);
  ASSERT_EQ(got.size(), 7u);  // the newest 5, the notice, the status
  EXPECT_EQ(std::vector<std::string>(got.begin(), got.begin() + 5),
            (std::vector<std::string>{"m7", "m8", "m9", "m10", "m11"}));
  EXPECT_TRUE(std::regex_search(got[5], std::regex(R"(^\[kgate\] 7 message\(s\) \(\d+ bytes\) .*dropped: the replay buffer limit was reached\. Current kernel state: busy\.)")))
      << got[5];
  EXPECT_EQ(att.replay[5]->msg().channel, Channel::iopub);
  EXPECT_EQ(att.replay[6]->msg().msg_type, "status");
  EXPECT_EQ(json::parse(att.replay[6]->msg().wire.content).value("execution_state", ""), "busy");
  EXPECT_EQ(hub.counters().dropped, 7u);
}

TEST_F(HubTest, AReconnectingSessionTakesOverAndGetsTheOldConnectionsUnsentFirst) {
  auto old = std::make_shared<FakeClient>();
  hub.attach(kernel, old, "s");
  old->unsent.push_back(std::make_shared<OutMsg>(
      std::make_shared<KernelMessage>(synthesize_message(Channel::iopub, "stream", "kernel", "{}", json{{"text", "queued"}})),
      7));
  auto now = std::make_shared<FakeClient>();
  auto att = hub.attach(kernel, now, "s");
  EXPECT_TRUE(old->replaced);
  EXPECT_EQ(texts(att.replay), std::vector<std::string>{"queued"});
  from_kernel("after");
  EXPECT_TRUE(old->got.empty());
  EXPECT_EQ(texts(now->got), std::vector<std::string>{"after"});
  // The old connection's late detach does not take the new one's place.
  hub.detach(kernel, old.get(), "s", {});
  from_kernel("still");
  EXPECT_EQ(texts(now->got), (std::vector<std::string>{"after", "still"}));
}

TEST_F(HubTest, ASessionlessClientAdoptsTheLastSessionlessOnesReplay) {
  auto relay = std::make_shared<FakeClient>();
  auto route = hub.attach(kernel, relay, "").route;
  EXPECT_EQ(route.rfind("anon-", 0), 0u);
  hub.detach(kernel, relay.get(), route, {});
  from_kernel("while away");
  auto next = hub.attach(kernel, std::make_shared<FakeClient>(), "");
  EXPECT_EQ(next.route, route);
  EXPECT_EQ(texts(next.replay), std::vector<std::string>{"while away"});
  // A second sessionless client at the same time gets a route of its own.
  EXPECT_NE(hub.attach(kernel, std::make_shared<FakeClient>(), "").route, route);
}

TEST_F(HubTest, DetachedSessionsPerKernelAreBoundedOldestFirst) {
  opts.max_detached_sessions = 2;
  for (const char* s : {"s1", "s2", "s3"}) {
    auto c = std::make_shared<FakeClient>();
    hub.attach(kernel, c, s);
    hub.detach(kernel, c.get(), s, {});
  }
  from_kernel("x");
  EXPECT_TRUE(hub.attach(kernel, std::make_shared<FakeClient>(), "s1").replay.empty());  // forgotten
  EXPECT_EQ(texts(hub.attach(kernel, std::make_shared<FakeClient>(), "s3").replay), std::vector<std::string>{"x"});
}

TEST_F(HubTest, AKernelThatGoesAwayClosesItsClientsAndForgetsItsReplays) {
  auto a = std::make_shared<FakeClient>(), gone = std::make_shared<FakeClient>();
  hub.attach(kernel, a, "a");
  hub.attach(kernel, gone, "g");
  hub.detach(kernel, gone.get(), "g", {});
  from_kernel("kept for g");
  hub.on_kernel_removed(kernel);
  hub.on_pass_end();
  ioc.poll();
  ioc.restart();
  ASSERT_EQ(a->gone.size(), 1u);
  EXPECT_NE(a->gone[0].find("k1 was shut down"), std::string::npos);
  from_kernel("late");  // a message after the removal reaches nobody
  EXPECT_EQ(texts(a->got), std::vector<std::string>{"kept for g"});
}

TEST_F(HubTest, NothingPostedAfterTheHubIsGoneRuns) {
  auto io = std::make_unique<net::io_context>();
  auto h = std::make_unique<Hub>(*io, opts);
  auto a = std::make_shared<FakeClient>();
  h->attach(kernel, a, "s");
  h->on_kernel_message(kernel, std::make_shared<KernelMessage>(synthesize_message(
                                   Channel::iopub, "stream", "kernel", "{}", json{{"text", "late"}})));
  h->on_pass_end();
  h.reset();  // kgate stopping: the kernel thread's last post is still queued
  io->poll();
  EXPECT_TRUE(a->got.empty());
}

}  // namespace
}  // namespace kgate::gw
