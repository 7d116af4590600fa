// Unit tests for the job records (JobStore): lifecycle from protocol messages, repair of lost
// messages, the agent path (no queue, claims, stops), the digest, eviction and rendering.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <thread>
#include <tuple>

#include "kgate/records/jobs.hpp"
#include "kgate/jupyter/utf8.hpp"

using namespace kgate;
using namespace std::chrono_literals;

namespace {

KernelPtr make_kernel(const std::string& id = "k1") {
  KernelSpec spec;
  spec.name = "python3";
  spec.display_name = "Python 3";
  spec.language = "python";
  return std::make_shared<Kernel>(id, spec);
}

// A message from the kernel with `parent` as its parent msg_id and `session` in its parent header.
KernelMessagePtr kmsg(Channel ch, const std::string& type, const std::string& parent, const json& content,
                      const std::string& session = "someone-else") {
  json ph = parent.empty() ? json::object() : json{{"msg_id", parent}, {"session", session}};
  auto m = synthesize_message(ch, type, "kernel-session", ph.dump(), content);
  m.synthesized = false;
  return std::make_shared<const KernelMessage>(std::move(m));
}

struct Fixture {
  RecordLimits limits;
  std::unique_ptr<JobStore> store;
  KernelPtr kernel = make_kernel();
  std::vector<ClientMessage> sent;

  explicit Fixture(RecordLimits l = {}) : limits(l), store(std::make_unique<JobStore>(l)) {}

  void iopub(const std::string& type, const std::string& parent, const json& content,
             const std::string& session = "someone-else") {
    store->on_kernel_message(kernel, kmsg(Channel::iopub, type, parent, content, session));
  }
  void reply(const std::string& parent, const json& content) {
    store->on_kernel_message(kernel, kmsg(Channel::shell, "execute_reply", parent, content));
  }
  // A foreign cell seen only on iopub (a client attached by connection file).
  void foreign_begin(const std::string& req, const std::string& code) {
    iopub("status", req, {{"execution_state", "busy"}});
    iopub("execute_input", req, {{"code", code}, {"execution_count", 1}});
  }
  void idle(const std::string& req) { iopub("status", req, {{"execution_state", "idle"}}); }

  Outcome submit(const std::string& agent, const std::string& code, const std::string& label = "") {
    return store->submit(kernel->id(), AgentRef{agent, label}, code, JobOrigin::mcp,
                         [this](ClientMessage m) { sent.push_back(std::move(m)); });
  }
  std::string last_request() const { return sent.back().msg_id; }
  Job job(const std::string& id) const {
    auto j = store->job(id);
    EXPECT_TRUE(j.has_value()) << id;
    return j ? *j : Job{};
  }
};

}  // namespace

TEST(JobStore, AgentCellLifecycle) {
  Fixture f;
  auto out = f.submit("a", "print(1)\n1+1");
  ASSERT_TRUE(out) << out.message;
  EXPECT_EQ(out.job, "job-1");
  ASSERT_EQ(f.sent.size(), 1u);
  const auto& m = f.sent[0];
  EXPECT_EQ(m.msg_type, "execute_request");
  EXPECT_EQ(m.route, kAgentRoute);
  json content = json::parse(m.wire.content);
  EXPECT_EQ(content["stop_on_error"], false);
  EXPECT_EQ(content["allow_stdin"], false);
  EXPECT_EQ(json::parse(m.wire.header)["session"], f.store->session());

  Job j = f.job("job-1");
  EXPECT_EQ(j.status, JobStatus::running);
  EXPECT_FALSE(j.began);  // sent, not yet begun
  EXPECT_TRUE(j.seen_by_agent);

  std::string req = f.last_request();
  f.iopub("status", req, {{"execution_state", "busy"}}, f.store->session());
  f.iopub("execute_input", req, {{"code", "print(1)\n1+1"}, {"execution_count", 4}}, f.store->session());
  EXPECT_TRUE(f.job("job-1").began);
  f.iopub("stream", req, {{"name", "stdout"}, {"text", "1\n"}}, f.store->session());
  f.iopub("display_data", req, {{"data", {{"text/plain", "<Figure>"}}}}, f.store->session());
  f.iopub("execute_result", req, {{"data", {{"text/plain", "2"}}}, {"execution_count", 4}}, f.store->session());
  f.iopub("status", req, {{"execution_state", "idle"}}, f.store->session());
  j = f.job("job-1");
  EXPECT_EQ(j.status, JobStatus::ok);
  EXPECT_EQ(j.output.text(), "1\n");
  EXPECT_EQ(j.result.text(), "2");  // display_data is not recorded
  EXPECT_EQ(j.execution_count, 4);
  EXPECT_FALSE(j.ended_at.empty());
}

TEST(JobStore, ForeignCellsAndDigest) {
  Fixture f;
  f.foreign_begin("u1", "x = 1");
  f.iopub("stream", "u1", {{"name", "stderr"}, {"text", "warn\n"}});
  Job j = f.job("job-1");
  EXPECT_EQ(j.origin, JobOrigin::user);
  EXPECT_TRUE(j.began);
  EXPECT_FALSE(j.seen_by_agent);

  // Empty code (qtconsole's prompt-number request) is never a cell.
  f.iopub("execute_input", "u2", {{"code", ""}, {"execution_count", 2}});
  EXPECT_FALSE(f.store->job("job-2"));

  auto d = f.store->digest(f.kernel->id());
  ASSERT_EQ(d.jobs.size(), 1u);
  EXPECT_EQ(d.jobs[0].job, "job-1");
  EXPECT_EQ(d.jobs[0].status, JobStatus::running);

  // A running job is kept, not retired; reading never consumes.
  auto ack = f.store->ack(f.kernel->id(), AgentRef{"a", ""}, {"job-1"});
  EXPECT_TRUE(ack.acked.empty());
  ASSERT_EQ(ack.kept.size(), 1u);
  EXPECT_EQ(f.store->digest(f.kernel->id()).jobs.size(), 1u);

  f.idle("u1");
  EXPECT_EQ(f.job("job-1").status, JobStatus::ok);
  EXPECT_EQ(f.job("job-1").output.text(), "warn\n");
  ack = f.store->ack(f.kernel->id(), AgentRef{"a", ""}, {"job-1", "job-99"});
  EXPECT_EQ(ack.acked, std::vector<std::string>{"job-1"});
  ASSERT_EQ(ack.kept.size(), 1u);
  EXPECT_EQ(ack.kept[0].first, "job-99");
  EXPECT_TRUE(f.store->digest(f.kernel->id()).jobs.empty());
}

