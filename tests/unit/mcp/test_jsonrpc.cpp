// Unit tests for the MCP stdio server (kgate/mcp/jsonrpc.hpp), driven in-process through
// in-memory streams and a scripted tool handler.
#include "kgate/mcp/jsonrpc.hpp"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <istream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kgate/mcp/version_info.hpp"

namespace kgate::mcp {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kWait = 5s;  // how long a test waits for something that should come at once

// ---- streams ---------------------------------------------------------------------------

// Input the test writes while the server reads it. A read blocks until data comes or close().
class InputPipe : public std::streambuf {
 public:
  void write(std::string_view s) {
    std::lock_guard lock(mutex_);
    data_.append(s);
    cv_.notify_all();
  }
  void close() {
    std::lock_guard lock(mutex_);
    closed_ = true;
    cv_.notify_all();
  }

 protected:
  int_type underflow() override {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return pos_ < data_.size() || closed_; });
    if (pos_ >= data_.size()) return traits_type::eof();
    const std::size_t n = std::min(data_.size() - pos_, buf_.size());
    std::memcpy(buf_.data(), data_.data() + pos_, n);
    pos_ += n;
    setg(buf_.data(), buf_.data(), buf_.data() + n);
    return traits_type::to_int_type(buf_[0]);
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string data_;
  std::size_t pos_ = 0;
  bool closed_ = false;
  std::array<char, 4096> buf_{};
};

// Output the server writes; the test waits for lines in it.
class OutputSink : public std::streambuf {
 public:
  std::vector<std::string> lines() const {
    std::lock_guard lock(mutex_);
    return lines_;
  }
  std::vector<json> parsed() const {
    std::lock_guard lock(mutex_);
    return parsed_;
  }
  std::string partial() const {
    std::lock_guard lock(mutex_);
    return pending_;
  }
  // The message number `n` (0-based, in order) among those that satisfy `pred`, waiting up to
  // `timeout` for it.
  std::optional<json> wait_for(const std::function<bool(const json&)>& pred, std::chrono::milliseconds timeout,
                               std::size_t n = 0) {
    std::unique_lock lock(mutex_);
    std::optional<json> found;
    cv_.wait_for(lock, timeout, [&] {
      std::size_t matched = 0;
      for (const json& j : parsed_) {
        if (!j.is_discarded() && pred(j) && matched++ == n) {
          found = j;
          return true;
        }
      }
      return false;
    });
    return found;
  }
  // Waits until there are at least `n` lines.
  bool wait_lines(std::size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return lines_.size() >= n; });
  }

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    const char ch = traits_type::to_char_type(c);
    xsputn(&ch, 1);
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::lock_guard lock(mutex_);
    for (std::streamsize i = 0; i < n; ++i) {
      if (s[i] == '\n') {
        parsed_.push_back(json::parse(pending_, nullptr, /*allow_exceptions=*/false));
        lines_.push_back(std::move(pending_));
        pending_.clear();
        cv_.notify_all();
      } else {
        pending_ += s[i];
      }
    }
    return n;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
  std::vector<json> parsed_;  // lines_, parsed once (discarded when not JSON)
  std::string pending_;
};

// ---- the tool handler ------------------------------------------------------------------

// A handler whose tools are test lambdas. It records cancellations and shutdown, and counts calls.
class TestHandler : public ToolHandler {
 public:
  using Fn = std::function<ToolReply(Call&)>;

  ~TestHandler() override {
    // A call abandoned after eof_grace may still be running; it must end before we go.
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, kWait, [&] { return active_ == 0; });
  }

  void add(std::string name, Fn fn, json schema = {{"type", "object"}}, json execution = nullptr) {
    std::lock_guard lock(mutex_);
    schemas_[name] = std::move(schema);
    if (!execution.is_null()) executions_[name] = std::move(execution);
    tools_[std::move(name)] = std::move(fn);
  }

  json tool_list() const override {
    std::lock_guard lock(mutex_);
    if (throw_on_list) throw std::runtime_error("list broke");
    json list = json::array();
    for (const auto& entry : tools_) {
      list.push_back({{"name", entry.first},
                      {"description", "test tool " + entry.first},
                      {"inputSchema", schemas_.at(entry.first)}});
      if (auto e = executions_.find(entry.first); e != executions_.end()) list.back()["execution"] = e->second;
    }
    return list;
  }

  ToolReply call(Call& c) override {
    Fn fn;
    {
      std::lock_guard lock(mutex_);
      fn = tools_.at(c.tool);
      ++active_;
      ++started_;
      seen_.push_back({c.id, c.tool, c.arguments, c.protocol_version, c.modern, c.progress_token});
      cv_.notify_all();
    }
    struct Done {
      TestHandler& h;
      ~Done() {
        std::lock_guard lock(h.mutex_);
        --h.active_;
        ++h.ended_;
        h.cv_.notify_all();
      }
    } done{*this};
    return fn(c);
  }

  void cancelled(Call& c) override {
    std::lock_guard lock(mutex_);
    EXPECT_TRUE(c.cancelled.load());
    cancelled_ids_.push_back(c.id);
    cv_.notify_all();
  }

  void shutdown() override {
    std::lock_guard lock(mutex_);
    ++shutdowns_;
    active_at_shutdown_ = active_;
  }

  bool wait_started(int n) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, kWait, [&] { return started_ >= n; });
  }
  bool wait_ended(int n) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, kWait, [&] { return ended_ >= n; });
  }
  bool wait_cancelled(std::size_t n) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, kWait, [&] { return cancelled_ids_.size() >= n; });
  }

  struct Seen {
    json id;
    std::string tool;
    json arguments;
    std::string protocol_version;
    bool modern;
    std::optional<json> progress_token;
  };
  std::vector<Seen> seen() const {
    std::lock_guard lock(mutex_);
    return seen_;
  }
  std::vector<json> cancelled_ids() const {
    std::lock_guard lock(mutex_);
    return cancelled_ids_;
  }
  int shutdowns() const {
    std::lock_guard lock(mutex_);
    return shutdowns_;
  }
  int active_at_shutdown() const {
    std::lock_guard lock(mutex_);
    return active_at_shutdown_;
  }
  int started() const {
    std::lock_guard lock(mutex_);
    return started_;
  }

  bool throw_on_list = false;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, Fn> tools_;
  std::map<std::string, json> schemas_;
  std::map<std::string, json> executions_;
  int active_ = 0;
  int started_ = 0;
  int ended_ = 0;
  int shutdowns_ = 0;
  int active_at_shutdown_ = -1;
  std::vector<Seen> seen_;
  std::vector<json> cancelled_ids_;
};

ToolReply text_reply(std::string text, bool is_error = false) {
  ToolReply r;
  r.content.push_back({{"type", "text"}, {"text", std::move(text)}});
  r.is_error = is_error;
  return r;
}

