// Unit tests for the kernel runtime (KernelManager: the I/O loop, readiness, routing, the
// heartbeat, death and shutdown) against FakeKernel: a kernel's five sockets in a thread of the
// test, bound to the ports kgate chose, with a plain `sleep` as the kernel's process.
#include "kgate/kernel/kernel.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fake_kernel.hpp"
#include "support.hpp"

namespace kgate {
namespace {

using namespace std::chrono_literals;
using kgate::test::FakeKernel;
using kgate::test::TempDir;

// What the observers of a KernelManager see, for a test to wait on.
struct Recorder final : KernelObserver {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<KernelMessagePtr> msgs;
  std::vector<KernelLifecycle> lifecycle;
  int removed = 0;
  std::size_t passes_with_messages = 0;  // kgate-io's passes that handed on at least one message
  std::size_t seen_at_last_pass = 0;

  void on_kernel_message(const KernelPtr&, const KernelMessagePtr& m) override { add([&] { msgs.push_back(m); }); }
  void on_kernel_removed(const KernelPtr&) override { add([&] { ++removed; }); }
  void on_pass_end() override {
    add([&] {
      if (msgs.size() > seen_at_last_pass) ++passes_with_messages;
      seen_at_last_pass = msgs.size();
    });
  }
  void on_kernel_lifecycle(const KernelPtr&, KernelLifecycle l, const std::string&) override {
    add([&] { lifecycle.push_back(l); });
  }
  void add(const std::function<void()>& f) {
    {
      std::lock_guard<std::mutex> l(mu);
      f();
    }
    cv.notify_all();
  }
  // The messages that pass `pred`, once there are `n` of them (or what there is after `within`).
  std::vector<KernelMessagePtr> wait_for(const std::function<bool(const KernelMessage&)>& pred, std::size_t n = 1,
                                         std::chrono::milliseconds within = 10s) {
    std::unique_lock<std::mutex> l(mu);
    std::vector<KernelMessagePtr> out;
    cv.wait_for(l, within, [&] {
      out.clear();
      for (auto& m : msgs)
        if (pred(*m)) out.push_back(m);
      return out.size() >= n;
    });
    return out;
  }
  bool wait_until(const std::function<bool()>& cond, std::chrono::milliseconds within = 10s) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, within, cond);
  }
};

bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds within = 10s) {
  auto end = std::chrono::steady_clock::now() + within;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

class KernelRuntime : public ::testing::Test {
 protected:
  KernelRuntime() { make_manager([](KernelOptions&) {}); }
  void make_manager(const std::function<void(KernelOptions&)>& adjust) {
    mgr.reset();
    KernelOptions o;
    o.ready_timeout = 15s;
    o.shutdown_grace = 200ms;
    o.terminate_grace = 200ms;
    o.heartbeat_interval = 100ms;
    o.heartbeat_misses = 3;
    o.launch_attempts = 1;
    adjust(o);
    mgr = std::make_unique<KernelManager>(o, dir.path(), std::vector<KernelObserver*>{&rec});
  }
  ~KernelRuntime() override { mgr.reset(); }  // stops the kernel before the fake's sockets close

  KernelPtr start(const std::string& id = "fake-kernel-1") {
    fake = std::make_unique<FakeKernel>(dir.path() / ("kernel-" + id + ".json"));
    StartRequest r;
    r.id = id;
    r.spec.name = "fake";
    r.spec.language = "python";
    r.spec.argv = {"/bin/sleep", "600"};
    std::promise<StartResult> p;
    mgr->start(std::move(r), [&p](StartResult res) { p.set_value(std::move(res)); });
    auto f = p.get_future();
    if (f.wait_for(20s) != std::future_status::ready) return nullptr;
    StartResult res = f.get();
    EXPECT_EQ(res.error, "");
    return res.kernel;
  }

  // A client's execute_request on shell, as the gateway sends one; returns its msg_id.
  std::string execute(const KernelPtr& k, const std::string& code, const std::string& route) {
    json header = make_header("execute_request", "client-session");
    ClientMessage cm;
    cm.channel = Channel::shell;
    cm.msg_id = header["msg_id"].get<std::string>();
    cm.msg_type = "execute_request";
    cm.route = route;
    cm.session = "client-session";
    cm.wire.header = header.dump();
    cm.wire.parent_header = "{}";
    cm.wire.metadata = "{}";
    cm.wire.content = json{{"code", code}, {"silent", false}}.dump();
    mgr->send(k->id(), cm);
    return cm.msg_id;
  }

  TempDir dir{"kgate-kernel-test"};
  Recorder rec;
  std::unique_ptr<KernelManager> mgr;
  std::unique_ptr<FakeKernel> fake;
};

TEST_F(KernelRuntime, AKernelIsReadyOnceItsSocketsAnswer) {
  KernelPtr k = start();
  ASSERT_TRUE(k);
  EXPECT_EQ(k->execution_state(), "idle");
  EXPECT_TRUE(k->model().responsive);
  EXPECT_GT(k->pid(), 0);
  auto asked = fake->requests();
  ASSERT_FALSE(asked.empty());
  EXPECT_EQ(asked.front(), "kernel_info_request");
  // Not an ipykernel (implementation "fake"): kgate's kernel side is not installed in it.
  EXPECT_EQ(std::count(asked.begin(), asked.end(), "execute_request"), 0);
  EXPECT_EQ(mgr->count(), 1u);
}

TEST_F(KernelRuntime, AReplyGoesBackOnItsRequestsRouteAndIopubToEveryone) {
  KernelPtr k = start();
  ASSERT_TRUE(k);
  const std::string id = execute(k, "print(1)", "route-a");
  auto replies = rec.wait_for([&](const KernelMessage& m) { return m.msg_type == "execute_reply" && m.parent_msg_id == id; });
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0]->route, "route-a");
  EXPECT_EQ(replies[0]->channel, Channel::shell);
  EXPECT_FALSE(replies[0]->synthesized);
  auto streams = rec.wait_for([&](const KernelMessage& m) { return m.msg_type == "stream" && m.parent_msg_id == id; });
  ASSERT_EQ(streams.size(), 1u);
  EXPECT_EQ(streams[0]->route, "");  // iopub: for every client
  EXPECT_EQ(json::parse(streams[0]->wire.content).value("text", ""), "print(1)");
  // The reply and its output come in the order the kernel sent them: input, stream, reply, idle.
  auto idle = rec.wait_for([&](const KernelMessage& m) {
    return m.msg_type == "status" && m.parent_msg_id == id &&
           json::parse(m.wire.content).value("execution_state", "") == "idle";
  });
  ASSERT_EQ(idle.size(), 1u);
  EXPECT_EQ(k->execution_state(), "idle");
}

TEST_F(KernelRuntime, AKernelThatDiesAnswersWhatWasPendingOnceWithAnError) {
  KernelPtr k = start();
  ASSERT_TRUE(k);
  fake->answer_shell = false;
  const std::string id = execute(k, "while True: pass", "route-b");
  ASSERT_TRUE(eventually([&] {
    auto r = fake->requests();
    return std::count(r.begin(), r.end(), "execute_request") == 1;
  }));
  ASSERT_EQ(::kill(k->pid(), SIGKILL), 0);
  auto replies = rec.wait_for([&](const KernelMessage& m) { return m.msg_type == "execute_reply" && m.parent_msg_id == id; });
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0]->synthesized);
  EXPECT_EQ(replies[0]->route, "route-b");
  EXPECT_EQ(json::parse(replies[0]->wire.content).value("status", ""), "error");
  EXPECT_TRUE(rec.wait_until([&] {
    return std::find(rec.lifecycle.begin(), rec.lifecycle.end(), KernelLifecycle::died) != rec.lifecycle.end();
  }));
  EXPECT_EQ(k->execution_state(), "dead");
  EXPECT_FALSE(k->model().responsive);  // dead is not responsive, and not "silent" either
  EXPECT_EQ(k->model().silent_seconds, 0);
  // Exactly one reply: nothing more comes for it.
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(rec.wait_for([&](const KernelMessage& m) { return m.msg_type == "execute_reply" && m.parent_msg_id == id; }, 1, 0ms)
                .size(),
            1u);
  // A request to the dead kernel gets its one error reply too.
  const std::string late = execute(k, "1", "route-b");
  auto late_replies = rec.wait_for([&](const KernelMessage& m) { return m.msg_type == "execute_reply" && m.parent_msg_id == late; });
  ASSERT_EQ(late_replies.size(), 1u);
  EXPECT_TRUE(late_replies[0]->synthesized);
}