TEST(JobStore, OwnSessionWithoutRecordIsNotForeign) {
  Fixture f;
  f.iopub("execute_input", "x", {{"code", "1"}}, f.store->session());
  EXPECT_FALSE(f.store->job("job-1"));
}

TEST(JobStore, ErrorsAndInterrupts) {
  Fixture f;
  f.foreign_begin("u1", "1/0");
  f.iopub("error", "u1", {{"ename", "ZeroDivisionError"}, {"evalue", "division by zero"},
                          {"traceback", {"\x1b[31mZeroDivisionError\x1b[0m: division by zero"}}});
  f.idle("u1");
  Job j = f.job("job-1");
  EXPECT_EQ(j.status, JobStatus::error);
  EXPECT_EQ(j.ename, "ZeroDivisionError");
  ASSERT_EQ(j.traceback.size(), 1u);
  EXPECT_EQ(j.traceback[0], "ZeroDivisionError: division by zero");  // ANSI stripped

  f.foreign_begin("u2", "while True: pass");
  f.iopub("error", "u2", {{"ename", "KeyboardInterrupt"}, {"evalue", ""}, {"traceback", json::array()}});
  f.idle("u2");
  EXPECT_EQ(f.job("job-2").status, JobStatus::interrupted);
}

TEST(JobStore, LostIdleIsRepairedByTheNextCell) {
  Fixture f;
  f.foreign_begin("u1", "a = 1");
  // u1's idle is lost; u2 begins and ends.
  f.foreign_begin("u2", "b = 2");
  EXPECT_EQ(f.job("job-1").status, JobStatus::end_not_recorded);
  EXPECT_FALSE(f.job("job-1").note.empty());
  EXPECT_EQ(f.job("job-2").status, JobStatus::running);
  f.idle("u2");
  EXPECT_EQ(f.job("job-2").status, JobStatus::ok);
}

TEST(JobStore, ReplyBacksUpALostIdle) {
  RecordLimits l;
  l.reply_grace = 0ms;
  Fixture f(l);
  ASSERT_TRUE(f.submit("a", "1"));
  std::string req = f.last_request();
  f.iopub("execute_input", req, {{"code", "1"}}, f.store->session());
  f.reply(req, {{"status", "error"}, {"ename", "ValueError"}, {"evalue", "bad"}});
  f.store->sweep();
  Job j = f.job("job-1");
  EXPECT_EQ(j.status, JobStatus::error);  // the lost iopub error is recovered from the reply
  EXPECT_EQ(j.ename, "ValueError");
}

TEST(JobStore, TheReplyGraceNeverEndsATask) {
  // A task's starting cell is answered at once; the task runs on until its task_end.
  RecordLimits l;
  l.reply_grace = 0ms;
  Fixture f(l);
  ASSERT_TRUE(f.submit("a", "for i in range(40): ..."));
  const std::string req = f.last_request();
  f.iopub("status", req, {{"execution_state", "busy"}}, f.store->session());
  f.store->on_kernel_side_event(f.kernel, {{"event", "task_start"}, {"request", req}});
  f.reply(req, {{"status", "ok"}});
  f.iopub("status", req, {{"execution_state", "idle"}}, f.store->session());
  f.store->sweep();
  EXPECT_EQ(f.job("job-1").status, JobStatus::running);
  f.store->on_kernel_side_event(f.kernel, {{"event", "task_end"}, {"request", req}, {"status", "ok"}});
  EXPECT_EQ(f.job("job-1").status, JobStatus::ok);
}

TEST(JobStore, ReplyGraceWaitsForTheIdle) {
  Fixture f;  // reply_grace 5 s
  ASSERT_TRUE(f.submit("a", "print('x')"));
  std::string req = f.last_request();
  f.iopub("execute_input", req, {{"code", "print('x')"}}, f.store->session());
  f.reply(req, {{"status", "ok"}});
  f.store->sweep();
  EXPECT_EQ(f.job("job-1").status, JobStatus::running);  // output may still come on iopub
  f.iopub("stream", req, {{"name", "stdout"}, {"text", "x\n"}}, f.store->session());
  f.iopub("status", req, {{"execution_state", "idle"}}, f.store->session());
  EXPECT_EQ(f.job("job-1").status, JobStatus::ok);
  EXPECT_EQ(f.job("job-1").output.text(), "x\n");
}

TEST(JobStore, AbortedAndRefusedRequests) {
  Fixture f;
  ASSERT_TRUE(f.submit("a", "1"));
  f.reply(f.last_request(), {{"status", "aborted"}});
  EXPECT_EQ(f.job("job-1").status, JobStatus::aborted);

  ASSERT_TRUE(f.submit("a", "2"));
  json ph = {{"msg_id", f.last_request()}};
  auto m = synthesize_message(Channel::shell, "execute_reply", "kgate", ph.dump(),
                              {{"status", "error"}, {"ename", "KernelDied"}, {"evalue", "kgate: the kernel died"}});
  f.store->on_kernel_message(f.kernel, std::make_shared<const KernelMessage>(std::move(m)));
  EXPECT_EQ(f.job("job-2").status, JobStatus::kernel_lost);
}

TEST(JobStore, DeathAndRestart) {
  Fixture f;
  f.foreign_begin("u1", "import time; time.sleep(60)");
  f.store->on_kernel_lifecycle(f.kernel, KernelLifecycle::died, "the kernel was killed by signal SIGKILL");
  Job j = f.job("job-1");
  EXPECT_EQ(j.status, JobStatus::kernel_lost);
  EXPECT_NE(j.note.find("SIGKILL"), std::string::npos);

  f.foreign_begin("u2", "x = 1");
  f.store->on_kernel_lifecycle(f.kernel, KernelLifecycle::restarting, "the kernel was restarted");
  EXPECT_EQ(f.job("job-2").status, JobStatus::kernel_lost);
  auto marks = f.store->restarts(f.kernel->id());
  ASSERT_EQ(marks.size(), 1u);
  EXPECT_EQ(marks[0].after_job, 2u);
  f.foreign_begin("u3", "y = 2");
  EXPECT_EQ(f.job("job-3").generation, 1u);  // ids keep counting, records survive
  EXPECT_TRUE(f.store->job("job-1"));
  EXPECT_EQ(f.store->kernel_info(f.kernel->id()).restarts, 1u);
}