// A gate a tool waits at until the test opens it (or the call is cancelled, if it says so).
class Gate {
 public:
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  // Waits until open, or until `call` is cancelled when `honour_cancel`. Returns whether it was opened.
  bool wait(Call& call, bool honour_cancel) {
    std::unique_lock lock(mutex_);
    while (!open_) {
      if (honour_cancel && call.cancelled) return false;
      cv_.wait_for(lock, 5ms);
    }
    return true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

// ---- the harness -----------------------------------------------------------------------

ServerOptions quick_options() {
  ServerOptions o;
  o.eof_grace = 500ms;
  return o;
}

// A StdioServer running on its own thread, fed through an InputPipe.
class Harness {
 public:
  explicit Harness(TestHandler& handler, ServerOptions opts = quick_options())
      : in_stream_(&in_), out_stream_(&out_), server_(handler, in_stream_, out_stream_, std::move(opts)) {
    thread_ = std::thread([this] {
      rc_ = server_.run();
      returned_ = true;
    });
  }
  ~Harness() {
    in_.close();
    if (thread_.joinable()) thread_.join();
  }
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  void raw(std::string_view text) { in_.write(text); }
  void send(const json& msg) { in_.write(msg.dump() + "\n"); }
  void request(const json& id, const std::string& method, json params = json::object()) {
    send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}});
  }
  void notify(const std::string& method, json params = json::object()) {
    send({{"jsonrpc", "2.0"}, {"method", method}, {"params", std::move(params)}});
  }

  // The reply (result or error) to `id`; fails the test if none comes.
  json reply(const json& id, std::chrono::milliseconds timeout = kWait) {
    auto r = out_.wait_for([&](const json& m) { return m.contains("id") && m["id"] == id && !m.contains("method"); },
                           timeout);
    EXPECT_TRUE(r.has_value()) << "no reply to " << id.dump() << "; output so far:\n" << dump_output();
    return r.value_or(json::object());
  }
  // A request and its reply.
  json call(const json& id, const std::string& method, json params = json::object()) {
    request(id, method, std::move(params));
    return reply(id);
  }
  json tool(const json& id, const std::string& name, json arguments = json::object(), json meta = nullptr) {
    json params = {{"name", name}, {"arguments", std::move(arguments)}};
    if (!meta.is_null()) params["_meta"] = std::move(meta);
    return call(id, "tools/call", std::move(params));
  }
  // How many replies to `id` were written so far.
  std::size_t replies_to(const json& id) const {
    std::size_t n = 0;
    for (const json& m : messages()) n += m.contains("id") && m["id"] == id && !m.contains("method");
    return n;
  }
  // Sends tools/call `name` with `id` until it is not refused with `refusal` (the previous call
  // with that id may take a moment to leave the in-flight table after its reply). Returns the reply.
  json tool_when_free(const json& id, const std::string& name, int refusal) {
    json r;
    for (int attempt = 0; attempt < 500; ++attempt) {
      const std::size_t before = replies_to(id);
      request(id, "tools/call", {{"name", name}});
      auto m = out_.wait_for(
          [&](const json& msg) { return msg.contains("id") && msg["id"] == id && !msg.contains("method"); }, kWait,
          before);
      if (!m) break;
      r = *m;
      if (!r.contains("error") || r["error"]["code"] != refusal) return r;
      std::this_thread::sleep_for(2ms);
    }
    ADD_FAILURE() << "tools/call " << id.dump() << " refused every time: " << r.dump();
    return r;
  }
  bool has_reply(const json& id, std::chrono::milliseconds timeout) {
    return out_.wait_for([&](const json& m) { return m.contains("id") && m["id"] == id && !m.contains("method"); },
                         timeout)
        .has_value();
  }
  // A ping answered shows the server still serves, and that everything sent before was read.
  void expect_alive(const std::string& tag = "alive") {
    json r = call(tag, "ping");
    EXPECT_EQ(r.value("result", json()), json::object()) << r.dump();
  }

  // Closes stdin and waits for run() to return; returns its exit code.
  int finish() {
    in_.close();
    thread_.join();
    return rc_;
  }
  bool returned() const { return returned_; }

  std::vector<json> messages() const {
    std::vector<json> all = out_.parsed();
    for (const json& m : all) EXPECT_FALSE(m.is_discarded()) << "not JSON on the output";
    return all;
  }
  std::vector<json> progress_for(const json& token) const {
    std::vector<json> r;
    for (const json& m : messages()) {
      if (m.value("method", "") == "notifications/progress" && m["params"]["progressToken"] == token)
        r.push_back(m["params"]);
    }
    return r;
  }
  std::string dump_output() const {
    std::string s;
    for (const std::string& line : out_.lines()) s += line + "\n";
    return s;
  }
  OutputSink& out() { return out_; }
  const OutputSink& out() const { return out_; }

 private:
  InputPipe in_;
  OutputSink out_;
  std::istream in_stream_;
  std::ostream out_stream_;
  StdioServer server_;
  std::thread thread_;
  int rc_ = -1;
  std::atomic<bool> returned_{false};
};

// Runs a whole transcript (then EOF) through a server fed by a std::stringstream; returns what it wrote.
std::vector<json> transcript(TestHandler& handler, const std::string& input, ServerOptions opts = quick_options()) {
  std::istringstream in(input);
  std::ostringstream out;
  StdioServer server(handler, in, out, std::move(opts));
  EXPECT_EQ(server.run(), 0);
  std::vector<json> messages;
  std::istringstream lines(out.str());
  for (std::string line; std::getline(lines, line);) {
    json j = json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON on stdout: " << line;
    messages.push_back(j);
  }
  EXPECT_TRUE(out.str().empty() || out.str().back() == '\n');
  return messages;
}

void expect_error(const json& reply, int code, const std::string& message_part = "") {
  ASSERT_TRUE(reply.contains("error")) << reply.dump();
  EXPECT_EQ(reply["jsonrpc"], "2.0");
  EXPECT_FALSE(reply.contains("result"));
  EXPECT_EQ(reply["error"]["code"], code) << reply.dump();
  EXPECT_TRUE(reply["error"]["message"].is_string());
  if (!message_part.empty()) {
    EXPECT_NE(reply["error"]["message"].get<std::string>().find(message_part), std::string::npos) << reply.dump();
  }
}

json modern_meta(std::string version = std::string(kModernVersion)) {
  return {{"io.modelcontextprotocol/protocolVersion", std::move(version)},
          {"io.modelcontextprotocol/clientCapabilities", json::object()},
          {"io.modelcontextprotocol/clientInfo", {{"name", "test"}, {"version", "1"}}}};
}

json server_info() { return {{"name", std::string(server_name())}, {"version", std::string(server_version())}}; }

void add_echo(TestHandler& h) {
  h.add("echo", [](Call& c) { return text_reply(c.arguments.dump()); });
}

// ---- legacy era ------------------------------------------------------------------------

TEST(JsonRpcLegacy, InitializeEchoesSupportedVersions) {
  for (const char* v : {"2025-11-25", "2025-06-18", "2025-03-26"}) {
    TestHandler h;
    Harness s(h);
    json r = s.call(1, "initialize",
                    {{"protocolVersion", v}, {"capabilities", json::object()}, {"clientInfo", {{"name", "t"}}}});
    ASSERT_TRUE(r.contains("result")) << r.dump();
    EXPECT_EQ(r["id"], 1);
    EXPECT_EQ(r["result"]["protocolVersion"], v);
    json caps = {{"tools", {{"listChanged", false}}}};
    if (std::string(v) == "2025-11-25")  // the version with MCP tasks
      caps["tasks"] = {{"list", json::object()}, {"cancel", json::object()},
                       {"requests", {{"tools", {{"call", json::object()}}}}}};
    EXPECT_EQ(r["result"]["capabilities"], caps);
    EXPECT_EQ(r["result"]["serverInfo"], server_info());
    EXPECT_EQ(r["result"]["serverInfo"]["name"], "kgate-mcp");
    EXPECT_FALSE(r["result"].contains("instructions"));
    EXPECT_FALSE(r["result"].contains("resultType"));
  }
}

TEST(JsonRpcLegacy, InitializeWithOtherVersionsGetsTheNewestLegacy) {
  for (json v : {json("2024-11-05"), json("2026-07-28"), json("banana"), json(nullptr)}) {
    TestHandler h;
    Harness s(h);
    json params = {{"capabilities", json::object()}};
    if (!v.is_null()) params["protocolVersion"] = v;
    json r = s.call("init", "initialize", params);
    EXPECT_EQ(r["result"]["protocolVersion"], "2025-11-25") << v.dump();
  }
  TestHandler h;
  Harness s(h);
  expect_error(s.call(1, "initialize", {{"protocolVersion", 20251125}}), rpc_error::kInvalidParams, "protocolVersion");
  s.expect_alive();
}

TEST(JsonRpcLegacy, AnOddClientInfoIsNoProblem) {
  TestHandler h;
  Harness s(h);
  int id = 0;
  for (json info : {json({{"name", 5}, {"version", json::array()}}), json("claude"), json(nullptr)}) {
    json r = s.call(++id, "initialize", {{"protocolVersion", "2025-06-18"}, {"clientInfo", info}});
    EXPECT_EQ(r["result"]["protocolVersion"], "2025-06-18") << r.dump();
  }
}

TEST(JsonRpcLegacy, InstructionsAreSentWhenSet) {
  TestHandler h;
  ServerOptions o = quick_options();
  o.instructions = "Use connect first.";
  Harness s(h, o);
  EXPECT_EQ(s.call(1, "initialize", {{"protocolVersion", "2025-06-18"}})["result"]["instructions"],
            "Use connect first.");
  EXPECT_EQ(s.call(2, "server/discover")["result"]["instructions"], "Use connect first.");
}

TEST(JsonRpcLegacy, PingAndIdsOfEveryKind) {
  TestHandler h;
  Harness s(h);
  for (json id : {json(0), json(-7), json(123456789012LL), json(1.5), json("abc"), json("")}) {
    json r = s.call(id, "ping");
    EXPECT_EQ(r["id"], id);
    EXPECT_EQ(r["result"], json::object());
    EXPECT_EQ(r["jsonrpc"], "2.0");
  }
  // A ping without params.
  s.send({{"jsonrpc", "2.0"}, {"id", 99}, {"method", "ping"}});
  EXPECT_EQ(s.reply(99)["result"], json::object());
}

