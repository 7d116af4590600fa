// Unit tests for the job records on disk: RecordLog's files (append, torn lines, versions, the
// counter) and a JobStore's records read back by another JobStore (docs/dev/readoption.md).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>

#include "kgate/records/jobs.hpp"
#include "kgate/records/record_log.hpp"
#include "kgate/jupyter/wire.hpp"

using namespace kgate;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("kgate-records-" + new_hex_id());
  fs::create_directories(d);
  return d;
}

struct TempDir {
  fs::path path = temp_dir();
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

KernelPtr make_kernel(const std::string& id) {
  KernelSpec spec;
  spec.name = "python3";
  return std::make_shared<Kernel>(id, spec);
}

KernelMessagePtr kmsg(Channel ch, const std::string& type, const std::string& parent, const json& content) {
  json ph = {{"msg_id", parent}, {"session", "someone-else"}};
  auto m = synthesize_message(ch, type, "kernel-session", ph.dump(), content);
  m.synthesized = false;
  return std::make_shared<const KernelMessage>(std::move(m));
}

}  // namespace

TEST(RecordLog, AppendsAreReadBackInOrderWithPrivateModes) {
  TempDir t;
  {
    RecordLog log({t.path / "records", std::chrono::milliseconds(10)});
    ASSERT_TRUE(log.append("k1", R"({"a":1})"));
    ASSERT_TRUE(log.append("k1", R"({"a":2})"));
    ASSERT_TRUE(log.append("k2", R"({"b":1})"));
    log.save_counter(7);
  }
  struct stat st{};
  ASSERT_EQ(::stat((t.path / "records").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((t.path / "records" / "k1.log").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  RecordLog log({t.path / "records"});
  auto loaded = log.load({"k1", "k2"});
  EXPECT_TRUE(loaded.problems.empty());
  EXPECT_EQ(loaded.counter, 7u);
  ASSERT_EQ(loaded.logs["k1"].size(), 2u);
  EXPECT_EQ(loaded.logs["k1"][1], R"({"a":2})");
  EXPECT_EQ(loaded.logs["k2"].size(), 1u);
}

TEST(RecordLog, TornLinesNewerVersionsAndGoneKernels) {
  TempDir t;
  fs::path dir = t.path / "records";
  {
    RecordLog log({dir});
    log.append("k1", R"({"a":1})");
    log.append("gone", R"({"a":1})");
  }
  { std::ofstream(dir / "k1.log", std::ios::app) << R"({"a":)"; }
  { std::ofstream(dir / "k2.log") << R"({"format":"kgate-records","version":2,"kernel":"k2"})" << "\n"; }
  { std::ofstream(dir / "k3.log") << "not a header\n"; }
  RecordLog log({dir});
  auto loaded = log.load({"k1", "k2", "k3"});
  ASSERT_EQ(loaded.logs["k1"].size(), 1u);  // the torn line is dropped
  EXPECT_EQ(loaded.logs.count("k2"), 0u);
  EXPECT_EQ(loaded.logs.count("k3"), 0u);
  ASSERT_EQ(loaded.problems.size(), 3u);
  EXPECT_TRUE(fs::exists(dir / "k2.log.bad"));
  EXPECT_TRUE(fs::exists(dir / "k3.log.bad"));
  EXPECT_FALSE(fs::exists(dir / "gone.log")) << "a log of a kernel not re-adopted stays";
}

TEST(RecordLog, UnsafeKernelIdsAreNotFileNames) {
  TempDir t;
  RecordLog log({t.path / "records"});
  EXPECT_FALSE(log.append("../escape", "{}"));
  EXPECT_FALSE(log.append(".hidden", "{}"));
  EXPECT_FALSE(fs::exists(t.path / "escape.log"));
}

TEST(RecordLog, AJobStoresRecordsAreReadBackByTheNext) {
  TempDir t;
  fs::path dir = t.path / "records";
  auto kernel = make_kernel("k1");
  std::string running_req;
  {
    RecordLog log({dir});
    JobStore store{RecordLimits{}};
    store.persist_to(&log);
    std::vector<ClientMessage> sent;
    auto send = [&](ClientMessage m) { sent.push_back(std::move(m)); };
    ASSERT_TRUE(store.submit("k1", AgentRef{"a", "Agent A"}, "x = 41\nprint(x)", JobOrigin::mcp, send));
    std::string req = sent.back().msg_id;
    store.on_kernel_message(kernel, kmsg(Channel::iopub, "execute_input", req, {{"code", "x = 41"}, {"execution_count", 3}}));
    store.on_kernel_message(kernel, kmsg(Channel::iopub, "stream", req, {{"name", "stdout"}, {"text", "41\n"}}));
    store.on_kernel_message(kernel, kmsg(Channel::iopub, "status", req, {{"execution_state", "idle"}}));
    ASSERT_TRUE(store.submit("k1", AgentRef{"a", "Agent A"}, "import time; time.sleep(9)", JobOrigin::mcp, send));
    running_req = sent.back().msg_id;
    store.on_kernel_message(kernel, kmsg(Channel::iopub, "execute_input", running_req, {{"code", "sleep"}, {"execution_count", 4}}));
  }
  RecordLog log({dir});
  JobStore store{RecordLimits{}};
  store.persist_to(&log);
  auto lines = store.restore(log.load({"k1"}));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("2 job records read back (1 still running)"), std::string::npos) << lines[0];
  auto done = store.job("job-1");
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, JobStatus::ok);
  EXPECT_EQ(done->output.text(), "41\n");
  EXPECT_EQ(done->agent, "a");
  EXPECT_EQ(done->execution_count, 3);
  auto running = store.job("job-2");
  ASSERT_TRUE(running);
  EXPECT_TRUE(running->running());
  EXPECT_NE(running->note.find("kgate was away"), std::string::npos);
  // The claim came back: another agent is refused while its holder has its grace.
  auto refused = store.submit("k1", AgentRef{"b", ""}, "1", JobOrigin::mcp, [](ClientMessage) {});
  EXPECT_EQ(refused.refusal, Refusal::claimed);
  // The running cell's idle, heard by the new store, ends it; numbering continues.
  store.on_kernel_message(kernel, kmsg(Channel::iopub, "status", running_req, {{"execution_state", "idle"}}));
  EXPECT_EQ(store.job("job-2")->status, JobStatus::ok);
  std::vector<ClientMessage> sent;
  auto out = store.submit("k1", AgentRef{"a", ""}, "x + 1", JobOrigin::mcp, [&](ClientMessage m) { sent.push_back(m); });
  ASSERT_TRUE(out) << out.message;
  EXPECT_EQ(out.job, "job-3");
  // History after the re-adoption: cell 5 ran while kgate was away; 3 and 4 are known.
  json history = {{"status", "ok"},
                  {"history", json::array({json::array({0, 3, json::array({"x = 41", nullptr})}),
                                           json::array({0, 5, json::array({"y = 2\ny", "2"})})})}};
  store.on_kernel_readopted(kernel, history.dump());
  auto listing = store.list("k1", 0, 100);
  ASSERT_EQ(listing.jobs.size(), 4u);
  auto recovered = store.job(listing.jobs.back().id());
  ASSERT_TRUE(recovered);
  EXPECT_EQ(recovered->code, "y = 2\ny");
  EXPECT_EQ(recovered->origin, JobOrigin::user);
  EXPECT_EQ(recovered->status, JobStatus::end_not_recorded);
  EXPECT_EQ(recovered->result.text(), "2");
  EXPECT_NE(recovered->note.find("ran while kgate was away"), std::string::npos);
}