// Idle culling (KernelLifecycle::culled): a running job ends `culled`, the newest finished one
// gets a note, other kernels' jobs are untouched, and the removal that follows changes nothing.
TEST(JobStore, Culled) {
  Fixture f;
  const std::string why = "culled after 3 s idle (cull_idle_timeout = 2 s)";
  f.foreign_begin("u1", "x = 1");
  f.idle("u1");
  ASSERT_EQ(f.job("job-1").status, JobStatus::ok);
  auto other = make_kernel("k2");
  f.store->on_kernel_message(other, kmsg(Channel::iopub, "execute_input", "o1", {{"code", "y = 2"}}));
  f.store->on_kernel_lifecycle(f.kernel, KernelLifecycle::culled, why);
  Job j = f.job("job-1");
  EXPECT_EQ(j.status, JobStatus::ok);  // it ended ok before the cull
  EXPECT_EQ(j.note, "The kernel was " + why + " after this job.");
  EXPECT_EQ(f.job("job-2").status, JobStatus::running);  // another kernel's

  Fixture busy;  // cull_busy: the cell that runs is culled
  busy.foreign_begin("u1", "x = 1");
  busy.idle("u1");
  busy.foreign_begin("u2", "import time; time.sleep(60)");
  busy.store->on_kernel_lifecycle(busy.kernel, KernelLifecycle::culled, why);
  busy.store->on_kernel_removed(busy.kernel);
  Job run = busy.job("job-2");
  EXPECT_EQ(run.status, JobStatus::culled);
  EXPECT_EQ(status_name(run.status), "culled");
  EXPECT_EQ(run.note, "The kernel was " + why + " while this job ran.");
  EXPECT_FALSE(run.ended_at.empty());
  EXPECT_EQ(busy.job("job-1").note, "The kernel was " + why + " after this job.");
  EXPECT_EQ(job_json(run, false, std::chrono::steady_clock::now())["status"], "culled");
  Digest d = busy.store->digest(busy.kernel->id());
  ASSERT_EQ(d.jobs.size(), 2u);  // foreign jobs: the digest tells the agent
  EXPECT_EQ(d.jobs[1].status, JobStatus::culled);
}

TEST(JobStore, TheAgentDoesNotQueue) {
  Fixture f;
  f.foreign_begin("u1", "import time; time.sleep(5)");
  auto out = f.submit("a", "1");
  EXPECT_EQ(out.refusal, Refusal::busy);
  EXPECT_EQ(out.running_job, "job-1");
  EXPECT_NE(out.message.find("user"), std::string::npos);
  EXPECT_TRUE(f.sent.empty());
  f.idle("u1");
  EXPECT_TRUE(f.submit("a", "1"));

  // A websocket client's execute_request still awaiting its reply counts as running.
  f.iopub("status", f.last_request(), {{"execution_state", "idle"}}, f.store->session());
  ClientMessage cm;
  cm.channel = Channel::shell;
  cm.msg_type = "execute_request";
  cm.msg_id = "ws-1";
  cm.route = "client-1";
  cm.wire.content = json{{"code", "x = 1"}}.dump();
  f.store->on_client_message(f.kernel, cm);
  EXPECT_EQ(f.submit("a", "2").refusal, Refusal::busy);
  f.reply("ws-1", {{"status", "ok"}});
  EXPECT_TRUE(f.submit("a", "2"));
  // The agent's own running cell: refused, and the message says it is its own.
  out = f.submit("a", "3");
  EXPECT_EQ(out.refusal, Refusal::busy);
  EXPECT_NE(out.message.find("yours"), std::string::npos);
}

TEST(JobStore, ClaimsHoldWhileTheAgentIsAlive) {
  RecordLimits l;
  l.claim_grace = 100ms;
  Fixture f(l);
  f.store->agent_connected(AgentRef{"a", "Claude A"});
  ASSERT_TRUE(f.submit("a", "1"));
  f.idle(f.last_request());
  auto out = f.submit("b", "2", "Claude B");
  EXPECT_EQ(out.refusal, Refusal::claimed);
  ASSERT_TRUE(out.holder);
  EXPECT_EQ(out.holder->label, "Claude A");
  EXPECT_NE(out.message.find("Claude A"), std::string::npos);

  // An abnormal drop keeps the claim for the grace period.
  f.store->agent_disconnected("a", /*clean=*/false);
  EXPECT_EQ(f.submit("b", "2").refusal, Refusal::claimed);
  std::this_thread::sleep_for(150ms);
  ASSERT_TRUE(f.submit("b", "2"));  // a is gone: b resumes the kernel
  EXPECT_EQ(f.store->kernel_info(f.kernel->id()).claim->agent, "b");
  f.idle(f.last_request());

  // A clean close frees it at once.
  f.store->agent_connected(AgentRef{"b", ""});
  EXPECT_EQ(f.submit("c", "3").refusal, Refusal::claimed);
  f.store->agent_disconnected("b", /*clean=*/true);
  EXPECT_TRUE(f.submit("c", "3"));
}

TEST(JobStore, AnAgentIsGoneOnceItsClaimWouldLapse) {
  RecordLimits l;
  l.claim_grace = 100ms;
  Fixture f(l);
  EXPECT_FALSE(f.store->agent_gone("never-seen"));  // nothing to go by: never taken for gone
  f.store->agent_connected(AgentRef{"a", "Claude A"});
  EXPECT_FALSE(f.store->agent_gone("a"));
  f.store->agent_disconnected("a", /*clean=*/false);
  EXPECT_FALSE(f.store->agent_gone("a"));  // it may come back within the grace
  std::this_thread::sleep_for(150ms);
  auto gone = f.store->agent_gone("a");
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->label, "Claude A");
  EXPECT_GE(gone->for_.count(), 40);
  f.store->agent_connected(AgentRef{"a", ""});  // it came back after all
  EXPECT_FALSE(f.store->agent_gone("a"));
  f.store->agent_disconnected("a", /*clean=*/true);  // an exit is gone at once
  EXPECT_TRUE(f.store->agent_gone("a"));
}

TEST(JobStore, HumansAreNeverGated) {
  Fixture f;
  f.store->agent_connected(AgentRef{"a", ""});
  ASSERT_TRUE(f.submit("a", "1"));
  f.idle(f.last_request());
  f.foreign_begin("u1", "x = 1");  // recorded whatever the claim
  EXPECT_EQ(f.job("job-2").origin, JobOrigin::user);
}