TEST(JsonRpcLegacy, NotificationsGetNoReply) {
  TestHandler h;
  Harness s(h);
  s.call(1, "initialize", {{"protocolVersion", "2025-11-25"}});
  s.notify("notifications/initialized");
  s.notify("notifications/roots/list_changed");
  s.notify("notifications/whatever", {{"x", 1}});
  s.notify("ping");  // a ping without an id is a notification
  s.send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}, {"params", 5}});
  s.expect_alive();
  EXPECT_EQ(s.messages().size(), 2u) << s.dump_output();
}

TEST(JsonRpcLegacy, RequestsBeforeInitializeAreAnswered) {
  TestHandler h;
  add_echo(h);
  Harness s(h);
  json r = s.call(1, "tools/list");
  ASSERT_TRUE(r.contains("result")) << r.dump();
  EXPECT_EQ(r["result"]["tools"].size(), 1u);
  r = s.tool(2, "echo", {{"a", 1}});
  EXPECT_EQ(r["result"]["content"][0]["text"], R"({"a":1})");
  ASSERT_EQ(h.seen().size(), 1u);
  EXPECT_EQ(h.seen()[0].protocol_version, "2025-11-25");
  EXPECT_FALSE(h.seen()[0].modern);
}

TEST(JsonRpcLegacy, CallsCarryTheNegotiatedVersion) {
  TestHandler h;
  add_echo(h);
  Harness s(h);
  s.call(1, "initialize", {{"protocolVersion", "2025-06-18"}});
  s.tool(2, "echo");
  ASSERT_EQ(h.seen().size(), 1u);
  EXPECT_EQ(h.seen()[0].protocol_version, "2025-06-18");
  EXPECT_FALSE(h.seen()[0].modern);
}

TEST(JsonRpcLegacy, ToolsListIsTheHandlersList) {
  TestHandler h;
  add_echo(h);
  h.add("another", [](Call&) { return ToolReply{}; });
  Harness s(h);
  json r = s.call(1, "tools/list", {{"cursor", "ignored"}});
  EXPECT_EQ(r["result"]["tools"], h.tool_list());
  EXPECT_FALSE(r["result"].contains("ttlMs"));
  EXPECT_FALSE(r["result"].contains("resultType"));
  EXPECT_FALSE(r["result"].contains("nextCursor"));
}

// ---- framing and malformed input -------------------------------------------------------

TEST(JsonRpcFraming, BlankLinesCrlfAndAFinalLineWithoutNewline) {
  TestHandler h;
  auto out = transcript(h,
                        "\n\n   \n\t\r\n"
                        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r\n"
                        "\n"
                        "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["id"], 1);
  EXPECT_EQ(out[1]["id"], 2);
  EXPECT_EQ(h.shutdowns(), 1);
}

TEST(JsonRpcFraming, ParseErrorsHaveANullId) {
  TestHandler h;
  Harness s(h);
  for (const char* bad : {"{", "not json", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"} trailing",
                          "{'single':'quotes'}", "\"\xff\xfe\"", "{\"a\":\"\xc3\"}", "nul\x01l", "[1,]"}) {
    s.raw(std::string(bad) + "\n");
  }
  s.expect_alive();
  auto msgs = s.messages();
  ASSERT_EQ(msgs.size(), 9u) << s.dump_output();
  for (std::size_t i = 0; i < 8; ++i) {
    expect_error(msgs[i], rpc_error::kParseError, "Parse error");
    EXPECT_TRUE(msgs[i]["id"].is_null());
  }
}

TEST(JsonRpcFraming, BatchesAreRefused) {
  TestHandler h;
  Harness s(h);
  s.raw(R"([{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}])" "\n");
  s.raw("[]\n");
  s.expect_alive();
  auto msgs = s.messages();
  ASSERT_EQ(msgs.size(), 3u) << s.dump_output();
  for (int i = 0; i < 2; ++i) {
    expect_error(msgs[i], rpc_error::kInvalidRequest, "batches are not supported");
    EXPECT_TRUE(msgs[i]["id"].is_null());
  }
}

TEST(JsonRpcFraming, NonObjectsAreInvalidRequests) {
  TestHandler h;
  Harness s(h);
  for (const char* v : {"1", "\"ping\"", "null", "true"}) s.raw(std::string(v) + "\n");
  s.expect_alive();
  auto msgs = s.messages();
  ASSERT_EQ(msgs.size(), 5u);
  for (int i = 0; i < 4; ++i) expect_error(msgs[i], rpc_error::kInvalidRequest);
}

TEST(JsonRpcFraming, AnOversizedLineIsSkipped) {
  TestHandler h;
  ServerOptions o = quick_options();
  o.max_line_bytes = 1000;
  Harness s(h, o);
  // Over the limit by far, and by one; then exactly at it.
  s.raw(R"({"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":")" + std::string(300000, 'a') + "\"}}\n");
  std::string at_limit = R"({"jsonrpc":"2.0","id":3,"method":"ping","params":{"x":")";
  at_limit += std::string(1000 - at_limit.size() - 3, 'b') + "\"}}";
  ASSERT_EQ(at_limit.size(), 1000u);
  std::string over = at_limit;
  over.insert(over.size() - 3, "c");
  over.replace(over.find("\"id\":3"), 6, "\"id\":2");
  s.raw(over + "\n");
  s.raw(at_limit + "\n");
  EXPECT_EQ(s.reply(3)["result"], json::object());
  auto msgs = s.messages();
  ASSERT_EQ(msgs.size(), 3u) << s.dump_output();
  expect_error(msgs[0], rpc_error::kParseError, "exceeds the limit of 1000 bytes");
  EXPECT_TRUE(msgs[0]["id"].is_null());
  EXPECT_NE(msgs[0]["error"]["message"].get<std::string>().find("300058"), std::string::npos) << msgs[0].dump();
  expect_error(msgs[1], rpc_error::kParseError, "1001 bytes");
  s.expect_alive();
}

TEST(JsonRpcFraming, DeepNestingIsRefused) {
  TestHandler h;
  Harness s(h);
  s.raw(std::string(1000000, '[') + std::string(1000000, ']') + "\n");
  // Brackets inside strings do not count.
  s.raw(R"({"jsonrpc":"2.0","id":1,"method":"ping","params":{"s":")" + std::string(5000, '[') + "\"}}\n");
  EXPECT_EQ(s.reply(1)["result"], json::object());
  auto msgs = s.messages();
  ASSERT_EQ(msgs.size(), 2u);
  expect_error(msgs[0], rpc_error::kParseError, "nested deeper");
}

TEST(JsonRpcFraming, RunUntiesTheInput) {
  // std::cin is tied to std::cout; a tied input would flush the output from the reader thread.
  TestHandler h;
  std::istringstream in("");
  std::ostringstream out;
  in.tie(&out);
  StdioServer server(h, in, out, quick_options());
  EXPECT_EQ(server.run(), 0);
  EXPECT_EQ(in.tie(), nullptr);
}

TEST(JsonRpcFraming, OutputLinesAreSingleJsonObjects) {
  TestHandler h;
  h.add("multiline", [](Call&) { return text_reply("line one\nline two\r\n\ttab \xe2\x9c\x93 \xff bad utf8"); });
  Harness s(h);
  json r = s.tool(1, "multiline");
  EXPECT_EQ(r["result"]["content"][0]["text"].get<std::string>().substr(0, 17), "line one\nline two");
  for (const std::string& line : s.out().lines()) {
    EXPECT_EQ(line.find('\n'), std::string::npos);
    json j = json::parse(line);  // throws on invalid UTF-8
    EXPECT_TRUE(j.is_object());
  }
  EXPECT_TRUE(s.out().partial().empty());
}

// ---- invalid requests ------------------------------------------------------------------

TEST(JsonRpcInvalid, UnknownMethod) {
  TestHandler h;
  Harness s(h);
  for (const char* m : {"resources/list", "prompts/list", "logging/setLevel", "tools/cal", "", "notifications/initialized"}) {
    json r = s.call(m, m);
    expect_error(r, rpc_error::kMethodNotFound, "Method not found");
    EXPECT_EQ(r["id"], m);
  }
  s.expect_alive();
}