TEST_F(KernelRuntime, ASilentHeartbeatMakesItUnresponsiveAndAnEchoResponsiveAgain) {
  KernelPtr k = start();
  ASSERT_TRUE(k);
  fake->answer_heartbeat = false;
  ASSERT_TRUE(eventually([&] { return !k->model().responsive; }, 5s));
  EXPECT_GT(k->model().silent_seconds, 0.2);
  EXPECT_NE(k->execution_state(), "dead");  // a silent kernel is not a dead one: its process lives
  fake->answer_heartbeat = true;
  EXPECT_TRUE(eventually([&] { return k->model().responsive; }, 5s));
}

// A kernel streaming small outputs has its iopub read in batches (io_loop.cpp read_iopub), and
// batching loses, reorders and delays nothing it must not.  The batch window is 1.5 s here, so
// a message held by mistake would show as a delay of more than a second.
TEST_F(KernelRuntime, AStreamOfSmallOutputsGoesOnInBatchesInOrderAndAheadOfItsReply) {
  make_manager([](KernelOptions& o) { o.iopub_batch = 1500ms; });
  KernelPtr k = start();
  ASSERT_TRUE(k);
  const std::size_t passes_before = [&] {
    std::lock_guard<std::mutex> l(rec.mu);
    return rec.passes_with_messages;
  }();
  auto t0 = std::chrono::steady_clock::now();
  const std::string id = execute(k, "stream 200", "route-a");
  auto replies = rec.wait_for([&](const KernelMessage& m) { return m.msg_type == "execute_reply" && m.parent_msg_id == id; });
  ASSERT_EQ(replies.size(), 1u);
  // The reply flushed what was held: it did not wait out the window.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1000ms);
  {
    std::lock_guard<std::mutex> l(rec.mu);
    std::vector<std::string> texts;
    std::size_t reply_at = 0;
    for (std::size_t i = 0; i < rec.msgs.size(); ++i) {
      const KernelMessage& m = *rec.msgs[i];
      if (m.parent_msg_id != id) continue;
      if (m.msg_type == "stream") texts.push_back(json::parse(m.wire.content).value("text", ""));
      if (m.msg_type == "execute_reply") reply_at = texts.size();
    }
    ASSERT_EQ(texts.size(), 200u);  // every output, each once, in the kernel's order
    for (int j = 0; j < 200; ++j) EXPECT_EQ(texts[j], std::to_string(j) + "\n");
    EXPECT_EQ(reply_at, 200u);  // and all of them ahead of the reply
    // Batched: 200 outputs were handed on in far fewer passes than one each.
    EXPECT_LT(rec.passes_with_messages - passes_before, 100u);
  }
  // The reply ended the stream: the idle after it, and a lone request's output, are not held.
  auto idle = rec.wait_for([&](const KernelMessage& m) {
    return m.msg_type == "status" && m.parent_msg_id == id &&
           json::parse(m.wire.content).value("execution_state", "") == "idle";
  }, 1, 1000ms);
  EXPECT_EQ(idle.size(), 1u);
  t0 = std::chrono::steady_clock::now();
  const std::string lone = execute(k, "x", "route-a");
  auto out = rec.wait_for([&](const KernelMessage& m) {
    return m.parent_msg_id == lone && m.msg_type == "status" && json::parse(m.wire.content).value("execution_state", "") == "idle";
  }, 1, 1000ms);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1000ms);
}

TEST_F(KernelRuntime, AShutdownAsksTheKernelThenRemovesIt) {
  KernelPtr k = start();
  ASSERT_TRUE(k);
  const int pid = k->pid();
  std::promise<bool> p;
  mgr->shutdown(k->id(), [&p](bool ok) { p.set_value(ok); });
  auto f = p.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(f.get());
  auto asked = fake->requests();
  EXPECT_NE(std::find(asked.begin(), asked.end(), "shutdown_request"), asked.end());
  EXPECT_TRUE(rec.wait_until([&] { return rec.removed == 1; }));
  EXPECT_EQ(mgr->get(k->id()), nullptr);
  EXPECT_EQ(mgr->count(), 0u);
  EXPECT_TRUE(eventually([&] { return ::kill(pid, 0) != 0; }));  // the sleep was stopped: it never exits by itself
  std::promise<bool> again;
  mgr->shutdown(k->id(), [&again](bool ok) { again.set_value(ok); });
  EXPECT_FALSE(again.get_future().get());  // no such kernel any more
}

}  // namespace
}  // namespace kgate