TEST(JobStore, StopNamesItsJob) {
  Fixture f;
  f.store->agent_connected(AgentRef{"a", ""});
  int signals = 0;
  auto sig = [&](const std::string&) { ++signals; return true; };
  ASSERT_TRUE(f.submit("a", "1"));
  std::string r1 = f.last_request();
  // Not begun yet (queued in the kernel): a stop would hit another cell.
  EXPECT_EQ(f.store->interrupt("job-1", nullptr, sig).refusal, Refusal::not_begun);
  f.iopub("execute_input", r1, {{"code", "1"}}, f.store->session());
  f.idle(r1);
  f.foreign_begin("u1", "import time; time.sleep(60)");

  AgentRef a{"a", ""};
  auto out = f.store->interrupt("job-1", &a, sig);
  EXPECT_EQ(out.refusal, Refusal::not_running);
  EXPECT_EQ(out.running_job, "job-2");
  EXPECT_NE(out.message.find("job-2"), std::string::npos);
  EXPECT_EQ(f.store->interrupt("job-2", &a, sig).refusal, Refusal::foreign_job);
  AgentRef b{"b", ""};
  EXPECT_EQ(f.store->interrupt("job-2", &b, sig).refusal, Refusal::not_owner);
  EXPECT_EQ(f.store->interrupt("job-77", nullptr, sig).refusal, Refusal::no_such_job);
  EXPECT_EQ(signals, 0);
  // The person at the machine may stop anything.
  EXPECT_TRUE(f.store->interrupt("job-2", nullptr, sig));
  EXPECT_EQ(signals, 1);
  f.iopub("error", "u1", {{"ename", "KeyboardInterrupt"}, {"evalue", ""}});
  f.idle("u1");
  Job j = f.job("job-2");
  EXPECT_EQ(j.status, JobStatus::interrupted);
  EXPECT_NE(j.note.find("person"), std::string::npos);

  // An agent stops its own job; the signal runs under the store's lock.
  ASSERT_TRUE(f.submit("a", "import time; time.sleep(60)"));
  f.iopub("execute_input", f.last_request(), {{"code", "x"}}, f.store->session());
  EXPECT_TRUE(f.store->interrupt("job-3", &a, [&](const std::string& request) {
    EXPECT_TRUE(f.store->limits().enabled);  // the lock is not re-entered here
    EXPECT_EQ(request, f.last_request());    // what the kernel side's stop names
    return true;
  }));
  EXPECT_EQ(f.store->job_for_request(f.last_request()), "job-3");
  EXPECT_EQ(f.store->job_for_request("nope"), "");
}

TEST(JobStore, RestartGate) {
  Fixture f;
  f.store->agent_connected(AgentRef{"a", ""});
  ASSERT_TRUE(f.submit("a", "1"));
  f.idle(f.last_request());
  AgentRef b{"b", ""};
  EXPECT_EQ(f.store->restart_gate(f.kernel->id(), &b).refusal, Refusal::not_owner);
  AgentRef a{"a", ""};
  EXPECT_TRUE(f.store->restart_gate(f.kernel->id(), &a));
  EXPECT_EQ(f.store->kernel_info(f.kernel->id()).claim->agent, "a");  // the holder keeps it
  EXPECT_TRUE(f.store->restart_gate(f.kernel->id(), nullptr));      // the person clears it
  EXPECT_FALSE(f.store->kernel_info(f.kernel->id()).claim);
  EXPECT_TRUE(f.submit("b", "2"));
}

TEST(JobStore, AckIsTheHoldersOnly) {
  Fixture f;
  f.store->agent_connected(AgentRef{"a", ""});
  ASSERT_TRUE(f.submit("a", "1"));
  f.idle(f.last_request());
  f.foreign_begin("u1", "x = 1");
  f.idle("u1");
  auto r = f.store->ack(f.kernel->id(), AgentRef{"b", ""}, {"job-2"});
  EXPECT_EQ(r.outcome.refusal, Refusal::not_owner);
  EXPECT_EQ(f.store->digest(f.kernel->id()).jobs.size(), 1u);
  r = f.store->ack(f.kernel->id(), AgentRef{"a", ""}, {"job-2"});
  EXPECT_TRUE(r.outcome);
  EXPECT_TRUE(f.store->digest(f.kernel->id()).jobs.empty());
}

TEST(TailText, KeepsTheTailAndCountsTheCut) {
  TailText t(10);
  std::string all;
  for (int i = 0; i < 100; ++i) {
    std::string s = std::to_string(i) + ",";
    t.append(s);
    all += s;
  }
  EXPECT_EQ(t.text(), all.substr(all.size() - 10));
  EXPECT_EQ(t.cut(), all.size() - 10);
  EXPECT_LE(t.held(), 64u);  // capacity: about twice the cap
  EXPECT_EQ(t.total(), all.size());
}

TEST(TailText, AHugePieceKeepsOnlyItsTail) {
  TailText t(1024);
  t.append("head\n");
  t.append(std::string(1 << 20, 'x') + "end");
  EXPECT_EQ(t.text().size(), 1024u);
  EXPECT_EQ(t.text().substr(1021), "end");
  EXPECT_EQ(t.cut(), 5u + (1u << 20) + 3u - 1024u);
  EXPECT_LE(t.held(), 2u * 1024u + 64u);  // the 1 MiB piece is not kept
}

TEST(TailText, CutsAtAUtf8Boundary) {
  TailText t(5);
  t.append("ééééééééééé");  // 2-byte characters
  auto s = t.text();
  EXPECT_LE(s.size(), 5u);
  EXPECT_NE(static_cast<unsigned char>(s[0]) & 0xC0, 0x80);  // not a continuation byte
  EXPECT_EQ(t.cut() + s.size(), t.total());
}

TEST(JobStore, OutputCapKeepsTheTail) {
  RecordLimits l;
  l.job_output_bytes = 1024;
  Fixture f(l);
  f.foreign_begin("u1", "for i in range(1000): print(i)");
  std::string all;
  for (int i = 0; i < 1000; ++i) {
    std::string s = std::to_string(i) + "\n";
    all += s;
    f.iopub("stream", "u1", {{"name", "stdout"}, {"text", s}});
  }
  f.idle("u1");
  Job j = f.job("job-1");
  EXPECT_EQ(j.output.text(), all.substr(all.size() - 1024));
  EXPECT_EQ(j.output.cut(), all.size() - 1024);
  json full = job_json(j, true, std::chrono::steady_clock::now());
  EXPECT_EQ(full["output_cut"], all.size() - 1024);
}

TEST(JobStore, CodeCapKeepsTheHead) {
  RecordLimits l;
  l.job_code_bytes = 1024;
  Fixture f(l);
  std::string code(5000, 'x');
  ASSERT_TRUE(f.submit("a", code));
  Job j = f.job("job-1");
  EXPECT_EQ(j.code.size(), 1024u);
  EXPECT_EQ(j.code_cut, 5000u - 1024u);
}