TEST(JsonRpcInvalid, BadIds) {
  TestHandler h;
  Harness s(h);
  for (json id : {json(true), json(nullptr), json::object(), json::array({1})}) {
    s.send({{"jsonrpc", "2.0"}, {"id", id}, {"method", "ping"}});
  }
  s.expect_alive();
  auto msgs = s.messages();
  ASSERT_EQ(msgs.size(), 5u) << s.dump_output();
  for (int i = 0; i < 4; ++i) {
    expect_error(msgs[i], rpc_error::kInvalidRequest, "id");
    EXPECT_TRUE(msgs[i]["id"].is_null());
  }
}

TEST(JsonRpcInvalid, BadEnvelopes) {
  TestHandler h;
  Harness s(h);
  s.send({{"id", 1}, {"method", "ping"}});                        // no jsonrpc
  s.send({{"jsonrpc", "1.0"}, {"id", 2}, {"method", "ping"}});    // wrong jsonrpc
  s.send({{"jsonrpc", 2.0}, {"id", 3}, {"method", "ping"}});      // not a string
  s.send({{"jsonrpc", "2.0"}, {"id", 4}, {"method", 17}});        // method not a string
  s.send({{"jsonrpc", "2.0"}, {"id", 5}});                        // no method
  s.send({{"jsonrpc", "2.0"}, {"method", 3}});                    // no id, bad method: still an error
  for (int id = 1; id <= 5; ++id) {
    json r = s.reply(id);
    expect_error(r, rpc_error::kInvalidRequest, "Invalid Request");
  }
  s.expect_alive();
  EXPECT_EQ(s.messages().size(), 7u) << s.dump_output();
}

TEST(JsonRpcInvalid, ParamsMustBeAnObject) {
  TestHandler h;
  add_echo(h);
  Harness s(h);
  expect_error(s.call(1, "ping", json::array({1, 2})), rpc_error::kInvalidParams, "params");
  expect_error(s.call(2, "tools/list", "x"), rpc_error::kInvalidParams, "params");
  EXPECT_EQ(s.call(3, "ping", nullptr)["result"], json::object());  // null counts as absent
}

TEST(JsonRpcInvalid, ResponsesFromTheClientAreIgnored) {
  TestHandler h;
  Harness s(h);
  s.send({{"jsonrpc", "2.0"}, {"id", 1}, {"result", json::object()}});
  s.send({{"jsonrpc", "2.0"}, {"id", 2}, {"error", {{"code", -1}, {"message", "x"}}}});
  s.expect_alive();
  EXPECT_EQ(s.messages().size(), 1u) << s.dump_output();
}

TEST(JsonRpcInvalid, AnExceptionInTheServerIsAnInternalError) {
  TestHandler h;
  h.throw_on_list = true;
  Harness s(h);
  json r = s.call(1, "tools/list");
  expect_error(r, rpc_error::kInternalError, "list broke");
  EXPECT_EQ(r["id"], 1);
  expect_error(s.tool(2, "echo"), rpc_error::kInternalError);
  s.expect_alive();
}

// ---- modern era ------------------------------------------------------------------------

TEST(JsonRpcModern, Discover) {
  TestHandler h;
  Harness s(h);
  json r = s.call("server-discover-probe-1", "server/discover", {{"_meta", modern_meta()}});
  ASSERT_TRUE(r.contains("result")) << r.dump();
  const json& res = r["result"];
  EXPECT_EQ(res["resultType"], "complete");
  EXPECT_EQ(res["supportedVersions"], json({"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"}));
  EXPECT_EQ(res["capabilities"], json::parse(R"({"tools":{},"extensions":{"io.modelcontextprotocol/tasks":{}}})"));
  EXPECT_EQ(res["_meta"]["io.modelcontextprotocol/serverInfo"], server_info());
  EXPECT_TRUE(res["ttlMs"].is_number_integer());
  EXPECT_GT(res["ttlMs"].get<long long>(), 0);
  EXPECT_EQ(res["cacheScope"], "public");
  EXPECT_FALSE(res.contains("instructions"));
  // Without _meta too.
  EXPECT_EQ(s.call(2, "server/discover")["result"]["resultType"], "complete");
}

TEST(JsonRpcModern, ResultsCarryResultTypeAndServerInfo) {
  TestHandler h;
  add_echo(h);
  Harness s(h);
  json list = s.call(1, "tools/list", {{"_meta", modern_meta()}})["result"];
  EXPECT_EQ(list["resultType"], "complete");
  EXPECT_EQ(list["_meta"]["io.modelcontextprotocol/serverInfo"], server_info());
  EXPECT_EQ(list["tools"], h.tool_list());
  EXPECT_TRUE(list["ttlMs"].is_number_integer());
  EXPECT_EQ(list["cacheScope"], "public");

  json ping = s.call(2, "ping", {{"_meta", modern_meta()}})["result"];
  EXPECT_EQ(ping["resultType"], "complete");

  json call = s.tool(3, "echo", {{"x", 1}}, modern_meta())["result"];
  EXPECT_EQ(call["resultType"], "complete");
  EXPECT_EQ(call["_meta"]["io.modelcontextprotocol/serverInfo"], server_info());
  EXPECT_EQ(call["isError"], false);
  EXPECT_FALSE(call.contains("ttlMs"));
  ASSERT_EQ(h.seen().size(), 1u);
  EXPECT_TRUE(h.seen()[0].modern);
  EXPECT_EQ(h.seen()[0].protocol_version, "2026-07-28");
}

TEST(JsonRpcModern, VersionErrors) {
  TestHandler h;
  add_echo(h);
  Harness s(h);
  json r = s.call(1, "tools/list", {{"_meta", modern_meta("2027-03-30")}});
  expect_error(r, rpc_error::kUnsupportedProtocolVersion, "2027-03-30");
  EXPECT_EQ(r["error"]["data"]["requested"], "2027-03-30");
  EXPECT_EQ(r["error"]["data"]["supported"], json({"2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"}));
  expect_error(s.call(2, "server/discover", {{"_meta", modern_meta("1999-01-01")}}),
               rpc_error::kUnsupportedProtocolVersion);

  json no_caps = modern_meta();
  no_caps.erase("io.modelcontextprotocol/clientCapabilities");
  expect_error(s.call(3, "tools/list", {{"_meta", no_caps}}), rpc_error::kInvalidParams, "clientCapabilities");
  no_caps["io.modelcontextprotocol/clientCapabilities"] = "yes";
  expect_error(s.call(4, "tools/call", {{"name", "echo"}, {"_meta", no_caps}}), rpc_error::kInvalidParams,
               "clientCapabilities");
  json bad_version = modern_meta();
  bad_version["io.modelcontextprotocol/protocolVersion"] = 20260728;
  expect_error(s.call(5, "ping", {{"_meta", bad_version}}), rpc_error::kInvalidParams, "protocolVersion");
  EXPECT_EQ(h.started(), 0);
  s.expect_alive();
}

TEST(JsonRpcModern, ALegacyVersionInMetaIsServedTheLegacyWay) {
  TestHandler h;
  add_echo(h);
  Harness s(h);
  json r = s.tool(1, "echo", json::object(), modern_meta("2025-06-18"));
  ASSERT_TRUE(r.contains("result")) << r.dump();
  EXPECT_FALSE(r["result"].contains("resultType"));
  EXPECT_EQ(h.seen()[0].protocol_version, "2025-06-18");
  EXPECT_FALSE(h.seen()[0].modern);
}

// ---- tools/call ------------------------------------------------------------------------

TEST(JsonRpcTools, BadCalls) {
  TestHandler h;
  add_echo(h);
  Harness s(h);
  json r = s.tool(1, "nope");
  expect_error(r, rpc_error::kInvalidParams);
  EXPECT_EQ(r["error"]["message"], "Unknown tool: nope");
  expect_error(s.call(2, "tools/call", {{"arguments", json::object()}}), rpc_error::kInvalidParams, "name");
  expect_error(s.call(3, "tools/call", {{"name", 5}}), rpc_error::kInvalidParams, "name");
  expect_error(s.call(4, "tools/call", {{"name", "echo"}, {"arguments", json::array()}}), rpc_error::kInvalidParams,
               "arguments");
  expect_error(s.call(5, "tools/call", {{"name", "echo"}, {"arguments", "x=1"}}), rpc_error::kInvalidParams,
               "arguments");
  EXPECT_EQ(h.started(), 0);
  // Absent and null arguments are an empty object.
  EXPECT_EQ(s.call(6, "tools/call", {{"name", "echo"}})["result"]["content"][0]["text"], "{}");
  EXPECT_EQ(s.call(7, "tools/call", {{"name", "echo"}, {"arguments", nullptr}})["result"]["content"][0]["text"], "{}");
}

TEST(JsonRpcTools, ReplyShapes) {
  TestHandler h;
  h.add("ok", [](Call&) { return text_reply("fine"); });
  h.add("soft_error", [](Call&) { return text_reply("kernel gone", true); });
  h.add("invalid", [](Call&) -> ToolReply { throw InvalidParams("code must be a string"); });
  h.add("crash", [](Call&) -> ToolReply { throw std::runtime_error("gateway exploded"); });
  h.add("weird", [](Call&) -> ToolReply { throw 42; });
  h.add("empty", [](Call&) { return ToolReply{}; });
  h.add("malformed", [](Call&) {
    ToolReply r;
    r.content = "not an array";
    return r;
  });
  Harness s(h);
  EXPECT_EQ(s.tool(1, "ok")["result"], json::parse(R"({"content":[{"type":"text","text":"fine"}],"isError":false})"));
  EXPECT_EQ(s.tool(2, "soft_error")["result"]["isError"], true);
  json r = s.tool(3, "invalid");  // a tool error the model can read, not a JSON-RPC error
  EXPECT_EQ(r["result"]["isError"], true);
  EXPECT_EQ(r["result"]["content"][0], json({{"type", "text"}, {"text", "code must be a string"}}));
  r = s.tool(4, "crash");
  EXPECT_EQ(r["result"]["isError"], true);
  EXPECT_EQ(r["result"]["content"][0], json({{"type", "text"}, {"text", "gateway exploded"}}));
  r = s.tool(5, "weird");
  EXPECT_EQ(r["result"]["isError"], true);
  EXPECT_EQ(s.tool(6, "empty")["result"], json::parse(R"({"content":[],"isError":false})"));
  expect_error(s.tool(7, "malformed"), rpc_error::kInternalError);
  s.expect_alive();
}

TEST(JsonRpcTools, InputRequiredAndItsRetry) {
  // MRTR (2026-07-28): a tool may answer input_required; the retry's inputResponses and
  // requestState reach the tool; they are refused when malformed and ignored in the legacy era.
  TestHandler h;
  h.add("ask", [](Call& c) {
    ToolReply r;
    if (c.request_state.empty()) {
      r.input_requests = json{{"k1", {{"method", "elicitation/create"}, {"params", {{"message", "name?"}}}}}};
      r.request_state = "state-1";
      return r;
    }
    return text_reply(c.request_state + " " + c.input_responses.dump());
  });
  Harness s(h);
  json r = s.tool(1, "ask", json::object(), modern_meta())["result"];
  EXPECT_EQ(r["resultType"], "input_required");
  EXPECT_EQ(r["requestState"], "state-1");
  EXPECT_EQ(r["inputRequests"]["k1"]["method"], "elicitation/create");
  EXPECT_FALSE(r.contains("content"));
  EXPECT_EQ(r["_meta"]["io.modelcontextprotocol/serverInfo"], server_info());
  json retry = {{"name", "ask"}, {"arguments", json::object()}, {"_meta", modern_meta()},
                {"requestState", "state-1"}, {"inputResponses", {{"k1", {{"action", "accept"}}}}}};
  r = s.call(2, "tools/call", retry)["result"];
  EXPECT_EQ(r["resultType"], "complete");
  EXPECT_EQ(r["content"][0]["text"], R"(state-1 {"k1":{"action":"accept"}})");
  json bad = retry;
  bad["inputResponses"] = json::array();
  expect_error(s.call(3, "tools/call", bad), rpc_error::kInvalidParams, "inputResponses");
  bad = retry;
  bad["requestState"] = 7;
  expect_error(s.call(4, "tools/call", bad), rpc_error::kInvalidParams, "requestState");
  // The legacy era has no MRTR: the fields are not the client's to send, and are not read.
  json legacy = retry;
  legacy.erase("_meta");
  r = s.call(5, "tools/call", legacy)["result"];
  EXPECT_EQ(r["inputRequests"], nullptr) << r.dump();
  EXPECT_FALSE(r.contains("resultType"));
  s.expect_alive();
}

// ---- arguments against inputSchema ------------------------------------------------------

json run_schema() {
  return json::parse(R"({
    "type": "object",
    "properties": {
      "code": {"type": "string", "minLength": 1, "maxLength": 8, "description": "Python code"},
      "timeout": {"type": "number", "minimum": 0, "maximum": 3600},
      "tries": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 5},
      "mode": {"type": "string", "enum": ["fast", "slow"]},
      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
      "opt": {"type": "object", "properties": {"deep": {"type": "boolean"}}, "additionalProperties": false},
      "any": {"type": ["string", "null"]}
    },
    "required": ["code"],
    "additionalProperties": false
  })");
}

TEST(JsonRpcSchema, ArgumentsThatFitPass) {
  const json schema = run_schema();
  EXPECT_EQ(check_arguments(schema, {{"code", "1+1"}}), "");
  EXPECT_EQ(check_arguments(schema, {{"code", "é"}, {"timeout", 0}, {"tries", 4.0}, {"mode", "slow"},
                                     {"tags", {"a", "b"}}, {"opt", {{"deep", true}}}, {"any", nullptr}}),
            "");
  EXPECT_EQ(check_arguments(schema, {{"code", "x"}, {"timeout", 3600.0}, {"any", "s"}}), "");
  EXPECT_EQ(check_arguments(json::object(), {{"whatever", 1}}), "");  // no keywords: anything goes
  EXPECT_EQ(check_arguments({{"type", "object"}, {"description", "ignored"}, {"title", "t"}}, {{"x", 1}}), "");
  // A count of code points, not bytes: eight two-byte characters fit maxLength 8.
  EXPECT_EQ(check_arguments(schema, {{"code", "éééééééé"}}), "");
}

TEST(JsonRpcSchema, EachProblemNamesTheArgumentAndWhatWasExpected) {
  const json schema = run_schema();
  auto check = [&](json args) { return check_arguments(schema, args); };
  EXPECT_EQ(check({{"code", "1"}, {"timeout", "abc"}}), "'timeout' must be a number, not a string (\"abc\").");
  EXPECT_EQ(check({{"code", "1"}, {"timeout", true}}), "'timeout' must be a number, not a boolean (true).");
  EXPECT_EQ(check(json::object()), "'code' (a string) is required.");
  EXPECT_EQ(check({{"code", 5}}), "'code' must be a string, not an integer (5).");
  EXPECT_EQ(check({{"code", "1"}, {"bogus", 1}}),
            "unknown argument 'bogus' (the arguments are: any, code, mode, opt, tags, timeout, tries).");
  EXPECT_EQ(check({{"code", "1"}, {"timeout", -1}}), "'timeout' must be at least 0, not -1.");
  EXPECT_EQ(check({{"code", "1"}, {"timeout", 3600.5}}), "'timeout' must be at most 3600, not 3600.5.");
  EXPECT_EQ(check({{"code", "1"}, {"tries", 2.5}}), "'tries' must be an integer, not a number (2.5).");
  EXPECT_EQ(check({{"code", "1"}, {"tries", 0}}), "'tries' must be greater than 0, not 0.");
  EXPECT_EQ(check({{"code", "1"}, {"tries", 5}}), "'tries' must be less than 5, not 5.");
  EXPECT_EQ(check({{"code", "1"}, {"mode", "medium"}}), "'mode' must be one of \"fast\", \"slow\", not \"medium\".");
  EXPECT_EQ(check({{"code", ""}}), "'code' must be at least 1 characters long.");
  EXPECT_EQ(check({{"code", "123456789"}}), "'code' must be at most 8 characters long, not 9.");
  EXPECT_EQ(check({{"code", "1"}, {"tags", {"a", 2}}}), "'tags[1]' must be a string, not an integer (2).");
  EXPECT_EQ(check({{"code", "1"}, {"tags", {"a", "b", "c"}}}), "'tags' must have at most 2 items, not 3.");
  EXPECT_EQ(check({{"code", "1"}, {"opt", {{"deep", 1}}}}), "'opt.deep' must be a boolean, not an integer (1).");
  EXPECT_EQ(check({{"code", "1"}, {"opt", {{"wide", 1}}}}), "unknown argument 'opt.wide' (the arguments are: deep).");
  EXPECT_EQ(check({{"code", "1"}, {"any", 3}}), "'any' must be a string or a null, not an integer (3).");
  // Every problem is told, not only the first.
  EXPECT_EQ(check({{"timeout", "x"}, {"zzz", 1}}),
            "'code' (a string) is required. 'timeout' must be a number, not a string (\"x\"). "
            "unknown argument 'zzz' (the arguments are: any, code, mode, opt, tags, timeout, tries).");
  // A long value is shown cut, never inside a multi-byte character.
  std::string text = check({{"code", 1}, {"timeout", std::string(30, 'a') + std::string(20, '\xc3') }});
  EXPECT_NE(text.find("..."), std::string::npos) << text;
  EXPECT_EQ(check_arguments({{"type", "object"}, {"additionalProperties", false}}, {{"x", 1}}),
            "unknown argument 'x' (this tool takes no arguments).");
}