TEST(JobStore, EvictionSparesRunningAndUnseenJobs) {
  RecordLimits l;
  l.max_jobs = 3;
  Fixture f(l);
  f.store->agent_connected(AgentRef{"a", ""});
  f.foreign_begin("u0", "unseen = 1");  // job-1: foreign, not yet told of
  f.idle("u0");
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(f.submit("a", "x = " + std::to_string(i)));
    f.idle(f.last_request());
  }
  EXPECT_TRUE(f.store->job("job-1"));   // never evicted before the agent is told
  EXPECT_FALSE(f.store->job("job-2"));  // the oldest seen ones went
  EXPECT_TRUE(f.store->job("job-6"));
  EXPECT_EQ(f.store->list("", 0, 100).jobs.size(), 3u);
  f.store->ack(f.kernel->id(), AgentRef{"a", ""}, {"job-1"});
  ASSERT_TRUE(f.submit("a", "y = 1"));
  f.idle(f.last_request());
  EXPECT_FALSE(f.store->job("job-1"));  // told, so it can go now
}

TEST(JobStore, AnAgentsJobJustEndedIsNotEvictedWhenTheRestIsUnseen) {
  // Found by bench/records.py: with max_jobs of unseen foreign jobs kept, the agent's job that
  // had just ended was the only evictable one, and its waiting execute got a 404.
  RecordLimits l;
  l.max_jobs = 3;
  Fixture f(l);
  for (int i = 0; i < 4; ++i) {
    f.foreign_begin("u" + std::to_string(i), "unseen = 1");
    f.idle("u" + std::to_string(i));
  }
  ASSERT_TRUE(f.submit("a", "1 + 1"));
  f.idle(f.last_request());
  EXPECT_TRUE(f.store->job("job-5")) << "the job a request waits on was evicted as it ended";
  ASSERT_TRUE(f.submit("a", "2 + 2"));
  f.idle(f.last_request());
  EXPECT_FALSE(f.store->job("job-5"));  // the next one's end lets it go
  EXPECT_TRUE(f.store->job("job-6"));
  EXPECT_EQ(f.store->list("", 0, 100).jobs.size(), 5u);  // 4 unseen + the last one
}

TEST(JobStore, BudgetReleasesTextAndUnseenCapCounts) {
  RecordLimits l;
  l.budget_bytes = 1 << 16;
  l.max_unseen_jobs = 3;
  Fixture f(l);
  for (int i = 0; i < 6; ++i) {
    std::string req = "u" + std::to_string(i);
    f.foreign_begin(req, "print('x' * 30000)");
    f.iopub("stream", req, {{"name", "stdout"}, {"text", std::string(30000, 'x')}});
    f.idle(req);
  }
  EXPECT_LE(f.store->bytes(), l.budget_bytes);
  auto d = f.store->digest(f.kernel->id());
  EXPECT_EQ(d.jobs.size(), 3u);
  EXPECT_EQ(d.evicted_unseen, 3u);
  bool released = false;
  for (auto& e : d.jobs) released |= f.job(e.job).released;
  EXPECT_TRUE(released);
}

TEST(JobStore, DisabledRecordsNothing) {
  RecordLimits l;
  l.enabled = false;
  Fixture f(l);
  f.foreign_begin("u1", "x = 1");
  EXPECT_FALSE(f.store->job("job-1"));
  EXPECT_EQ(f.submit("a", "1").refusal, Refusal::disabled);
}

TEST(JobStore, VersionChangesAndNotifies) {
  Fixture f;
  int calls = 0;
  f.store->set_on_change([&] { ++calls; });
  auto v0 = f.store->version();
  f.foreign_begin("u1", "x = 1");
  EXPECT_GT(f.store->version(), v0);
  EXPECT_GT(calls, 0);
  int before = calls;
  f.iopub("stream", "u1", {{"name", "stdout"}, {"text", "x"}});  // output is not a lifecycle change
  EXPECT_EQ(calls, before);
}

TEST(Notebook, JobsInOrderWithRestarts) {
  Fixture f;
  f.foreign_begin("u1", "a = 1\nprint(a)");
  f.iopub("stream", "u1", {{"name", "stdout"}, {"text", "1\n"}});
  f.idle("u1");
  f.store->on_kernel_lifecycle(f.kernel, KernelLifecycle::restarting, "the kernel was restarted");
  f.foreign_begin("u2", "1/0");
  f.iopub("error", "u2", {{"ename", "ZeroDivisionError"}, {"evalue", "x"}, {"traceback", {"tb"}}});
  f.idle("u2");
  json nb = notebook_json(f.store->kernel_jobs(f.kernel->id()), f.store->restarts(f.kernel->id()),
                          &f.kernel->spec());
  EXPECT_EQ(nb["nbformat"], 4);
  ASSERT_EQ(nb["cells"].size(), 3u);
  EXPECT_EQ(nb["cells"][0]["cell_type"], "code");
  EXPECT_EQ(nb["cells"][0]["source"][0].get<std::string>().rfind("# [job-1 · user · ok", 0), 0u);
  EXPECT_EQ(nb["cells"][0]["outputs"][0]["text"][0], "1\n");
  EXPECT_EQ(nb["cells"][1]["cell_type"], "markdown");
  EXPECT_EQ(nb["cells"][2]["outputs"][0]["output_type"], "error");
  EXPECT_EQ(nb["metadata"]["kernelspec"]["name"], "python3");
}

TEST(StripAnsi, RemovesCsiAndOsc) {
  EXPECT_EQ(strip_ansi("\x1b[1;31mred\x1b[0m plain"), "red plain");
  EXPECT_EQ(strip_ansi("\x1b]8;;http://x\x07link\x1b]8;;\x07"), "link");
  EXPECT_EQ(strip_ansi("tail\x1b"), "tail");
  EXPECT_EQ(strip_ansi("no escapes"), "no escapes");
}

TEST(JobStore, SilentCellsOfKgateClientsAreRecorded) {
  Fixture f;
  ClientMessage cm;
  cm.channel = Channel::shell;
  cm.msg_type = "execute_request";
  cm.msg_id = "ws-silent";
  cm.route = "client-1";
  cm.wire.content = json{{"code", "secret = 42"}, {"silent", true}}.dump();
  f.store->on_client_message(f.kernel, cm);
  Job j = f.job("job-1");
  EXPECT_EQ(j.origin, JobOrigin::user);
  EXPECT_FALSE(j.began);
  f.iopub("status", "ws-silent", {{"execution_state", "busy"}});
  EXPECT_TRUE(f.job("job-1").began);
  f.idle("ws-silent");
  EXPECT_EQ(f.job("job-1").status, JobStatus::ok);
  // An empty silent request (qtconsole's prompt number) is never a cell.
  cm.msg_id = "ws-empty";
  cm.wire.content = json{{"code", ""}, {"silent", true}}.dump();
  f.store->on_client_message(f.kernel, cm);
  EXPECT_FALSE(f.store->job("job-2"));
}