TEST(JsonRpcSchema, TheServerRefusesACallThatBreaksTheSchemaAsAToolError) {
  TestHandler h;
  h.add("run", [](Call& c) { return text_reply("ran " + c.arguments.dump()); }, run_schema());
  Harness s(h);
  json r = s.tool(1, "run", {{"code", "1"}, {"timeout", "abc"}});
  ASSERT_TRUE(r.contains("result")) << r.dump();
  EXPECT_EQ(r["result"]["isError"], true);
  EXPECT_EQ(r["result"]["content"][0]["text"], "Invalid arguments for run: 'timeout' must be a number, not a string (\"abc\").");
  r = s.tool(2, "run", {{"code", "1"}, {"extra", 1}}, modern_meta());
  EXPECT_EQ(r["result"]["isError"], true);
  EXPECT_EQ(r["result"]["resultType"], "complete");
  EXPECT_NE(r["result"]["content"][0]["text"].get<std::string>().find("'extra'"), std::string::npos);
  EXPECT_EQ(h.started(), 0);  // the tool never ran
  r = s.tool(3, "run", {{"code", "1"}});
  EXPECT_EQ(r["result"]["isError"], false);
  EXPECT_EQ(r["result"]["content"][0]["text"], R"(ran {"code":"1"})");
  EXPECT_EQ(h.started(), 1);
  s.expect_alive();
}

TEST(JsonRpcTools, CallsRunConcurrentlyAndRepliesAreMatchedById) {
  TestHandler h;
  Gate first_may_finish;
  std::atomic<int> inside{0};
  h.add("slow", [&](Call& c) {
    ++inside;
    // Both calls must be inside at once: the first waits for the second to arrive.
    const auto deadline = Clock::now() + kWait;
    while (inside < 2 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    if (c.arguments["n"] == 1) first_may_finish.wait(c, false);
    return text_reply("done " + c.arguments["n"].dump());
  });
  Harness s(h);
  s.request("a", "tools/call", {{"name", "slow"}, {"arguments", {{"n", 1}}}});
  s.request("b", "tools/call", {{"name", "slow"}, {"arguments", {{"n", 2}}}});
  json b = s.reply("b");  // the second finishes first
  EXPECT_EQ(b["result"]["content"][0]["text"], "done 2");
  EXPECT_FALSE(s.has_reply("a", 50ms));
  s.expect_alive();  // the reader is not blocked by calls in flight
  first_may_finish.open();
  json a = s.reply("a");
  EXPECT_EQ(a["result"]["content"][0]["text"], "done 1");
  auto msgs = s.messages();
  std::vector<json> order;
  for (const json& m : msgs) order.push_back(m["id"]);
  EXPECT_EQ(order, (std::vector<json>{"b", "alive", "a"}));
}

TEST(JsonRpcTools, ADuplicateIdInFlightIsRefused) {
  TestHandler h;
  Gate gate;
  h.add("block", [&](Call& c) {
    gate.wait(c, false);
    return text_reply("ok");
  });
  Harness s(h);
  s.request(7, "tools/call", {{"name", "block"}});
  ASSERT_TRUE(h.wait_started(1));
  json dup = s.tool(7, "block");
  expect_error(dup, rpc_error::kInvalidRequest, "already used");
  gate.open();
  auto first = s.out().wait_for([](const json& m) { return m.contains("result") && m["id"] == 7; }, kWait);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ((*first)["result"]["isError"], false);
  // Once finished, the id may be used again.
  EXPECT_EQ(s.tool_when_free(7, "block", rpc_error::kInvalidRequest)["result"]["isError"], false);
  EXPECT_EQ(h.started(), 2);
}

TEST(JsonRpcTools, MaxConcurrent) {
  TestHandler h;
  Gate gate;
  h.add("block", [&](Call& c) {
    gate.wait(c, false);
    return text_reply("ok");
  });
  ServerOptions o = quick_options();
  o.max_concurrent = 2;
  Harness s(h, o);
  s.request(1, "tools/call", {{"name", "block"}});
  s.request(2, "tools/call", {{"name", "block"}});
  ASSERT_TRUE(h.wait_started(2));
  json third = s.tool(3, "block");
  expect_error(third, rpc_error::kTooManyCalls, "too many calls in flight");
  EXPECT_EQ(rpc_error::kTooManyCalls, -32010);
  EXPECT_EQ(h.started(), 2);
  gate.open();
  s.reply(1);
  s.reply(2);
  EXPECT_EQ(s.tool_when_free(4, "block", rpc_error::kTooManyCalls)["result"]["isError"], false);
}

TEST(JsonRpcTools, ProgressIsAtMostOneASecond) {
  // A tool's loop that spins (a declined input() whose interrupt has not landed) sent hundreds
  // of notifications a second; a client hears at most one a second per call.
  TestHandler h;
  h.add("spin", [&](Call& c) {
    for (int i = 1; i <= 500; ++i) c.progress(i, std::nullopt, "spinning");
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    for (int i = 501; i <= 1000; ++i) c.progress(i, std::nullopt, "spinning");
    return text_reply("ok");
  });
  Harness s(h);
  s.tool(1, "spin", json::object(), {{"progressToken", 7}});
  auto p = s.progress_for(7);
  ASSERT_EQ(p.size(), 2u) << s.dump_output();
  EXPECT_EQ(p[0]["progress"], 1.0);
  EXPECT_EQ(p[1]["progress"], 501.0);
}

TEST(JsonRpcTools, ProgressOnlyWithATokenAndIncreasing) {
  TestHandler h;
  std::function<void(double, std::optional<double>, const std::string&)> kept;
  std::mutex kept_mutex;
  h.add("work", [&](Call& c) {
    c.progress(1, 10, "starting");
    c.progress(1, 10, "same again");   // not an increase: dropped
    c.progress(0.5, std::nullopt, "");  // a decrease: dropped
    c.progress(2, std::nullopt, "");
    c.progress(std::nan(""), std::nullopt, "nan");
    c.progress(5, std::numeric_limits<double>::infinity(), "inf total");
    c.progress(10, 10, "done");
    {
      std::lock_guard lock(kept_mutex);
      kept = c.progress;
    }
    return text_reply("ok");
  });
  ServerOptions every = quick_options();
  every.progress_interval = std::chrono::milliseconds(0);  // this test is about the values, not the rate
  Harness s(h, every);
  // An integer token.
  s.tool(1, "work", json::object(), {{"progressToken", 42}});
  auto p = s.progress_for(42);
  ASSERT_EQ(p.size(), 3u) << s.dump_output();
  EXPECT_EQ(p[0], json::parse(R"({"progressToken":42,"progress":1.0,"total":10.0,"message":"starting"})"));
  EXPECT_EQ(p[1], json::parse(R"({"progressToken":42,"progress":2.0})"));
  EXPECT_EQ(p[2]["progress"], 10.0);
  // Progress comes before the reply.
  auto msgs = s.messages();
  ASSERT_EQ(msgs.size(), 4u);
  EXPECT_EQ(msgs[3]["id"], 1);
  // After the reply, nothing, even through a copy of the function.
  {
    std::lock_guard lock(kept_mutex);
    kept(100, std::nullopt, "late");
  }
  // A string token.
  s.tool(2, "work", json::object(), {{"progressToken", "tok"}});
  EXPECT_EQ(s.progress_for("tok").size(), 3u);
  // No token, or one of the wrong type: no progress at all.
  s.tool(3, "work");
  s.tool(4, "work", json::object(), {{"progressToken", json::object()}});
  s.tool(5, "work", json::object(), {{"progressToken", 1.5}});
  s.expect_alive();
  std::size_t notes = 0;
  for (const json& m : s.messages()) {
    if (m.contains("method")) {
      ++notes;
      EXPECT_EQ(m["method"], "notifications/progress");
      EXPECT_FALSE(m.contains("id"));
    }
  }
  EXPECT_EQ(notes, 6u) << s.dump_output();
  {
    std::lock_guard lock(kept_mutex);
    kept(1000, std::nullopt, "much later");  // the call state is gone: harmless
  }
  EXPECT_EQ(h.seen()[0].progress_token, json(42));
  EXPECT_FALSE(h.seen()[2].progress_token.has_value());
}

TEST(JsonRpcTools, ProgressFromSeveralThreads) {
  TestHandler h;
  h.add("work", [&](Call& c) {
    std::vector<std::thread> threads;
    std::atomic<int> next{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 200; ++i) c.progress(++next, std::nullopt, "");
      });
    }
    for (auto& t : threads) t.join();
    return text_reply("ok");
  });
  Harness s(h);
  s.tool(1, "work", json::object(), {{"progressToken", "p"}});
  auto p = s.progress_for("p");
  ASSERT_FALSE(p.empty());
  for (std::size_t i = 1; i < p.size(); ++i) EXPECT_GT(p[i]["progress"].get<double>(), p[i - 1]["progress"].get<double>());
}

TEST(JsonRpcTools, CancellationSuppressesTheReply) {
  TestHandler h;
  Gate never;
  std::atomic<bool> progress_after_cancel_tried{false};
  h.add("long", [&](Call& c) {
    c.progress(1, std::nullopt, "running");
    const bool opened = never.wait(c, /*honour_cancel=*/true);
    EXPECT_FALSE(opened);
    EXPECT_TRUE(c.cancelled);
    c.progress(2, std::nullopt, "after cancel");
    progress_after_cancel_tried = true;
    return text_reply("interrupted");
  });
  Harness s(h);
  s.request("x", "tools/call", {{"name", "long"}, {"_meta", {{"progressToken", "t"}}}});
  ASSERT_TRUE(h.wait_started(1));
  ASSERT_TRUE(s.out().wait_for([](const json& m) { return m.value("method", "") == "notifications/progress"; }, kWait));
  s.notify("notifications/cancelled", {{"requestId", "x"}, {"reason", "user pressed Esc"}});
  ASSERT_TRUE(h.wait_cancelled(1));
  EXPECT_EQ(h.cancelled_ids(), std::vector<json>{"x"});
  ASSERT_TRUE(h.wait_ended(1));
  EXPECT_TRUE(progress_after_cancel_tried);
  s.expect_alive();
  EXPECT_FALSE(s.has_reply("x", 100ms));
  EXPECT_EQ(s.progress_for("t").size(), 1u);
  // A second cancellation, one for an unknown id, one for a finished call, and malformed ones: ignored.
  s.notify("notifications/cancelled", {{"requestId", "x"}});
  s.notify("notifications/cancelled", {{"requestId", 12345}});
  s.notify("notifications/cancelled", {{"requestId", "alive"}});
  s.notify("notifications/cancelled", json::object());
  s.notify("notifications/cancelled", {{"requestId", json::array()}});
  s.expect_alive("alive2");
  EXPECT_EQ(h.cancelled_ids().size(), 1u);
  EXPECT_EQ(s.messages().size(), 3u) << s.dump_output();  // one progress, two pings
}

TEST(JsonRpcTools, CancellingOneCallLeavesTheOthers) {
  TestHandler h;
  Gate gate;
  h.add("block", [&](Call& c) {
    gate.wait(c, true);
    return text_reply(c.cancelled ? "cancelled" : "finished");
  });
  Harness s(h);
  s.request(1, "tools/call", {{"name", "block"}});
  s.request(2, "tools/call", {{"name", "block"}});
  ASSERT_TRUE(h.wait_started(2));
  s.notify("notifications/cancelled", {{"requestId", 1}});
  ASSERT_TRUE(h.wait_ended(1));
  gate.open();
  EXPECT_EQ(s.reply(2)["result"]["content"][0]["text"], "finished");
  EXPECT_FALSE(s.has_reply(1, 50ms));
}

// ---- EOF -------------------------------------------------------------------------------

// ---- MCP tasks (2025-11-25) ---------------------------------------------------------------

json task_of(const json& created) { return created["result"]["task"]; }

TEST(JsonRpcTasks, OfferedIn20251125Only) {
  TestHandler h;
  {
    Harness s(h);
    json r = s.call(1, "initialize", {{"protocolVersion", "2025-11-25"}});
    EXPECT_EQ(r["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"], json::object()) << r.dump();
    EXPECT_TRUE(r["result"]["capabilities"]["tasks"].contains("cancel"));
  }
  {
    Harness s(h);
    json r = s.call(1, "initialize", {{"protocolVersion", "2025-06-18"}});
    EXPECT_FALSE(r["result"]["capabilities"].contains("tasks")) << r.dump();
    expect_error(s.call(2, "tasks/list"), rpc_error::kMethodNotFound, "tasks/list");
  }
}

TEST(JsonRpcTasks, ATaskKeepsItsResultForTasksResult) {
  TestHandler h;
  Gate gate;
  std::atomic<bool> was_task{false};
  h.add("slow", [&](Call& c) {
    was_task = c.task;
    gate.wait(c, false);
    return text_reply("done");
  }, {{"type", "object"}}, {{"taskSupport", "optional"}});
  h.add("plain", [](Call&) { return text_reply("plain"); });
  Harness s(h);
  s.call(1, "initialize", {{"protocolVersion", "2025-11-25"}});
  json created = s.call(2, "tools/call", {{"name", "slow"}, {"arguments", json::object()}, {"task", {{"ttl", 60000}}}});
  json t = task_of(created);
  ASSERT_TRUE(t.is_object()) << created.dump();
  EXPECT_EQ(t["status"], "working");
  EXPECT_EQ(t["ttl"], 60000);
  EXPECT_TRUE(t["createdAt"].is_string() && t["lastUpdatedAt"].is_string() && t["pollInterval"].is_number());
  const std::string id = t["taskId"];
  ASSERT_TRUE(h.wait_started(1));
  EXPECT_EQ(s.call(3, "tasks/get", {{"taskId", id}})["result"]["status"], "working");
  // tasks/result waits for the end; the session serves other requests meanwhile.
  s.request("r", "tasks/result", {{"taskId", id}});
  EXPECT_FALSE(s.has_reply("r", 100ms));
  s.expect_alive();
  // The request id of the call is free again: the task is keyed by its own id.
  s.request(2, "tools/call", {{"name", "plain"}});
  auto again = s.out().wait_for([](const json& m) { return m.value("id", json()) == 2 && !m.contains("method"); },
                                kWait, /*n=*/1);
  ASSERT_TRUE(again.has_value()) << s.dump_output();
  EXPECT_EQ((*again)["result"]["content"][0]["text"], "plain") << again->dump();
  gate.open();
  json r = s.reply("r");
  EXPECT_TRUE(was_task);  // read once the tool ran (wait_started fires just before it does)
  EXPECT_EQ(r["result"]["content"][0]["text"], "done") << r.dump();
  EXPECT_EQ(r["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"], id);
  EXPECT_EQ(s.call(4, "tasks/get", {{"taskId", id}})["result"]["status"], "completed");
  // Again, now at once.
  EXPECT_EQ(s.call(5, "tasks/result", {{"taskId", id}})["result"]["content"][0]["text"], "done");
  json list = s.call(6, "tasks/list")["result"]["tasks"];
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["taskId"], id);
  // A tool without execution.taskSupport runs only as a plain call; unknown tasks are named.
  expect_error(s.call(7, "tools/call", {{"name", "plain"}, {"task", json::object()}}), rpc_error::kMethodNotFound,
               "does not run as a task");
  expect_error(s.call(8, "tasks/get", {{"taskId", "nope"}}), rpc_error::kInvalidParams, "no task nope");
  expect_error(s.call(9, "tasks/result", json::object()), rpc_error::kInvalidParams, "taskId");
  expect_error(s.call(10, "tasks/cancel", {{"taskId", id}}), rpc_error::kInvalidParams, "has ended (completed)");
}

TEST(JsonRpcTasks, CancelStopsTheCallAndTheTaskStaysCancelled) {
  TestHandler h;
  Gate never;
  h.add("slow", [&](Call& c) {
    never.wait(c, /*honour_cancel=*/true);
    return text_reply("interrupted", /*is_error=*/true);
  }, {{"type", "object"}}, {{"taskSupport", "optional"}});
  Harness s(h);
  s.call(1, "initialize", {{"protocolVersion", "2025-11-25"}});
  const std::string id = task_of(s.call(2, "tools/call", {{"name", "slow"}, {"task", json::object()}}))["taskId"];
  ASSERT_TRUE(h.wait_started(1));
  json c = s.call(3, "tasks/cancel", {{"taskId", id}});
  EXPECT_EQ(c["result"]["status"], "cancelled") << c.dump();
  ASSERT_TRUE(h.wait_cancelled(1));
  json r = s.call(4, "tasks/result", {{"taskId", id}});
  EXPECT_EQ(r["result"]["content"][0]["text"], "interrupted") << r.dump();
  EXPECT_EQ(s.call(5, "tasks/get", {{"taskId", id}})["result"]["status"], "cancelled");  // not failed
  expect_error(s.call(6, "tasks/cancel", {{"taskId", id}}), rpc_error::kInvalidParams, "has ended (cancelled)");
}