// ---------------------------------------------------------------------------------------
// Bad bytes from a kernel: every stored text is valid UTF-8 and every read dumps strictly.

TEST(Utf8, ReplacesEachMaximalSubpart) {
  EXPECT_TRUE(is_valid_utf8("plain \xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80"));
  EXPECT_EQ(valid_utf8("plain \xC3\xA9"), "plain \xC3\xA9");
  // As Python's bytes.decode('utf-8', 'replace') and the WHATWG decoder do.
  EXPECT_EQ(valid_utf8("a\xFF" "b"), "a\uFFFD" "b");
  EXPECT_EQ(valid_utf8("\xF0\x9F\x98"), "\uFFFD");         // a truncated 4-byte character
  EXPECT_EQ(valid_utf8("\xE4\xB8" "x"), "\uFFFD" "x");      // a truncated 3-byte one
  EXPECT_EQ(valid_utf8("\xC0\xAF"), "\uFFFD\uFFFD");        // an overlong
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD");  // a surrogate
  EXPECT_EQ(valid_utf8("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // past U+10FFFF
  EXPECT_EQ(valid_utf8("\xA9\xA9"), "\uFFFD\uFFFD");        // lone continuation bytes
  std::string s = "12345678abcdefgh\xE9";                  // past the 8-byte ASCII stride
  make_valid_utf8(s);
  EXPECT_EQ(s, "12345678abcdefgh\uFFFD");
}

TEST(StripAnsi, NeverTakesAByteOfAMultiByteCharacter) {
  EXPECT_EQ(strip_ansi("\x1b\xC3\xA9 bad"), "\xC3\xA9 bad");  // ESC directly before é
  EXPECT_EQ(strip_ansi("\x1b[3\xE2\x82\xAC"), "\xE2\x82\xAC");  // a CSI cut by €
  EXPECT_EQ(strip_ansi("\x1b]0;t\xC3\xA9tle\x1b\\x"), "x");    // an OSC holding é, ended by ST
  EXPECT_EQ(strip_ansi("\x1b]0;unterminated\nnext"), "\nnext");  // ends at the line's end
  EXPECT_EQ(strip_ansi("\x1b(Bx\x1b=y"), "xy");                // the short forms
  EXPECT_EQ(strip_ansi("a\x1b\x1b[0mb"), "ab");
  EXPECT_TRUE(is_valid_utf8(strip_ansi("\x1b\xF0\x9F\x98\x80\x1b[\xE4\xB8\xAD")));
}

namespace {

// Text as a kernel may send it: valid pieces (which may hold ESC and control characters) and
// raw bytes that are not UTF-8, spliced into the message's JSON text as they come on the wire.
struct KernelText {
  std::vector<std::pair<bool, std::string>> pieces;  // (raw, bytes)
  std::string marker;
  // The JSON string literal: valid pieces escaped by nlohmann, raw bytes (all >= 0x80, which
  // JSON never escapes) as they are.
  std::string literal() const {
    std::string out = "\"";
    for (auto& [raw, bytes] : pieces) {
      if (raw) out += bytes;
      else {
        std::string quoted = json(bytes).dump();
        out += quoted.substr(1, quoted.size() - 2);
      }
    }
    return out + "\"";
  }
};

class BadText {
 public:
  explicit BadText(std::uint64_t seed) : rng_(seed) {}
  std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

  KernelText text(const std::string& marker) {
    static const std::vector<std::string> chars = {"\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xD0\x96",
                                                   "\xE2\x82\xAC"};
    KernelText t;
    t.marker = marker;
    t.pieces.emplace_back(false, marker);
    for (std::size_t n = pick(12); n > 0; --n) {
      switch (pick(9)) {
        case 0: {  // random bytes >= 0x80
          std::string b;
          for (std::size_t k = 1 + pick(4); k > 0; --k) b += char(0x80 + pick(0x80));
          t.pieces.emplace_back(true, b);
          break;
        }
        case 1: {  // a truncated multi-byte character
          const std::string& c = chars[pick(chars.size())];
          t.pieces.emplace_back(true, c.substr(0, 1 + pick(c.size() - 1)));
          break;
        }
        case 2: t.pieces.emplace_back(false, "\x1b[" + std::to_string(pick(100)) + ";1m"); break;
        case 3: t.pieces.emplace_back(false, "\x1b]8;;http://x/" + chars[pick(chars.size())] + "\x07"); break;
        case 4: t.pieces.emplace_back(false, "\x1b" + chars[pick(chars.size())]); break;  // ESC + char
        case 5: t.pieces.emplace_back(false, std::string("\x1b[") + "0123;"[pick(5)]); break;  // cut CSI
        case 6: t.pieces.emplace_back(false, "\x1b"); break;  // a lone ESC (raw bytes may follow it)
        case 7: t.pieces.emplace_back(false, chars[pick(chars.size())]); break;
        default: t.pieces.emplace_back(false, std::string(1 + pick(3), "ab \n\"\\\t"[pick(8)])); break;
      }
    }
    t.pieces.emplace_back(false, " " + marker);
    return t;
  }

 private:
  std::mt19937_64 rng_;
};

// A message whose content is `content` with each "@N@" string replaced by texts[N]'s literal.
KernelMessagePtr raw_kmsg(Channel ch, const std::string& type, const std::string& parent, const json& content,
                          const std::vector<KernelText>& texts, const std::string& session = "someone-else") {
  json ph = json{{"msg_id", parent}, {"session", session}};
  auto m = synthesize_message(ch, type, "kernel-session", ph.dump(), json::object());
  m.synthesized = false;
  std::string wire = content.dump();
  for (std::size_t i = 0; i < texts.size(); ++i) {
    std::string key = "\"@" + std::to_string(i) + "@\"";
    for (auto at = wire.find(key); at != std::string::npos; at = wire.find(key))
      wire.replace(at, key.size(), texts[i].literal());
  }
  m.wire.content = std::move(wire);
  return std::make_shared<const KernelMessage>(std::move(m));
}

// Every read the gateway serves, dumped as it dumps them but strictly: a throw is a failure.
void expect_reads_dump_strictly(const JobStore& store, const KernelPtr& kernel, std::size_t code_chars) {
  auto now = std::chrono::steady_clock::now();
  auto strict = [](const json& j, const std::string& what) {
    std::string text;
    EXPECT_NO_THROW(text = j.dump()) << what;
    EXPECT_TRUE(is_valid_utf8(text)) << what;
    EXPECT_NO_THROW(std::ignore = json::parse(text)) << what;
  };
  for (auto& j : store.kernel_jobs(kernel->id())) {
    for (auto* s : {&j.code, &j.ename, &j.evalue, &j.note})
      EXPECT_TRUE(is_valid_utf8(*s)) << j.id() << ": " << json(*s).dump(-1, ' ', true, json::error_handler_t::replace);
    for (auto& line : j.traceback) EXPECT_TRUE(is_valid_utf8(line)) << j.id();
    EXPECT_TRUE(is_valid_utf8(j.output.text())) << j.id();
    EXPECT_TRUE(is_valid_utf8(j.result.text())) << j.id();
    EXPECT_EQ(j.evalue.find('\x1b'), std::string::npos) << j.id();
    auto one = store.job(j.id());
    ASSERT_TRUE(one);
    strict(job_json(*one, true, now), j.id());
  }
  for (const std::string& k : {std::string(), kernel->id()}) {
    auto l = store.list(k, 0, code_chars);
    json list = json::array();
    for (auto& j : l.jobs) list.push_back(job_json(j, false, now));
    strict(list, "list");
  }
  auto d = store.digest(kernel->id());
  json digest = json::array();
  for (auto& e : d.jobs) digest.push_back({{"job", e.job}, {"status", status_name(e.status)}});
  strict(digest, "digest");
  strict(notebook_json(store.kernel_jobs(kernel->id()), store.restarts(kernel->id()), &kernel->spec()), "notebook");
}

}  // namespace

TEST(JobStore, BadBytesFromTheKernelNeverBreakARead) {
  std::uint64_t base = 20161;
  if (const char* s = std::getenv("KGATE_TEST_SEED")) base = std::strtoull(s, nullptr, 10);
  for (std::uint64_t run = 0; run < 40; ++run) {
    const std::uint64_t seed = base + run;
    SCOPED_TRACE("seed " + std::to_string(seed) + " (KGATE_TEST_SEED=" + std::to_string(seed) + " reruns it first)");
    BadText gen(seed);
    RecordLimits l;
    l.job_output_bytes = 8 + gen.pick(120);  // small caps: texts are cut at every offset
    l.job_code_bytes = 8 + gen.pick(120);
    l.budget_bytes = 2000 + gen.pick(20000);
    l.max_jobs = 5 + gen.pick(20);
    Fixture f(l);
    for (int cell = 0; cell < 25; ++cell) {
      const std::string m = "m" + std::to_string(cell) + "z";
      std::string req;
      std::string session = "someone-else";
      KernelText code = gen.text(m);
      const std::size_t kind = gen.pick(3);
      switch (kind) {
        case 0: {  // an agent's cell
          auto out = f.submit("a", "cell " + m);
          ASSERT_TRUE(out) << out.message;
          req = f.last_request();
          session = f.store->session();
          break;
        }
        case 1: {  // a kgate client's silent cell: recorded from its request
          req = "ws-" + m;
          ClientMessage cm;
          cm.channel = Channel::shell;
          cm.msg_type = "execute_request";
          cm.msg_id = req;
          cm.route = "client-1";
          cm.wire.content = json{{"code", "@0@"}, {"silent", true}}.dump();
          std::string key = "\"@0@\"";
          cm.wire.content.replace(cm.wire.content.find(key), key.size(), code.literal());
          f.store->on_client_message(f.kernel, cm);
          break;
        }
        default: req = "user-" + m; break;  // a foreign cell, seen on iopub only
      }
      auto send = [&](Channel ch, const std::string& type, const json& content, const std::vector<KernelText>& t) {
        f.store->on_kernel_message(f.kernel, raw_kmsg(ch, type, req, content, t, session));
      };
      send(Channel::iopub, "status", {{"execution_state", "busy"}}, {});
      send(Channel::iopub, "execute_input", {{"code", "@0@"}, {"execution_count", cell}}, {code});
      for (std::size_t n = gen.pick(4); n > 0; --n)
        send(Channel::iopub, "stream", {{"name", gen.pick(2) ? "stdout" : "stderr"}, {"text", "@0@"}}, {gen.text(m)});
      if (gen.pick(2))
        send(Channel::iopub, "execute_result", {{"data", {{"text/plain", "@0@"}}}, {"execution_count", cell}},
             {gen.text(m)});
      bool error = gen.pick(2);
      if (error)
        send(Channel::iopub, "error", {{"ename", "@0@"}, {"evalue", "@1@"}, {"traceback", {"@2@", "@3@", "@4@"}}},
             {gen.text("E"), gen.text(m), gen.text(m), gen.text(m), gen.text(m)});
      // The reply before the idle, after it, or none (a foreign cell's goes to its own client; a
      // kgate client's always comes, else its request stays in flight).
      const std::size_t reply = kind == 1 ? 1 + gen.pick(2) : gen.pick(3);
      auto send_reply = [&] {
        send(Channel::shell, "execute_reply", {{"status", error ? "error" : "ok"}, {"ename", "@0@"}, {"evalue", "@1@"}},
             {gen.text("R"), gen.text(m)});
      };
      if (reply == 1) send_reply();
      send(Channel::iopub, "status", {{"execution_state", "idle"}}, {});
      if (reply == 2) send_reply();
      if (gen.pick(8) == 0) f.store->on_kernel_lifecycle(f.kernel, KernelLifecycle::restarting, "restarted");
    }
    // The text before the bad bytes is kept: each text begins with its cell's marker.
    auto jobs = f.store->kernel_jobs(f.kernel->id());
    ASSERT_FALSE(jobs.empty());
    for (auto& j : jobs) {
      EXPECT_TRUE(j.code.rfind("m", 0) == 0 || j.code.rfind("cell m", 0) == 0) << j.id() << " " << j.code;
      EXPECT_TRUE(j.evalue.empty() || j.evalue.rfind("m", 0) == 0) << j.id() << " " << j.evalue;
    }
    expect_reads_dump_strictly(*f.store, f.kernel, gen.pick(40));
    if (HasFailure()) return;
  }
}

TEST(JobStore, TheTextAroundBadBytesIsKept) {
  Fixture f;
  f.foreign_begin("u1", "x");
  auto raw = [&](const std::string& type, const std::string& content) {
    auto m = synthesize_message(Channel::iopub, type, "kernel-session",
                                json{{"msg_id", "u1"}, {"session", "someone-else"}}.dump(), json::object());
    m.synthesized = false;
    m.wire.content = content;
    f.store->on_kernel_message(f.kernel, std::make_shared<const KernelMessage>(std::move(m)));
  };
  // What ipykernel sends for sys.stdout.write('out \udcff') and raise ValueError('\x1b\u00e9 \udce9 bad').
  raw("stream", "{\"name\": \"stdout\", \"text\": \"out \xFF\"}");
  raw("execute_result", "{\"data\": {\"text/plain\": \"res \xC3\"}, \"execution_count\": 1}");
  raw("error", "{\"ename\": \"ValueError\", \"evalue\": \"\\u001b\xC3\xA9 \xE9 bad\", "
               "\"traceback\": [\"\\u001b[0;31mValueError\\u001b[0m: \\u001b\xC3\xA9 \xE9 bad\"]}");
  f.idle("u1");
  Job j = f.job("job-1");
  EXPECT_EQ(j.status, JobStatus::error);
  EXPECT_EQ(j.output.text(), "out \uFFFD");
  EXPECT_EQ(j.result.text(), "res \uFFFD");
  EXPECT_EQ(j.evalue, "\u00e9 \uFFFD bad");
  ASSERT_EQ(j.traceback.size(), 1u);
  EXPECT_EQ(j.traceback[0], "ValueError: \u00e9 \uFFFD bad");
  EXPECT_NO_THROW(std::ignore = job_json(j, true, std::chrono::steady_clock::now()).dump());
}

// Stream messages of megabytes are unescaped a chunk at a time, and only the chunks that can
// reach the kept tail are kept: every escape (short, \uXXXX, surrogate pairs) and UTF-8 sequence
// across every chunk edge, both with simdjson's padding in the content's capacity and without.
TEST(JobStore, LargeStreamMessagesKeepTheExactTailAndCount) {
  std::mt19937 rng(7);
  const std::vector<std::string> bits = {"x", "yz ", "\n", "\"", "\\", "\t", "\x01", "\x1f", "/",
                                         "\u00e9", "\u2603", "\U0001F600", "\r\n", "0123456789"};
  auto make_text = [&](std::size_t n) {
    std::string t;
    while (t.size() < n) t += bits[rng() % bits.size()];
    return t;
  };
  for (std::size_t size : {std::size_t(1) << 10, std::size_t(300) << 10, std::size_t(3) << 20}) {
    for (bool ascii : {false, true}) {
      for (bool padded : {false, true}) {
        SCOPED_TRACE("size " + std::to_string(size) + (ascii ? " ascii" : " utf8") + (padded ? " padded" : ""));
        Fixture f;
        f.foreign_begin("u1", "flood()");
        std::string expected;
        for (int part = 0; part < 2; ++part) {
          std::string text = make_text(size);
          expected += text;
          json c = {{"name", "stdout"}, {"text", text}};
          // ensure_ascii: what Python's json.dumps writes by default (\uXXXX, surrogate pairs).
          std::string content = c.dump(-1, ' ', ascii);
          auto m = synthesize_message(Channel::iopub, "stream", "kernel-session",
                                      json{{"msg_id", "u1"}, {"session", "someone-else"}}.dump(), json::object());
          m.synthesized = false;
          m.wire.content.clear();
          m.wire.content.shrink_to_fit();
          if (padded) m.wire.content.reserve(content.size() + kJsonPadding);
          m.wire.content.append(content);
          f.store->on_kernel_message(f.kernel, std::make_shared<const KernelMessage>(std::move(m)));
        }
        f.idle("u1");
        Job j = f.job("job-1");
        const std::size_t cap = RecordLimits{}.job_output_bytes;
        std::size_t from = expected.size() > cap ? expected.size() - cap : 0;
        while (from < expected.size() && (static_cast<unsigned char>(expected[from]) & 0xC0) == 0x80) ++from;
        EXPECT_EQ(j.output.total(), expected.size());
        ASSERT_EQ(j.output.text().size(), expected.size() - from);
        EXPECT_TRUE(j.output.text() == std::string_view(expected).substr(from)) << "the kept tail differs";
      }
    }
  }
}

TEST(JobStore, CodeAndLabelsThatAreNotUtf8AreRepairedNotThrown) {
  Fixture f;
  Outcome out;
  ASSERT_NO_THROW(out = f.submit("agent-\xC3", "print('\xFF')", "label \xE9"));
  ASSERT_TRUE(out) << out.message;
  EXPECT_EQ(json::parse(f.sent.back().wire.content)["code"], "print('\uFFFD')");
  Job j = f.job(out.job);
  EXPECT_EQ(j.code, "print('\uFFFD')");
  EXPECT_EQ(j.agent, "agent-\uFFFD");
  EXPECT_EQ(j.label, "label \uFFFD");
  f.store->on_kernel_lifecycle(f.kernel, KernelLifecycle::restarting, "restarted \xFF");
  EXPECT_EQ(f.store->restarts(f.kernel->id()).at(0).reason, "restarted \uFFFD");
  EXPECT_NO_THROW(std::ignore = job_json(f.job(out.job), true, std::chrono::steady_clock::now()).dump());
}

// The listing copies a job's summary field by field (not its output): every field the summary
// JSON has must come through, a task's mark included.
TEST(JobStore, TheListingSaysWhatTheJobSays) {
  Fixture f;
  auto out = f.submit("a", "long_compute()", "agent label");
  ASSERT_TRUE(out) << out.message;
  const std::string req = f.last_request();
  f.iopub("status", req, {{"execution_state", "busy"}}, "agent-session");
  f.iopub("execute_input", req, {{"code", "long_compute()"}, {"execution_count", 3}}, "agent-session");
  f.store->on_kernel_side_event(f.kernel, {{"event", "task_start"}, {"request", req}});
  f.iopub("error", req, {{"ename", "ValueError"}, {"evalue", "bad"}, {"traceback", {"ValueError: bad"}}});
  f.iopub("stream", req, {{"name", "stdout"}, {"text", "out\n"}});
  const auto now = std::chrono::steady_clock::now();
  for (bool ended : {false, true}) {
    if (ended) f.store->on_kernel_side_event(f.kernel, {{"event", "task_end"}, {"request", req}, {"status", "error"}});
    auto listed = f.store->list("", 0, 1000).jobs;
    ASSERT_EQ(listed.size(), 1u);
    json from_list = job_json(listed[0], false, now);
    json from_job = job_json(f.job(out.job), false, now);
    EXPECT_EQ(from_list, from_job);
    EXPECT_EQ(from_list["task"], true);
    EXPECT_EQ(from_list["status"], ended ? "error" : "running");
  }
}