TEST(JsonRpcTasks, AnEndedTaskFreesItsCallSlot) {
  // More tasks, one after another, than calls may be in flight at once (16): each frees its slot.
  TestHandler h;
  h.add("quick", [](Call&) { return text_reply("ok"); }, {{"type", "object"}}, {{"taskSupport", "optional"}});
  Harness s(h);
  s.call(1, "initialize", {{"protocolVersion", "2025-11-25"}});
  for (int i = 0; i < 24; ++i) {
    json created = s.call(100 + i, "tools/call", {{"name", "quick"}, {"task", json::object()}});
    ASSERT_TRUE(created.contains("result")) << "task " << i << ": " << created.dump();
    json r = s.call(200 + i, "tasks/result", {{"taskId", task_of(created)["taskId"]}});
    ASSERT_EQ(r["result"]["content"][0]["text"], "ok") << r.dump();
  }
  EXPECT_EQ(s.call(2, "tasks/list")["result"]["tasks"].size(), 24u);
}

TEST(JsonRpcTasks, AToolErrorMakesAFailedTask) {
  TestHandler h;
  h.add("bad", [](Call&) { return text_reply("boom", /*is_error=*/true); }, {{"type", "object"}},
        {{"taskSupport", "optional"}});
  Harness s(h);
  s.call(1, "initialize", {{"protocolVersion", "2025-11-25"}});
  const std::string id = task_of(s.call(2, "tools/call", {{"name", "bad"}, {"task", json::object()}}))["taskId"];
  json r = s.call(3, "tasks/result", {{"taskId", id}});
  EXPECT_TRUE(r["result"]["isError"].get<bool>()) << r.dump();
  EXPECT_EQ(s.call(4, "tasks/get", {{"taskId", id}})["result"]["status"], "failed");
}

TEST(JsonRpcEof, EofAtOnceReturnsZero) {
  TestHandler h;
  const auto start = Clock::now();
  EXPECT_TRUE(transcript(h, "").empty());
  EXPECT_LT(Clock::now() - start, 200ms);
  EXPECT_EQ(h.shutdowns(), 1);
  EXPECT_EQ(h.started(), 0);
}

TEST(JsonRpcEof, CallsThatHonourCancelEndAndTheirRepliesAreSent) {
  TestHandler h;
  Gate never;
  h.add("block", [&](Call& c) {
    never.wait(c, /*honour_cancel=*/true);
    return text_reply("stopped at EOF");
  });
  ServerOptions o = quick_options();
  o.eof_grace = 3000ms;
  Harness s(h, o);
  s.request(1, "tools/call", {{"name", "block"}});
  ASSERT_TRUE(h.wait_started(1));
  const auto start = Clock::now();
  EXPECT_EQ(s.finish(), 0);
  EXPECT_LT(Clock::now() - start, 1000ms);
  EXPECT_EQ(h.shutdowns(), 1);
  EXPECT_EQ(h.active_at_shutdown(), 0);
  EXPECT_TRUE(h.cancelled_ids().empty());  // EOF is not a cancellation request
  EXPECT_EQ(s.reply(1, 0ms)["result"]["content"][0]["text"], "stopped at EOF");
}

TEST(JsonRpcEof, CallsThatIgnoreCancelAreAbandonedAfterTheGrace) {
  TestHandler h;
  Gate gate;
  std::atomic<bool> saw_cancel{false};
  h.add("stubborn", [&](Call& c) {
    gate.wait(c, /*honour_cancel=*/false);
    saw_cancel = c.cancelled.load();
    c.progress(5, std::nullopt, "too late");
    return text_reply("too late");
  });
  ServerOptions o = quick_options();
  o.eof_grace = 200ms;
  Harness s(h, o);
  s.request(1, "tools/call", {{"name", "stubborn"}, {"_meta", {{"progressToken", 1}}}});
  ASSERT_TRUE(h.wait_started(1));
  const auto start = Clock::now();
  EXPECT_EQ(s.finish(), 0);
  const auto took = Clock::now() - start;
  EXPECT_GE(took, 190ms);
  EXPECT_LT(took, 1000ms);
  EXPECT_EQ(h.shutdowns(), 1);
  EXPECT_EQ(h.active_at_shutdown(), 1);
  gate.open();
  ASSERT_TRUE(h.wait_ended(1));
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(saw_cancel);
  EXPECT_TRUE(s.messages().empty()) << s.dump_output();  // nothing is written after run() returned
}

TEST(JsonRpcEof, SynchronousRequestsBeforeEofAreAllAnswered) {
  TestHandler h;
  add_echo(h);
  std::string input;
  for (int i = 0; i < 200; ++i) input += R"({"jsonrpc":"2.0","id":)" + std::to_string(i) + R"(,"method":"tools/list"})" "\n";
  auto out = transcript(h, input);
  ASSERT_EQ(out.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)]["id"], i);
}

// ---- fuzz ------------------------------------------------------------------------------

TEST(JsonRpcFuzz, ATranscriptOfGarbageNeverBreaksTheServer) {
  TestHandler h;
  add_echo(h);
  h.add("slowish", [](Call& c) {
    std::this_thread::sleep_for(1ms);
    c.progress(1, std::nullopt, "x");
    return text_reply("ok");
  });
  h.add("throws", [](Call&) -> ToolReply { throw std::runtime_error("boom"); });
  ServerOptions o = quick_options();
  o.max_line_bytes = 4096;
  o.max_concurrent = 4;
  Harness s(h, o);

  std::mt19937 rng(20260728);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  const std::vector<std::string> seeds = {
      R"({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{}}})",
      R"({"jsonrpc":"2.0","method":"notifications/initialized"})",
      R"({"jsonrpc":"2.0","id":2,"method":"tools/list"})",
      R"({"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"echo","arguments":{"a":[1,2,{"b":null}]}}})",
      R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"slowish","_meta":{"progressToken":3}}})",
      R"({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"throws"}})",
      R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}})",
      R"({"jsonrpc":"2.0","id":5,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}})",
      R"({"jsonrpc":"2.0","id":6,"method":"ping"})",
      R"([{"jsonrpc":"2.0","id":7,"method":"ping"}])",
  };
  const std::string alphabet = "{}[]\":,\\ 0123456789.eE+-truefalsnul\t\r\x01\x7f\xc3\xa9\xff";
  int lines = 0;
  for (int i = 0; i < 1000; ++i) {
    std::string line;
    switch (pick(4)) {
      case 0:  // random bytes
        for (std::size_t n = pick(200); n > 0; --n) line += static_cast<char>(rng() % 256);
        break;
      case 1:  // random JSON-ish characters
        for (std::size_t n = pick(100); n > 0; --n) line += alphabet[pick(alphabet.size())];
        break;
      case 2: {  // a real message, mutated
        line = seeds[pick(seeds.size())];
        for (std::size_t n = pick(4); n > 0; --n) {
          const std::size_t at = pick(line.size());
          switch (pick(3)) {
            case 0: line[at] = alphabet[pick(alphabet.size())]; break;
            case 1: line.erase(at, 1 + pick(5)); break;
            default: line.insert(at, 1, alphabet[pick(alphabet.size())]); break;
          }
        }
        break;
      }
      default:  // a real message, or an oversized line
        line = pick(20) == 0 ? std::string(5000, 'x') : seeds[pick(seeds.size())];
        break;
    }
    std::string clean;
    for (char c : line) {
      if (c != '\n') clean += c;  // one line is one line
    }
    s.raw(clean + "\n");
    ++lines;
  }
  ASSERT_EQ(lines, 1000);
  s.expect_alive("after-fuzz");
  for (const std::string& out : s.out().lines()) {
    json j = json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j["jsonrpc"], "2.0");
    EXPECT_TRUE(j.contains("id") != j.contains("method")) << out;  // a reply or a notification
  }
  EXPECT_EQ(s.finish(), 0);
  EXPECT_EQ(h.shutdowns(), 1);
}

}  // namespace
}  // namespace kgate::mcp
