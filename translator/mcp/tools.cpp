// The tools kgate-mcp offers (see tools.hpp).
#include "kgate/mcp/tools.hpp"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "kgate/jupyter/connection.hpp"
#include "kgate/mcp/images.hpp"
#include "kgate/mcp/render.hpp"
#include "kgate/jupyter/wire.hpp"
#include "install_inspectors_py.hpp"
#include "startup_wrapper_py.hpp"

extern char** environ;

namespace kgate::mcp {

namespace {

using namespace std::chrono_literals;

constexpr double kDefaultTimeout = 30;    // execute: seconds before a cell becomes a job to poll
constexpr int kMaxTimeout = 3600;       // also the inputSchema's maximum
constexpr double kDefaultPollWait = 10;   // poll_job: a ceiling, not a delay
constexpr int kMaxPollWait = 30;
constexpr double kSlice = 1.0;            // waits are sliced so cancellation and progress are prompt
constexpr auto kCreateTimeout = 120s;
constexpr double kSetupTimeout = 120;
constexpr auto kInterruptWait = 10s;   // a cancelled task: how long its interrupted cell may take to end
constexpr double kBackgroundWait = 1;   // execute(background): how long the reply waits for a quick task
constexpr int kMaxVerifyCells = 200;     // verify: cells per call (the inputSchema's maxItems)
constexpr double kDefaultVerifyTimeout = 120;  // verify: seconds per cell
constexpr std::size_t kVerifyLines = 5, kVerifyLineBytes = 300;  // verify: output shown per cell
// MCP 2026-07-28 (MRTR): an input() is answered by the client's retry of the call. The cell
// waits this long for it (kgate interrupts it then: execute's input_timeout), and the retry's
// requestState is honoured as long.
constexpr double kInputRetryTimeout = 600;
// A kernel that a stateless request (kgate's /mcp, 2026-07-28) made for an execute without one:
// kgate culls it after this many seconds idle (kgate_cull_idle_timeout).
constexpr int kStatelessKernelIdle = 1800;

// The requestState of an execute answered input_required: what the retry resumes (its job, its
// kernel, the agent, the code's digest, the input request's key, an expiry), in JSON, signed
// with a key of this process's, so a client can neither forge nor alter it.
const std::string& state_key() {
  static const std::string key = random_hex(32);
  return key;
}
std::string keyed_digest(const std::string& text) { return Signer(state_key()).sign(text, "", "", ""); }
std::string seal_state(const json& payload) {
  const std::string text = payload.dump();
  return base64_encode(text) + "." + keyed_digest(text);
}
std::optional<json> open_state(const std::string& state, std::string& why) {
  const auto dot = state.rfind('.');
  std::optional<std::string> text;
  if (dot != std::string::npos) text = base64_decode(std::string_view(state).substr(0, dot));
  if (!text || !Signer(state_key()).verify(std::string_view(state).substr(dot + 1), *text, "", "", "")) {
    why = "it was not made by this server (or this server restarted since)";
    return std::nullopt;
  }
  json p = json::parse(*text, nullptr, false);
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  if (!p.is_object() || !p["exp"].is_number_integer() || p["exp"].get<long long>() < now) {
    why = "it expired (a cell waits " + std::to_string(static_cast<int>(kInputRetryTimeout)) + " s for its input)";
    return std::nullopt;
  }
  return p;
}
// getpass() is never asked of the user through the client.
constexpr const char* kSecretNote =
    "NOTE: the cell's getpass() was not answered and the cell was interrupted: MCP does not allow asking the user "
    "for secrets. Have the code read them from the environment (os.environ) instead.";
// Whether the client can show a form: elicitation declared, with form mode (an empty object
// means form).
bool elicits_forms(const json& caps) {
  auto e = caps.find("elicitation");
  return e != caps.end() && e->is_object() && (e->empty() || e->contains("form"));
}
// The form that asks for a cell's input(): an elicitation/create's params.
json input_form(const std::string& prompt) {
  const std::string title = prompt.empty() ? std::string("input") : prompt.substr(0, 200);
  return {{"message", "The running cell asks for input" + (prompt.empty() ? std::string(".") : ": " + prompt)},
          {"requestedSchema",
           {{"type", "object"},
            {"properties", {{"value", {{"type", "string"}, {"title", title},
                                       {"description", "What input() returns to the cell"}}}}},
            {"required", json::array({"value"})}}}};
}

json text_block(const std::string& s) { return {{"type", "text"}, {"text", s}}; }
ToolReply text_reply(const std::string& s, bool is_error = false) {
  ToolReply r;
  r.content = json::array({text_block(s)});
  r.is_error = is_error;
  return r;
}

std::string short_id(const std::string& id) { return id.substr(0, 8); }

std::string str_arg(const json& args, const char* key, const std::string& fallback = "") {
  auto it = args.find(key);
  if (it == args.end() || it->is_null()) return fallback;
  if (!it->is_string()) throw InvalidParams(std::string("'") + key + "' must be a string");
  return it->get<std::string>();
}

// Types and bounds were checked against the tool's inputSchema before the call (check_arguments).
double num_arg(const json& args, const char* key, double fallback) {
  auto it = args.find(key);
  if (it == args.end() || !it->is_number()) return fallback;
  return it->get<double>();
}

std::string status_of(const json& job) { return job.value("status", ""); }
bool running(const json& job) { return status_of(job) == "running"; }
// The cell did not complete: it raised (an error, KeyboardInterrupt), or it never ran to its end.
bool failed(const json& job) {
  static const std::set<std::string> kFailed = {"error", "interrupted", "aborted", "kernel_lost", "culled"};
  return job.is_object() && kFailed.count(status_of(job)) > 0;
}

// A message from the gateway as a sentence of its own, so that a hint can follow it.
std::string sentence(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
  if (!s.empty() && std::string_view(".!?:)]").find(s.back()) == std::string_view::npos) s += '.';
  return s;
}

std::string fmt_seconds(double s) {
  std::ostringstream ss;
  ss.precision(s < 10 ? 2 : 1);
  ss << std::fixed << s;
  return ss.str();
}

// Substitutes the embedded Python templates' placeholders with JSON string literals (a JSON
// string is a valid Python str literal).
// One pass over the template, so a placeholder inside the inserted source is left alone; bytes
// that are not UTF-8 become U+FFFD rather than failing the call.
std::string py_template(std::string_view tpl, const std::string& source, const std::string& path) {
  static constexpr std::string_view kSource = "__KGATE_SOURCE__", kPath = "__KGATE_PATH__";
  auto literal = [](const std::string& v) { return json(v).dump(-1, ' ', false, json::error_handler_t::replace); };
  std::string out;
  std::size_t i = 0;
  while (i < tpl.size()) {
    auto s = tpl.find(kSource, i), p = tpl.find(kPath, i);
    auto next = std::min(s, p);
    if (next == std::string_view::npos) break;
    out.append(tpl.substr(i, next - i));
    out += next == s ? literal(source) : literal(path);
    i = next + (next == s ? kSource.size() : kPath.size());
  }
  out.append(tpl.substr(std::min(i, tpl.size())));
  return out;
}

std::optional<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string content_text(const json& content) {
  std::string s;
  for (auto& b : content)
    if (b.value("type", "") == "text") s += (s.empty() ? "" : "\n") + b.value("text", "");
  return s;
}

void append_text(json& content, const std::string& text) {
  if (text.empty()) return;
  if (!content.empty() && content.back().value("type", "") == "text")
    content.back()["text"] = content.back().value("text", "") + text;
  else
    content.push_back(text_block(text));
}

// How long a job's last outputs may come after its record says it ended (the websocket and the
// HTTP reply are separate streams).
constexpr auto kChannelLag = 2s;

std::string json_str(const json& j, const char* key) {
  const auto it = j.is_object() ? j.find(key) : j.end();
  return j.is_object() && it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// A kgate job's outputs.  From the kernel channel when it saw the job's request from its first
// message (every output, in the order the kernel sent it: stdout, stderr, display_data, images),
// with the record's note; else from the record (text only: stdout and stderr interleaved, no
// display_data) after the images the channel has of it.  `watched`: the channel was open on the
// job's kernel before the job was sent, so a request it has not seen yet is only late.
std::vector<CellOutput> job_outputs(KernelChannel& channel, const json& rec, bool watched) {
  std::vector<CellOutput> from_record = outputs_from_record(rec);
  const std::string request = json_str(rec, "request");
  if (request.empty() || !channel.is_open() || channel.kernel() != json_str(rec, "kernel")) return from_record;
  const bool ended = !running(rec);
  auto got = channel.wait_for(request, 0ms, [](const KernelChannel::Collected&) { return true; });
  if (ended && !got.idle && (watched || got.began))
    got = channel.wait_for(request, kChannelLag, [](const KernelChannel::Collected& cc) { return cc.idle; });
  if (got.began && (got.idle || !ended)) {
    std::vector<CellOutput> outs = std::move(got.outputs);
    if (got.dropped) {
      CellOutput o;
      o.name = "note";
      o.text = "[" + std::to_string(got.dropped) + " more outputs of this cell were not kept: over kgate-mcp's " +
               "limits of " + std::to_string(KernelChannel::kMaxOutputs) + " outputs and " +
               std::to_string(KernelChannel::kMaxDataBytes >> 20) + " MiB per cell]";
      outs.push_back(std::move(o));
    }
    for (auto& o : from_record)
      if (o.kind == CellOutput::Kind::stream && o.name == "note") outs.push_back(std::move(o));
    return outs;
  }
  std::vector<CellOutput> outs;
  for (auto& o : got.outputs) {
    if (o.kind != CellOutput::Kind::display_data && o.kind != CellOutput::Kind::execute_result) continue;
    json data = json::object();
    for (auto& [mime, v] : o.data.items())
      if (mime.rfind("image/", 0) == 0 && mime != "image/svg+xml") data[mime] = v;
    if (data.empty()) continue;
    CellOutput img;
    img.kind = CellOutput::Kind::display_data;
    img.data = std::move(data);
    outs.push_back(std::move(img));
  }
  outs.insert(outs.end(), from_record.begin(), from_record.end());
  return outs;
}

// What the model reads first (issue 43): Claude Code defers the tools behind its tool search, so
// the server's instructions say when to load them, and the two main descriptions stay short
// (at most 700 characters each; the details are in the README and the parameters' own text).
const char* kInstructions =
    "Live Python (Jupyter) kernels that outlive this conversation and that a person can attach "
    "to and share. Use execute for stateful Python work: data, plots, long computations; "
    "variables persist between calls. A cell still running after its timeout goes on as a job: "
    "follow it with poll_job, do not re-run it. Earlier kernels are listed by list_kernels and "
    "resumed with connect(kernel=id). When the user ran cells in the same kernel, the reply "
    "says so: read them before relying on the state. verify re-runs cells in a fresh kernel.";

const char* kConnectDesc =
    "Connect this conversation to a Jupyter kernel; execute, poll_job, restart and interrupt then "
    "act on it. kernel: an existing kernel's id prefix (list_kernels) to attach to as it is, "
    "variables included: that is how a later conversation resumes work. Without it a fresh kernel "
    "is made (startup.py runs in it) and the reply gives its id: note it. host: '' = the local "
    "kgate, a gateways.toml name, or a URL; never a token. launcher: run a new kernel elsewhere, "
    "e.g. as a Slurm job (list_kernels lists them; a queued job is reported as queued). Kernels "
    "made or attached here are stopped only by stop_kernel.";

const char* kExecuteDesc =
    "Run Python code in the current kernel, as a notebook cell, and return its output in order: "
    "stdout/stderr, the last expression's value, the error, and images. State persists between "
    "calls. With no current kernel, an auto kernel is made for this conversation and stopped when "
    "it ends. timeout (default 30 s): a cell still running then goes on as job-N; follow it with "
    "poll_job, stop it with interrupt, do not re-run it. One cell runs at a time: if the user's or "
    "an earlier job runs, the call is refused and names it. input() asks the user when the client "
    "can. Output is cleaned and capped: print summaries. A closing note names cells the user ran "
    "since your last call.";

const char* kPollDesc =
    "Wait for a job (job-N, from execute or from the note about the user's cells) and return "
    "its state, how long it ran, and its output. wait (default 10 s, at most 30) is a ceiling, "
    "not a delay: it returns the moment the job ends, so do not call it in a loop without "
    "reason. Works for anyone's job, the user's included.";

const char* kListDesc =
    "List the kernelspecs and kernels of a gateway: host as in connect (default: the current "
    "gateway, else the local one); any Jupyter server works, by gateways.toml name or URL. For "
    "each kernel: id, kernelspec, state, connections, last activity, which agent holds it, the "
    "job running on it, the notebooks/consoles (sessions) using it, and '<- current'. Kernels "
    "linger until stopped: an old kernel here may hold a previous conversation's work, which "
    "connect(kernel=id) resumes.";

const char* kStopDesc =
    "Stop (shut down) a kernel: kernel is a unique id prefix, default the current kernel. Its "
    "state is lost. Stopping the current kernel clears the pointer; the next execute makes a "
    "new auto kernel.";

const char* kRestartDesc =
    "Restart a kernel with a fresh interpreter (default the current one). Every variable, "
    "import and monkeypatch is lost, the user's too if they are attached. On a kernel this "
    "conversation created, startup.py and inspectors.py run again. Use it when the kernel is "
    "wedged, or when state is confused (symptoms: isinstance failing on reloaded classes, "
    "stale modules).";

const char* kInterruptDesc =
    "Interrupt the running job of a kernel (default the current one), or the job named by `job` "
    "(a background task, say): a KeyboardInterrupt at its next bytecode, the kernel and its state "
    "survive. The reply names the job it stopped. You may only stop your own jobs; a cell the "
    "user is running is theirs to stop.";

const char* kVerifyDesc =
    "Check that code works from a clean start (Restart & Run All) without touching the working "
    "kernel: starts a fresh scratch kernel (same kernelspec, environment and working directory, "
    "startup.py run; on the same launcher when it runs on one), runs each cell as its own "
    "recorded request, stops at the first error unless keep_going, reports each cell (status, "
    "first lines of output, the error), then stops the scratch kernel. The current kernel and "
    "its variables are unchanged.";

const char* kStatusDesc =
    "Describe the connection: the gateway, the current kernel and its state, the job running "
    "on it, which agent holds it, and the command a person can paste in a terminal to attach "
    "a console (qtconsole / jupyter console) to the same kernel.";

json kernel_prop() {
  return {{"type", "string"},
          {"description", "A unique prefix of a kernel id (see list_kernels); default: the current kernel."}};
}

}  // namespace

// ---------------------------------------------------------------------------------------

Hosting Hosting::stdio_process() { return Hosting{"kgate-mcp pid " + std::to_string(::getpid()), true, false}; }

Translator::Translator(Config cfg, Hosting hosting)
    : cfg_(std::move(cfg)), hosting_(std::move(hosting)), agent_("kgate-mcp-" + new_hex_id().substr(0, 12)) {
  label_ = "an MCP client (" + hosting_.where + ")";  // until the client names itself
}

Translator::~Translator() {
  drop_links();
  channel_.close();
}

std::string Translator::instructions() const { return kInstructions; }

json Translator::tool_list() const {
  auto obj = [](json props, std::vector<std::string> required = {}) {
    json s = {{"type", "object"}, {"properties", props}, {"additionalProperties", false}};
    if (!required.empty()) s["required"] = required;
    return s;
  };
  json host = {{"type", "string"},
               {"description", "'' = the local kgate; a gateways.toml name; or a URL. Never a token."}};
  json tools = json::array({
      {{"name", "connect"},
       {"description", kConnectDesc},
       {"inputSchema", obj({{"host", host},
                            {"kernel", {{"type", "string"}, {"description", "An existing kernel's id prefix to attach to; '' creates a new kernel."}}},
                            {"launcher", {{"type", "string"}, {"description", "For a new kernel: a launcher of the gateway (list_kernels lists them), e.g. a Slurm partition or an SSH host, where it runs. '' = the gateway's own machine."}}}})}},
      {{"name", "execute"},
       {"description", kExecuteDesc},
       {"inputSchema",
        obj({{"code", {{"type", "string"}, {"description", "Python code to run."}}},
             {"timeout",
              {{"type", "number"},
               {"minimum", 0},
               {"maximum", kMaxTimeout},
               {"description", "Seconds to wait before returning a job id (default 30, at most 3600)."}}},
             {"kernel", kernel_prop()},
             {"background",
              {{"type", "boolean"},
               {"description", "Run the code on a worker thread of the kernel as a background task (one at a time): "
                               "the reply names its job at once; execute is refused until it ends; poll_job follows "
                               "it and interrupt(job=...) stops it."}}}},
            {"code"})}},
      {{"name", "poll_job"},
       {"description", kPollDesc},
       {"inputSchema",
        obj({{"job", {{"type", "string"}, {"description", "The job id, job-N."}}},
             {"wait",
              {{"type", "number"},
               {"minimum", 0},
               {"maximum", kMaxPollWait},
               {"description", "Seconds to wait at most for it to end (default 10, at most 30)."}}}},
            {"job"})}},
      {{"name", "list_kernels"}, {"description", kListDesc}, {"inputSchema", obj({{"host", host}})}},
      {{"name", "stop_kernel"}, {"description", kStopDesc}, {"inputSchema", obj({{"kernel", kernel_prop()}})}},
      {{"name", "restart"}, {"description", kRestartDesc}, {"inputSchema", obj({{"kernel", kernel_prop()}})}},
      {{"name", "interrupt"},
       {"description", kInterruptDesc},
       {"inputSchema",
        obj({{"kernel", kernel_prop()},
             {"job", {{"type", "string"}, {"description", "The job to stop (job-N); '' = the kernel's running job."}}}})}},
      {{"name", "server_status"}, {"description", kStatusDesc}, {"inputSchema", obj(json::object())}},
      {{"name", "verify"},
       {"description", kVerifyDesc},
       {"inputSchema",
        obj({{"cells",
              {{"type", "array"},
               {"items", {{"type", "string"}}},
               {"minItems", 1},
               {"maxItems", kMaxVerifyCells},
               {"description", "The cells to run in order, each as its own request, as Run All would."}}},
             {"kernelspec",
              {{"type", "string"},
               {"description", "The kernelspec of the scratch kernel; '' = the current kernel's."}}},
             {"keep_going",
              {{"type", "boolean"}, {"description", "Run every cell even after one fails (default false: stop at the first error)."}}},
             {"timeout",
              {{"type", "number"},
               {"minimum", 0},
               {"maximum", kMaxTimeout},
               {"description", "Seconds each cell may run (default 120, at most 3600); a cell past it is interrupted and fails."}}}},
            {"cells"})}},
  });
  // MCP's tool annotations (2025-03-26 on): hints a client may use to ask before a call, or to
  // run read-only ones without asking. Titles are for people; the names stay what agents call.
  struct Hints {
    const char* title;
    bool read_only, destructive, idempotent, open_world;
  };
  static const std::map<std::string, Hints> hints = {
      {"connect", {"Connect to a kernel", false, false, false, false}},
      // Arbitrary code: it may change anything the kernel can reach, the network included.
      {"execute", {"Run Python code in the kernel", false, true, false, true}},
      {"poll_job", {"Read a job's state and output", true, false, true, false}},
      {"list_kernels", {"List kernelspecs and kernels", true, false, true, false}},
      // Stopping twice stops once; its variables are lost either way.
      {"stop_kernel", {"Stop a kernel", false, true, true, false}},
      {"restart", {"Restart a kernel (its variables are lost)", false, true, false, false}},
      {"interrupt", {"Interrupt the running cell", false, false, true, false}},
      {"server_status", {"Gateway and kernel status", true, false, true, false}},
      // Runs code, but in a kernel of its own that it stops: nothing of the working kernel changes.
      {"verify", {"Run cells in a fresh scratch kernel", false, false, false, true}},
  };
  for (auto& t : tools) {
    const Hints& h = hints.at(t["name"].get<std::string>());
    t["title"] = h.title;
    json a = {{"title", h.title}, {"readOnlyHint", h.read_only}, {"openWorldHint", h.open_world}};
    if (!h.read_only) {  // both are meaningful only for a tool that changes something
      a["destructiveHint"] = h.destructive;
      a["idempotentHint"] = h.idempotent;
    }
    t["annotations"] = std::move(a);
  }
  // MCP tasks (2025-11-25): a client that has them may run a cell as a task, polled with
  // tasks/get and collected with tasks/result; tasks/cancel interrupts it. Without, execute
  // gives a job id after its timeout, as before.
  for (auto& t : tools)
    if (t["name"] == "execute") t["execution"] = {{"taskSupport", "optional"}};
  return tools;
}

ToolReply Translator::call(Call& c) {
  if (!c.arguments.is_object()) throw InvalidParams("arguments must be an object");
  // Stateless (one call per Translator): the agent's claims end with its call, even when the
  // call was a task whose session lives on for tasks/get.
  struct Release {
    Translator* t;
    ~Release() {
      if (t->hosting_.stateless) t->drop_links();
    }
  } release{this};
  return dispatch(c);
}

ToolReply Translator::dispatch(Call& c) {
  const auto& t = c.tool;
  if (t == "connect") return connect(c);
  if (t == "execute") return execute(c);
  if (t == "poll_job") return poll_job(c);
  if (t == "list_kernels") return list_kernels(c);
  if (t == "stop_kernel") return stop_kernel(c);
  if (t == "restart") return restart(c);
  if (t == "interrupt") return interrupt(c);
  if (t == "server_status") return server_status(c);
  if (t == "verify") return verify(c);
  throw InvalidParams("Unknown tool: " + t);
}

void Translator::cancelled(Call& c) {
  // The waiting execute sees call.cancelled within a slice and stops its job itself.
  spdlog::info("call {} cancelled", c.id.dump());
}

void Translator::client_info(const std::string& name, const std::string& /*version*/) {
  if (name.empty() || name == "?") return;
  std::lock_guard lk(mu_);
  label_ = name.substr(0, 64) + " (" + hosting_.where + ")";
}

std::string Translator::label() {
  std::lock_guard lk(mu_);
  return label_;
}

void Translator::shutdown() {
  // A kernel whose POST is in flight becomes current when it returns, so it is stopped below, not
  // leaked. Setup (startup.py) that runs after it is not waited for.
  std::optional<Current> cur;
  {
    std::unique_lock lk(mu_);
    if (!posted_.wait_for(lk, kCreateTimeout + 5s, [this] { return !posting_; }))
      spdlog::warn("a kernel create did not answer in time; a kernel it makes may be left running");
    cur = current_;
    current_.reset();
    if (cur && !cur->auto_kernel && cur->kernel == setting_up_) {
      spdlog::info("kernel {}: its connect had not answered (setup still running), so it is stopped", cur->kernel);
      cur->auto_kernel = true;
    }
  }
  if (cur && cur->auto_kernel) {
    auto r = client(cur->ep)->request("DELETE", "api/kernels/" + cur->kernel, nullptr, 10s);
    if (r.status == 204 || r.status == 404)
      spdlog::info("stopped the auto kernel {}", cur->kernel);
    else
      spdlog::warn("could not stop the auto kernel {}: {}", cur->kernel, r.message());
  }
  channel_.close();
  drop_links();  // closed with 1000: kgate frees this agent's claims at once
}

void Translator::hold_link(const Endpoint& ep) {
  // How long the first call on a gateway waits for its link. Until it is up, a claim this call
  // takes would outlive the process by claim_grace, since the exit's close frame cannot be sent.
  constexpr auto kFirstConnect = 3s;
  std::shared_ptr<AgentLink> link;
  std::chrono::steady_clock::time_point started;
  {
    std::lock_guard lk(links_mu_);
    auto& l = links_[ep.url];
    if (!l.link) {
      l.link = std::make_shared<AgentLink>();
      l.link->start(ep, agent_, label());
      l.started = std::chrono::steady_clock::now();
    }
    link = l.link;
    started = l.started;
  }
  while (!link->connected() && std::chrono::steady_clock::now() < started + kFirstConnect)
    std::this_thread::sleep_for(10ms);
}

void Translator::drop_links() {
  std::map<std::string, Link> links;
  {
    std::lock_guard lk(links_mu_);
    links.swap(links_);
  }
  for (auto& [url, l] : links) l.link->stop();
}

std::optional<Translator::Current> Translator::current() {
  std::lock_guard lk(mu_);
  return current_;
}

bool Translator::endpoint_for(const std::string& host, const std::optional<Current>& cur, Endpoint& ep,
                              std::string& error) {
  if (host.empty() && cur) {
    ep = cur->ep;
    return true;
  }
  return resolve(host, ep, error);
}

bool Translator::resolve(const std::string& host, Endpoint& ep, std::string& error) {
  if (hosting_.this_gateway_only && !host.empty()) {
    error = "host '" + host + "': this MCP server is kgate's own /mcp, which serves this kgate's kernels only "
            "(leave host empty). For other gateways, run kgate-mcp with their gateways.toml entries.";
    return false;
  }
  return resolve_gateway(cfg_, host, ep, error);
}

std::shared_ptr<HttpClient> Translator::client(const Endpoint& ep) {
  std::lock_guard lk(clients_mu_);
  auto& c = clients_[ep.url + "#" + ep.name];
  if (!c) c = std::make_shared<HttpClient>(ep);
  return c;
}

void Translator::make_current(Current cur) {
  {
    std::lock_guard lk(mu_);
    current_ = cur;
  }
  if (cur.kgate) hold_link(cur.ep);
  std::string err;
  if (!channel_.open(cur.ep, cur.kernel, agent_, 10s, err))
    spdlog::warn("kernel {}: {} (images will be missing)", cur.kernel, err);
}

std::optional<Translator::Target> Translator::target(const json& args, std::string& error) {
  std::string prefix = str_arg(args, "kernel");
  std::optional<Current> cur = current();
  if (prefix.empty()) {
    if (!cur) {
      error = hosting_.stateless
                  ? "pass kernel: this MCP server keeps nothing between requests (MCP 2026-07-28, stateless); "
                    "connect names a kernel id, list_kernels lists them"
                  : "no current kernel: call connect (or execute, which makes one), or pass a kernel id from list_kernels";
      return std::nullopt;
    }
    return Target{*cur, client(cur->ep)};
  }
  Endpoint ep;
  if (!endpoint_for("", cur, ep, error)) return std::nullopt;
  auto http = client(ep);
  auto r = http->get("api/kernels");
  if (r.status != 200) {
    error = "cannot list the kernels of " + ep.url + ": " + r.message();
    return std::nullopt;
  }
  const std::vector<std::string> matches = kgate::client::kernels_matching(r.json_body(), prefix);
  if (matches.empty()) {
    error = "no kernel matching '" + prefix + "' on " + ep.url;
    return std::nullopt;
  }
  if (matches.size() > 1) {
    error = "'" + prefix + "' matches " + std::to_string(matches.size()) + " kernels; give more of the id";
    return std::nullopt;
  }
  Current t;
  t.ep = ep;
  t.kernel = matches[0];
  if (cur) {
    t.kgate = cur->kgate;
  } else {
    auto api = http->get("api", 10s);
    json apij = api.json_body();
    t.kgate = api.status != 200 || (apij.is_object() && apij.contains("extensions") && apij["extensions"].contains("kgate"));
  }
  if (cur && cur->kernel == t.kernel) t = *cur;
  // Acting on a kernel by id, without connect, is acting as this agent all the same: its claim
  // must end with this process, so the link is held from here on.
  if (t.kgate) hold_link(ep);
  // A stateless request has no current kernel, whose websocket would bring the cell's outputs
  // as they are (streams by name, images): it opens one for the kernel it acts on.
  if (hosting_.stateless && t.kgate && (!channel_.is_open() || channel_.kernel() != t.kernel)) {
    std::string err;
    if (!channel_.open(ep, t.kernel, agent_, 10s, err))
      spdlog::warn("kernel {}: {} (outputs come from the records: no images)", t.kernel, err);
  }
  return Target{t, http};
}

// ---------------------------------------------------------------------------------------
// Running cells

json Translator::run_cell(const Target& t, const std::string& code, double timeout, bool host, Call* call,
                          std::string& job, bool& still_running, std::string& refusal,
                          std::vector<CellOutput>* direct, const std::string& job_label, bool background,
                          const json* resume) {
  still_running = false;
  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  if (background && !t.cur.kgate) {
    refusal = "background tasks need a kgate gateway (its kernel side runs them); this one is a stock server";
    return json();
  }
  if (!t.cur.kgate) {
    // A stock Jupyter server: the cell goes straight over the kernel's websocket.
    if (!channel_.is_open() || channel_.kernel() != t.cur.kernel) {
      std::string err;
      if (!channel_.open(t.cur.ep, t.cur.kernel, agent_, 10s, err)) {
        refusal = err;
        return json();
      }
    }
    json header = make_header("execute_request", agent_);
    std::string msg_id = header["msg_id"].get<std::string>();
    json msg = {{"header", header},
                {"parent_header", json::object()},
                {"metadata", json::object()},
                {"content",
                 {{"code", code}, {"silent", false}, {"store_history", true}, {"user_expressions", json::object()},
                  {"allow_stdin", false}, {"stop_on_error", false}}},
                {"buffers", json::array()}};
    channel_.expect(msg_id);
    if (!channel_.send("shell", msg)) {
      refusal = "the kernel's websocket is closed";
      return json();
    }
    auto got = channel_.wait_for(msg_id, std::chrono::milliseconds(long(timeout * 1000)),
                                 [](const KernelChannel::Collected& c) { return c.idle && c.replied; },
                                 call ? &call->cancelled : nullptr);
    still_running = !got.idle;
    if (call && call->cancelled && still_running)
      t.http->post("api/kernels/" + t.cur.kernel + "/interrupt", json::object());
    if (direct) *direct = got.outputs;
    return json{{"status", still_running ? "running" : got.reply.value("status", "ok")}};
  }
  // input() in an agent's cell: asked of the user through the client (MCP elicitation), when
  // the client can be asked; else the cell's input() raises, and the reply says why. The modern
  // era asks by answering the call input_required (MRTR): the client's retry carries the answer.
  const bool can_ask = call && !host && call->ask_client && call->client_capabilities.contains("elicitation");
  // (A call that may become a task asks through its task instead: ask_client.)
  const bool can_retry =
      !can_ask && call && !host && !background && call->modern && elicits_forms(call->client_capabilities);
  std::string input_notes;
  bool gave_up = false;
  json rec;
  if (resume) {
    // The retry of a call answered input_required: the same cell goes on, with its answer.
    job = (*resume)["job"].get<std::string>();
    if (call) {
      std::lock_guard lk(calls_mu_);
      call_jobs_[call] = job;
    }
    auto p = t.http->get("api/kgate/jobs/" + job + "?digest=1&agent=" + agent_ + "&wait=0", 30s);
    if (p.status != 200) {
      refusal = p.status == 404 ? job + " is no longer recorded (evicted, or its kernel was shut down)."
                                : "cannot read " + job + ": " + p.message();
      return json();
    }
    rec = p.json_body();
    const std::string key = (*resume)["key"].get<std::string>();
    const json* answer = call && call->input_responses.is_object() && call->input_responses.contains(key)
                             ? &call->input_responses[key] : nullptr;
    if (answer && running(rec) && rec.contains("input_request")) {
      std::string note = give_answer(t, job, *answer);
      if (!note.empty()) {
        gave_up = true;
        input_notes = note;
      }
      // Its input_request is gone now: read again, so the loop does not ask it once more.
      p = t.http->get("api/kgate/jobs/" + job + "?digest=1&agent=" + agent_ + "&wait=0", 30s);
      if (p.status == 200) rec = p.json_body();
    }
    // No answer for it: the loop below asks again (MRTR: a missing answer is asked for again).
  } else {
    json body = {{"code", code}, {"agent", agent_}, {"label", job_label.empty() ? label() : job_label},
                 {"wait", std::min(timeout, kSlice)},
                 {"origin", host ? "host" : "mcp"}, {"digest", true},
                 {"allow_stdin", (can_ask || can_retry) && !background}};
    if (can_retry && !can_ask) body["input_timeout"] = kInputRetryTimeout;
    if (background) body["background"] = true;
    auto r = t.http->post("api/kgate/kernels/" + t.cur.kernel + "/execute", body, 30s);
    rec = r.json_body();
    if (r.status != 200) {
      if (r.status == 0) refusal = "the gateway did not answer: " + r.error;
      else refusal = r.message();
      if (r.status == 404) refusal = "kernel " + t.cur.kernel + " is gone (stopped, or the gateway restarted). " +
                                     "connect to create or attach to another.";
      std::string why = rec.is_object() ? rec.value("refusal", "") : "";
      if (why == "dead")
        refusal = "NOTE: the kernel process died (" + rec.value("message", "") + "). restart it, or connect to another.";
      else if (why == "busy" && rec["running_job"].is_string())
        refusal = sentence(refusal) + " Wait for it with poll_job('" + rec["running_job"].get<std::string>() + "').";
      else if (why == "claimed" && rec["holder"].is_object() && rec["holder"].value("connected", true))
        refusal = sentence(refusal) + " Tell the user what you wanted to do and let them decide.";
      return rec;
    }
    job = rec.value("job", "");
    if (call) {
      std::lock_guard lk(calls_mu_);
      call_jobs_[call] = job;
    }
  }
  while (running(rec)) {
    double left = timeout - elapsed();
    if (left <= 0) break;
    if (call && call->cancelled) break;
    if (can_ask && !gave_up && rec.contains("input_request") && rec["input_request"].is_object()) {
      std::string note = answer_input(t, job, rec["input_request"], *call, left);
      // A note means the cell was interrupted: its input_request stays until the interrupt
      // lands, and is not asked again.
      if (!note.empty()) {
        gave_up = true;
        input_notes += (input_notes.empty() ? "" : "\n") + note;
      }
    }
    if (can_retry && !gave_up && rec.contains("input_request") && rec["input_request"].is_object()) {
      if (!rec["input_request"].value("password", false)) {
        // Answered input_required (execute builds it); the retry goes on from here.
        rec["kgate_mcp_input_required"] = rec["input_request"];
        still_running = true;
        return rec;
      }
      gave_up = true;
      input_notes += (input_notes.empty() ? "" : "\n") + stop_for_input(t, job, kSecretNote);
    }
    if (call && call->progress) call->progress(elapsed(), timeout, job + " running");
    // A declined input() keeps its input_request, which answers the wait at once, until the
    // interrupt lands: do not spin on it.
    if (gave_up && rec.contains("input_request")) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto p = t.http->get("api/kgate/jobs/" + job + "?digest=1&agent=" + agent_ + "&wait=" + fmt_seconds(std::min(left, kSlice)), 30s);
    if (p.status != 200) break;
    rec = p.json_body();
  }
  if (call && call->cancelled && running(rec)) {
    t.http->post("api/kgate/jobs/" + job + "/interrupt", json{{"agent", agent_}});
    spdlog::info("{} interrupted: its call was cancelled", job);
    // A cancelled task's result is kept for tasks/result: it is the cell's end, not "running".
    // (A plain call's reply is not sent at all, so it does not wait.)
    for (auto until = std::chrono::steady_clock::now() + kInterruptWait;
         call->task && running(rec) && std::chrono::steady_clock::now() < until;) {
      auto p = t.http->get("api/kgate/jobs/" + job + "?digest=1&agent=" + agent_ + "&wait=1", 30s);
      if (p.status != 200) break;
      rec = p.json_body();
    }
  }
  still_running = running(rec);
  if (!input_notes.empty() && rec.is_object()) rec["kgate_mcp_input_note"] = input_notes;
  return rec;
}

std::string Translator::stop_for_input(const Target& t, const std::string& job, const std::string& why) {
  t.http->post("api/kgate/jobs/" + job + "/interrupt", json{{"agent", agent_}});
  spdlog::info("{}: its input() was not answered, so it was interrupted", job);
  return why;
}

std::string Translator::give_answer(const Target& t, const std::string& job, const json& result) {
  const std::string action = result.is_object() ? result.value("action", "") : "";
  if (action == "accept") {
    const json content = result.value("content", json::object());
    auto v = content.is_object() ? content.find("value") : content.end();
    std::string value = content.is_object() && v != content.end() && v->is_string() ? v->get<std::string>()
                        : content.is_object() && v != content.end() && !v->is_null() ? v->dump()
                                                                                      : "";
    auto r = t.http->post("api/kgate/jobs/" + job + "/input", json{{"value", value}, {"agent", agent_}}, 30s);
    if (r.status == 200) return "";
    return stop_for_input(t, job, "NOTE: the user's answer to input() could not be given to the cell (" + r.message() +
                                      "), so the cell was interrupted.");
  }
  return stop_for_input(t, job, std::string("NOTE: the user ") + (action == "decline" ? "declined" : "cancelled") +
                                    " the cell's input() prompt, so the cell was interrupted.");
}

std::string Translator::answer_input(const Target& t, const std::string& job, const json& request, Call& c,
                                     double left) {
  if (request.value("password", false)) return stop_for_input(t, job, kSecretNote);
  auto resp = c.ask_client("elicitation/create", input_form(request.value("prompt", "")),
                           std::chrono::milliseconds(static_cast<long long>(std::max(1.0, left) * 1000)));
  if (!resp) {
    if (c.cancelled) return stop_for_input(t, job, "");
    return stop_for_input(t, job, "NOTE: the cell's input() got no answer within the call's timeout, so the cell was "
                                  "interrupted.");
  }
  if (resp->contains("error"))
    return stop_for_input(t, job, "NOTE: asking the user for the cell's input() failed (" +
                                      (*resp)["error"].value("message", std::string("an error")) +
                                      "), so the cell was interrupted.");
  return give_answer(t, job, (*resp)["result"]);
}

std::string Translator::foreign_note(const Target& t, std::vector<std::string>& to_ack, const json& rec) {
  if (!t.cur.kgate) return "";
  json d;
  // A finished record from execute or poll carries its kernel's digest (asked with "digest"):
  // no second request when it is the current kernel's.
  const json* embedded = rec.is_object() && rec.contains("digest") ? &rec["digest"] : nullptr;
  if (embedded && embedded->is_object() && embedded->value("kernel", "") == t.cur.kernel) {
    d = *embedded;
  } else {
    auto r = t.http->get("api/kgate/kernels/" + t.cur.kernel + "/digest?agent=" + agent_, 10s);
    if (r.status != 200) return "";
    d = r.json_body();
  }
  if (!d.is_object()) return "";
  std::vector<std::string> parts;
  std::string first;
  for (auto& e : d.value("jobs", json::array())) {
    std::string id = e.value("job", ""), st = e.value("status", "");
    if (first.empty()) first = id;
    parts.push_back(id + " (" + st + ")");
    if (st != "running") to_ack.push_back(id);
  }
  std::size_t evicted = d.value("evicted_unseen", std::size_t{0});
  if (parts.empty() && !evicted) return "";
  std::string list;
  for (std::size_t i = 0; i < parts.size(); ++i) list += (i ? ", " : "") + parts[i];
  std::string n = std::to_string(parts.size() + evicted);
  std::string note = "\n\n[" + n + (parts.size() + evicted == 1 ? " cell was" : " cells were") +
                     " run by the user since your last call";
  if (!list.empty()) note += ": " + list;
  if (evicted) note += (list.empty() ? ": " : "; ") + std::to_string(evicted) + " of them no longer recorded";
  note += ".";
  if (!first.empty()) note += " Read them with poll_job('" + first + "').";
  note += " Variables may have changed.]";
  return note;
}

void Translator::ack(const Target& t, const std::vector<std::string>& ids) {
  if (ids.empty() || !t.cur.kgate) return;
  t.http->post("api/kgate/kernels/" + t.cur.kernel + "/digest/ack", json{{"agent", agent_}, {"jobs", ids}}, 10s);
}

bool Translator::run_setup(const Target& t, std::string& output, std::string& error) {
  auto run_snippet = [&](const std::string& code, const std::string& what) -> std::optional<json> {
    std::string job, refusal;
    bool still = false;
    std::vector<CellOutput> direct;
    json rec = run_cell(t, code, kSetupTimeout, /*host=*/true, nullptr, job, still, refusal, &direct);
    if (!t.cur.kgate) {
      // A stock server has no records: keep the outputs in the record's shape.
      std::string text;
      for (auto& o : direct) {
        if (o.kind == CellOutput::Kind::stream) text += o.text;
        if (o.kind == CellOutput::Kind::error) text += o.ename + ": " + o.evalue + "\n";
      }
      rec["output"] = text;
      rec["status"] = rec.value("status", "ok") == "ok" && !std::any_of(direct.begin(), direct.end(), [](auto& o) {
        return o.kind == CellOutput::Kind::error; }) ? "ok" : "error";
    }
    if (!refusal.empty()) {
      error = what + " could not run: " + refusal;
      return std::nullopt;
    }
    if (still) {
      error = what + " was still running after " + std::to_string(int(kSetupTimeout)) + " s (" + job + ")";
      return std::nullopt;
    }
    return rec;
  };
  if (auto src = read_file(cfg_.startup_file())) {
    auto rec = run_snippet(py_template(kStartupWrapperPy, *src, cfg_.startup_file().string()), "startup.py");
    if (!rec) return false;
    if (rec->is_object() && rec->contains("output")) {
      std::string text = render_text(outputs_from_record(*rec));
      if (!text.empty()) output += text;
    }
  }
  if (auto src = read_file(cfg_.inspectors_file())) {
    auto rec = run_snippet(py_template(kInstallInspectorsPy, *src, cfg_.inspectors_file().string()), "inspectors.py");
    if (!rec) return false;
    if (rec->is_object() && status_of(*rec) != "ok") {
      error = "inspectors.py failed to load:\n" + render_text(outputs_from_record(*rec));
      return false;
    }
  }
  return true;
}

// "Slurm job 12 (PENDING, Resources)" from a kernel model's kgate_placement.
static std::string queue_text(const json& model) {
  json p = model.is_object() && model.contains("kgate_placement") ? model["kgate_placement"] : json();
  if (!p.is_object()) return "its launcher";
  std::string s = p.value("job_id", "").empty() ? "launcher " + p.value("launcher", std::string("?"))
                                                 : "Slurm job " + p.value("job_id", std::string());
  std::string st = p.value("state", ""), why = p.contains("reason") && p["reason"].is_string() ? p["reason"].get<std::string>() : "";
  if (!st.empty()) s += " (" + st + (why.empty() ? "" : ", " + why) + ")";
  return s;
}

bool Translator::is_token_env(const std::string& name) const {
  for (const auto& [gname, g] : cfg_.gateways)
    if (g.token_env == name) return true;
  return false;
}

json Translator::own_environment(const Endpoint& ep) const {
  json body = json::object();
  if (!ep.is_default || !hosting_.send_environment) return body;
  json env = json::object();
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string name = kv.substr(0, eq);
    // kgate-mcp's own settings and every gateway's token stay here: a kernel's code (and so the
    // model) would read them (DEV.md §9, "Tokens a client sends").
    if (name.rfind("KGATE_", 0) == 0 || is_token_env(name)) continue;
    env[name] = kv.substr(eq + 1);
  }
  body["env"] = env;
  std::error_code ec;
  auto cwd = std::filesystem::current_path(ec);
  if (!ec) body["cwd"] = cwd.string();
  return body;
}

json Translator::new_kernel_body(const Endpoint& ep, const std::string& launcher) const {
  if (launcher.empty()) return own_environment(ep);
  // Another machine: this conversation's environment is not its own (PATH, a venv), only its
  // working directory may be (a shared filesystem).
  json body = {{"kgate_launcher", launcher}};
  std::error_code ec;
  auto cwd = std::filesystem::current_path(ec);
  if (!ec && ep.is_default && hosting_.send_environment) body["cwd"] = cwd.string();
  return body;
}

std::string Translator::create_kernel(const Endpoint& ep, bool auto_kernel, std::string& error, bool& fatal,
                                      const std::string& launcher) {
  fatal = false;
  auto http = client(ep);
  auto api = http->get("api", 10s);
  if (api.status != 200) {
    error = "cannot reach the gateway at " + ep.url + ": " + api.message() +
            (ep.is_default ? ". Start it (scripts/start.sh or `kgate serve`), or set KGATE_URL." : "");
    return "";
  }
  json apij = api.json_body();
  bool kgate = apij.is_object() && apij.contains("extensions") && apij["extensions"].contains("kgate");
  json body = new_kernel_body(ep, launcher);
  // kgate stops it if this process dies without doing so (README "The end of a conversation").
  if (auto_kernel && kgate && !hosting_.stateless) body["kgate_conversation"] = agent_;
  // Stateless (/mcp, 2026-07-28): the conversation's end is never seen, so kgate culls the kernel
  // once it has been idle this long (unless a client is attached), and this request does not stop it.
  const bool culled_later = auto_kernel && hosting_.stateless;
  if (culled_later && kgate) body["kgate_cull_idle_timeout"] = kStatelessKernelIdle;
  if (culled_later) auto_kernel = false;
  {
    std::lock_guard lk(mu_);
    posting_ = true;
  }
  auto r = http->post("api/kernels", body, kCreateTimeout);
  const bool queued = r.status == 202;  // kgate: a launcher's job still waits in its queue
  std::string id = r.status == 201 || r.status == 200 || queued ? r.json_body().value("id", "") : "";
  Current cur{ep, id, auto_kernel, true, kgate, launcher, queued};
  if (!id.empty()) make_current(cur);
  {
    std::lock_guard lk(mu_);
    posting_ = false;
    setting_up_ = id;
  }
  posted_.notify_all();
  struct SetupDone {
    Translator* t;
    ~SetupDone() {
      std::lock_guard lk(t->mu_);
      t->setting_up_.clear();
    }
  } setup_done{this};
  if (id.empty()) {
    error = "could not create a kernel on " + ep.url + ": " +
            (r.status == 201 || r.status == 200 ? std::string("the reply names no kernel id") : r.message());
    return "";
  }
  std::string out = (auto_kernel ? "(created an auto kernel " : culled_later ? "(created kernel " : "created kernel ") +
                    id + " on " + ep.url + (launcher.empty() ? "" : " (launcher " + launcher + ")") +
                    (auto_kernel ? " for this conversation; it stops when the conversation ends unless you connect to it)"
                     : culled_later
                         ? " for this conversation: pass kernel='" + id + "' to the calls that follow. This server "
                           "keeps nothing between requests, so the kernel is stopped after " +
                           std::to_string(kStatelessKernelIdle / 60) + " min idle)"
                         : "");
  if (queued)
    return out + "\nqueued as " + queue_text(r.json_body()) +
           "; poll with server_status. execute works once it runs (startup.py runs first).";
  std::string setup_out, setup_err;
  if (!run_setup(Target{cur, http}, setup_out, setup_err)) {
    http->request("DELETE", "api/kernels/" + id, nullptr, 15s);
    {
      std::lock_guard lk(mu_);
      if (current_ && current_->kernel == id) current_.reset();
    }
    channel_.close();
    error = setup_err + "\nThe kernel was stopped.";
    fatal = true;
    return "";
  }
  if (!kgate) out += "\nnote: " + ep.url + " is not a kgate gateway: claims, job records and notes about the user's cells are unavailable.";
  if (!setup_out.empty()) out += "\n" + setup_out;
  return out;
}

// ---------------------------------------------------------------------------------------
// Tools

bool Translator::finish_pending_setup(const Target& t, std::string& error) {
  auto k = t.http->get("api/kernels/" + t.cur.kernel, 10s);
  if (k.status != 200) {
    error = "kernel " + t.cur.kernel + ": " + k.message();
    return false;
  }
  json kj = k.json_body();
  const std::string state = kj.value("execution_state", "");
  if (state == "starting") {
    error = "kernel " + t.cur.kernel + " is still queued as " + queue_text(kj) +
            ": nothing ran. Poll with server_status, or stop_kernel it.";
    return false;
  }
  if (state == "dead") {
    error = "kernel " + t.cur.kernel + " is dead: " + kj.value("reason", std::string("no reason given"));
    return false;
  }
  std::string out, err;
  if (!run_setup(t, out, err)) {
    error = "kernel " + t.cur.kernel + " runs now, but its setup failed: " + err;
    return false;
  }
  std::lock_guard lk(mu_);
  if (current_ && current_->kernel == t.cur.kernel) current_->setup_pending = false;
  return true;
}

ToolReply Translator::connect(Call& c) {
  std::string host = str_arg(c.arguments, "host");
  std::string prefix = str_arg(c.arguments, "kernel");
  std::string launcher = str_arg(c.arguments, "launcher");
  if (!prefix.empty() && !launcher.empty())
    return text_reply("launcher is for a new kernel; kernel attaches to an existing one: give one of them", true);
  Endpoint ep;
  std::string error;
  if (!resolve(host, ep, error)) return text_reply(error, true);
  std::lock_guard create(create_mu_);
  std::string note;
  std::optional<Current> old;
  {
    std::lock_guard lk(mu_);
    old = current_;
  }
  auto http = client(ep);
  if (!prefix.empty()) {
    auto api = http->get("api", 10s);
    if (api.status != 200) return text_reply("cannot reach the gateway at " + ep.url + ": " + api.message(), true);
    json apij = api.json_body();
    bool kgate = apij.is_object() && apij.contains("extensions") && apij["extensions"].contains("kgate");
    auto r = http->get("api/kernels");
    if (r.status != 200) return text_reply("cannot list the kernels of " + ep.url + ": " + r.message(), true);
    const std::vector<std::string> matches = kgate::client::kernels_matching(r.json_body(), prefix);
    if (matches.empty()) {
      std::string ids;
      for (auto& k : r.json_body()) ids += (ids.empty() ? "" : ", ") + short_id(k.value("id", ""));
      return text_reply("no kernel matching '" + prefix + "' on " + ep.url + (ids.empty() ? " (it has none)" : ": " + ids), true);
    }
    if (matches.size() > 1) return text_reply("'" + prefix + "' matches several kernels; give more of the id", true);
    bool keep_auto = old && old->auto_kernel && old->kernel == matches[0];
    if (old && old->auto_kernel && !keep_auto) {
      auto d = client(old->ep)->request("DELETE", "api/kernels/" + old->kernel, nullptr, 15s);
      if (d.status != 204 && d.status != 404) note = "\nnote: stopping the auto kernel failed (" + d.message() + ")";
    }
    Current cur{ep, matches[0], false, old && old->kernel == matches[0] && old->made, kgate, "", false};
    // Connected to by id, it outlives every conversation: kgate stops it with none (its own
    // auto kernel, or another conversation's, resumed in time).
    if (kgate) http->post("api/kgate/kernels/" + cur.kernel + "/keep", json::object(), 10s);
    make_current(cur);
    std::vector<std::string> to_ack;
    std::string fnote = foreign_note(Target{cur, http}, to_ack);
    std::string text = "connected to existing kernel " + cur.kernel + " on " + ep.url +
                       (keep_auto ? " (it is no longer the auto kernel: it stays after this conversation)" : "") + note +
                       fnote;
    ack(Target{cur, http}, to_ack);
    return text_reply(text);
  }
  if (old && old->auto_kernel) {
    auto d = client(old->ep)->request("DELETE", "api/kernels/" + old->kernel, nullptr, 15s);
    if (d.status != 204 && d.status != 404) note = "\nnote: stopping the auto kernel failed (" + d.message() + ")";
    std::lock_guard lk(mu_);
    current_.reset();
  }
  bool fatal = false;
  std::string text = create_kernel(ep, false, error, fatal, launcher);
  if (!error.empty()) return text_reply(error + note, true);
  return text_reply(text + note);
}

ToolReply Translator::execute(Call& c) {
  auto code_it = c.arguments.find("code");
  if (code_it == c.arguments.end() || !code_it->is_string()) throw InvalidParams("'code' (a string) is required");
  std::string code = code_it->get<std::string>();
  // As a task nothing waits on the reply: the cell gets the longest timeout unless one is given.
  const bool background = c.arguments.value("background", false);
  double timeout = num_arg(c.arguments, "timeout", c.task ? kMaxTimeout : kDefaultTimeout);
  if (background) timeout = std::min(timeout, kBackgroundWait);
  if (code.find_first_not_of(" \t\r\n") == std::string::npos) return text_reply("(no code: nothing ran)");
  std::string banner;
  std::optional<Target> t;
  std::string error;
  // The retry of a call answered input_required (MRTR): its requestState names the cell that
  // waits, which goes on; nothing runs again.
  std::optional<json> resume;
  json args = c.arguments;
  if (!c.request_state.empty()) {
    std::string why;
    resume = open_state(c.request_state, why);
    if (resume && ((*resume)["tool"] != "execute" || (*resume)["code"] != keyed_digest(code) ||
                   !(*resume)["job"].is_string() || !(*resume)["kernel"].is_string() || !(*resume)["key"].is_string()))
      resume.reset(), why = "it was made for another call (a different tool or code)";
    if (resume && (*resume)["agent"] != agent_) {
      if (!hosting_.stateless) resume.reset(), why = "it was made for another conversation";
      else agent_ = (*resume)["agent"].get<std::string>();  // this translator serves this request alone
    }
    if (!resume)
      return text_reply("Invalid requestState: " + why + ". Nothing ran. Run the cell again if it is still needed.", true);
    args["kernel"] = (*resume)["kernel"];
  }
  if (!resume) {
    std::lock_guard create(create_mu_);  // parallel first calls must not each create a kernel
    bool have;
    {
      std::lock_guard lk(mu_);
      have = current_.has_value();
    }
    // (Stateless, /mcp in the 2026-07-28 era: a kernel is made for this call alone, and named, so
    // that the calls that follow can pass it; kgate culls it once idle, see create_kernel.)
    if (!have && str_arg(c.arguments, "kernel").empty()) {
      Endpoint ep;
      if (!resolve("", ep, error)) return text_reply(error, true);
      bool fatal = false;
      banner = create_kernel(ep, true, error, fatal);
      if (!error.empty()) return text_reply(error, true);
      banner += "\n";
    }
  }
  t = target(args, error);
  if (!t) return text_reply(error, true);
  if (!resume && t->cur.setup_pending && !finish_pending_setup(*t, error)) return text_reply(error, true);
  {
    std::lock_guard lk(calls_mu_);
    call_targets_[&c] = *t;
  }
  std::string job, refusal;
  bool still = false;
  std::vector<CellOutput> direct;
  const bool watched = t->cur.kgate && channel_.is_open() && channel_.kernel() == t->cur.kernel;
  json rec = run_cell(*t, code, timeout, false, &c, job, still, refusal, &direct, "", background,
                      resume ? &*resume : nullptr);
  {
    std::lock_guard lk(calls_mu_);
    call_jobs_.erase(&c);
    call_targets_.erase(&c);
  }
  if (rec.is_object() && rec.contains("kgate_mcp_input_required")) {
    // MRTR: the cell waits in input(); the client asks the user and calls again with the answer.
    const std::string key = "input-" + job + "-" + random_hex(4);
    const auto exp = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count() +
                     static_cast<long long>(kInputRetryTimeout);
    ToolReply r;
    json form = input_form(rec["kgate_mcp_input_required"].value("prompt", ""));
    form["mode"] = "form";
    r.input_requests = json{{key, {{"method", "elicitation/create"}, {"params", std::move(form)}}}};
    r.request_state = seal_state({{"tool", "execute"}, {"code", keyed_digest(code)}, {"job", job},
                                  {"kernel", t->cur.kernel}, {"agent", agent_}, {"key", key}, {"exp", exp}});
    return r;
  }
  std::vector<std::string> to_ack;
  if (!refusal.empty()) {
    std::string note = foreign_note(*t, to_ack);
    // A busy refusal already names the running job: the note would repeat it.
    ack(*t, to_ack);
    return text_reply(banner + refusal + note, true);
  }
  json content = json::array();
  // Every output in order, from the kernel's websocket (records keep no display_data).
  std::vector<CellOutput> outs = !t->cur.kgate ? direct : job_outputs(channel_, rec, watched);
  if (!t->cur.kgate && still) job = "the cell";
  if (still && background) {
    std::string partial = render_text(outs);
    content.push_back(text_block(banner + job + " runs in the background (a task on a worker thread of the kernel). "
                                 "execute is refused until it ends; poll_job('" + job + "') follows it, and "
                                 "interrupt(job='" + job + "') stops it.\nOutput so far:\n" +
                                 (partial.empty() ? "(none yet)" : partial)));
  } else if (still) {
    std::string partial = render_text(outs);
    content.push_back(text_block(banner + job + " is still running after " + fmt_seconds(timeout) +
                                 " s. Poll it with poll_job('" + job + "') (it waits for the end), or stop it with "
                                 "interrupt. Do not run it again.\nPartial output:\n" +
                                 (partial.empty() ? "(none yet)" : partial)));
  } else {
    content = render_content(outs);
    if (content.empty() || content_text(content).empty()) append_text(content, "(no output)");
    if (!banner.empty()) content.insert(content.begin(), text_block(banner));
  }
  if (rec.is_object() && rec.contains("kgate_mcp_input_note"))
    append_text(content, "\n" + rec["kgate_mcp_input_note"].get<std::string>());
  else if (rec.is_object() && rec["error"].is_object() && rec["error"].value("ename", "") == "StdinNotImplementedError")
    append_text(content, std::string("\nNOTE: input() needs a client that can ask the user (MCP elicitation); ") +
                             (c.ask_client || c.modern ? "this one did not declare it." : "this connection cannot carry the question.") +
                             " Pass the value in the code instead.");
  std::string note = foreign_note(*t, to_ack, rec);
  // Our own running job is never in the digest; repeats of a user's running cell are fine.
  append_text(content, note);
  ack(*t, to_ack);
  ToolReply r;
  r.content = content;
  r.is_error = !still && failed(rec);  // the cell raised (or never ran to its end)
  return r;
}


namespace {

// Someone else's cell as poll_job shows it: "Code:" and its lines indented by 4, at most
// kCodeLines lines and kCodeBytes bytes (what is left out is counted).
constexpr std::size_t kCodeLines = 40, kCodeBytes = 4000;
std::string quoted_code(const std::string& code) {
  if (code.empty()) return "";
  std::string out = "Code:\n";
  std::size_t lines = 0, i = 0;
  while (i < code.size() && lines < kCodeLines && out.size() < kCodeBytes) {
    auto nl = code.find('\n', i);
    if (nl == std::string::npos) nl = code.size();
    out += "    " + code.substr(i, std::min(nl - i, kCodeBytes)) + "\n";
    ++lines;
    i = nl + 1;
  }
  if (i < code.size()) {
    std::size_t rest = code.back() == '\n' ? 0 : 1;
    for (std::size_t k = i; k < code.size(); ++k) rest += code[k] == '\n';
    out += "    … (" + std::to_string(rest) + " more line" + (rest == 1 ? "" : "s") + " not shown)\n";
  }
  return out + "Output:\n";
}

}  // namespace

ToolReply Translator::poll_job(Call& c) {
  std::string job = str_arg(c.arguments, "job");
  if (job.empty()) throw InvalidParams("'job' (job-N) is required");
  double wait = num_arg(c.arguments, "wait", kDefaultPollWait);
  std::optional<Current> cur = current();
  Endpoint ep;
  std::string error;
  if (!endpoint_for("", cur, ep, error)) return text_reply(error, true);
  auto http = client(ep);
  auto start = std::chrono::steady_clock::now();
  json rec;
  while (true) {
    double left = wait - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    auto r = http->get("api/kgate/jobs/" + job + "?digest=1&agent=" + agent_ + "&wait=" + fmt_seconds(std::max(0.0, std::min(left, kSlice))), 30s);
    if (r.status == 404) return text_reply("No such job '" + job + "'.", true);
    if (r.status != 200) return text_reply("cannot read " + job + " from " + ep.url + ": " + r.message(), true);
    rec = r.json_body();
    if (!running(rec) || left <= kSlice || c.cancelled) break;
    if (c.progress) c.progress(wait - left, wait, job + " running");
  }
  // From the kernel's websocket when it saw the whole job (then with display_data and images),
  // else from the record.
  const bool ended = !running(rec);
  std::vector<CellOutput> outs = job_outputs(channel_, rec, false);
  json content = ended ? render_content(outs) : json::array();
  std::string head = job + ": " + status_of(rec) + " (" + fmt_seconds(rec.value("elapsed", 0.0)) + " s)" +
                     (rec.value("origin", "") == "user" ? ", run by the user" : "");
  std::string text = head + "\n";
  // A cell the agent did not send: its code too, which the agent has no other way to read.
  if (rec.value("origin", "") == "user") text += quoted_code(rec.value("code", ""));
  if (!ended) {
    std::string body = render_text(outs);
    text += "Partial output:\n" + (body.empty() ? std::string("(no output)") : body);
  } else if (content_text(content).empty()) {
    text += "(no output)";
  }
  if (!content.empty() && content.front().value("type", "") == "text")
    content.front()["text"] = text + content.front().value("text", "");
  else
    content.insert(content.begin(), text_block(text));
  if (cur) {
    Target t{*cur, http};
    std::vector<std::string> to_ack;
    append_text(content, foreign_note(t, to_ack, rec));
    ack(t, to_ack);
  }
  ToolReply r;
  r.content = content;
  return r;
}

ToolReply Translator::list_kernels(Call& c) {
  std::string host = str_arg(c.arguments, "host");
  std::optional<Current> cur = current();
  Endpoint ep;
  std::string error;
  if (!endpoint_for(host, cur, ep, error)) {
    std::string hint = error.rfind("unknown gateway", 0) == 0 ? known_gateways_hint(cfg_) : "";
    return text_reply(hint.empty() ? error : error + "; " + hint, true);
  }
  RemoteListing l = list_remote(client(ep));
  if (!l.listed_anything()) return text_reply(l.error_text(), true);
  RenderMarks marks;
  marks.self_agent = agent_;
  if (cur && cur->ep.url == ep.url) marks.current_kernel = cur->kernel;
  std::string out = render_text(l, marks);
  if (!l.complete()) out += "\nincomplete: " + l.error_text();
  return text_reply(out);
}

ToolReply Translator::stop_kernel(Call& c) {
  std::string error;
  auto t = target(c.arguments, error);
  if (!t) return text_reply(error, true);
  auto r = t->http->request("DELETE", "api/kernels/" + t->cur.kernel, nullptr, 15s);
  if (r.status != 204 && r.status != 404)
    return text_reply("could not stop kernel " + t->cur.kernel + ": " + r.message(), true);
  bool was_current;
  {
    std::lock_guard lk(mu_);
    was_current = current_ && current_->kernel == t->cur.kernel;
    if (was_current) current_.reset();
  }
  if (was_current) channel_.close();  // the agent link stays: this agent's other claims live on
  return text_reply((r.status == 404 ? "kernel " + t->cur.kernel + " was already gone" : "stopped kernel " + t->cur.kernel) +
                    (was_current ? " (it was the current kernel: the next execute makes a new one)" : ""));
}

ToolReply Translator::restart(Call& c) {
  std::string error;
  auto t = target(c.arguments, error);
  if (!t) return text_reply(error, true);
  HttpResult r = t->cur.kgate
                     ? t->http->post("api/kgate/kernels/" + t->cur.kernel + "/restart", json{{"agent", agent_}, {"label", label()}}, 90s)
                     : t->http->post("api/kernels/" + t->cur.kernel + "/restart", json::object(), 90s);
  if (r.status == 404) {
    // Gone: a fresh kernel on the same gateway, if it was the current one.
    bool current;
    {
      std::lock_guard lk(mu_);
      current = current_ && current_->kernel == t->cur.kernel;
    }
    if (!current) return text_reply("kernel " + t->cur.kernel + " no longer exists", true);
    bool fatal = false;
    std::string text = create_kernel(t->cur.ep, t->cur.auto_kernel, error, fatal, t->cur.launcher);
    if (!error.empty()) return text_reply("kernel " + t->cur.kernel + " was gone, and a fresh one could not be made: " + error, true);
    return text_reply("kernel " + t->cur.kernel + " was gone; " + text +
                      "\nNOTE: this is a fresh interpreter: all earlier state is lost.");
  }
  if (r.status == 0)
    return text_reply("restart did not complete (" + r.error + "): retry, or connect for a fresh kernel; check the gateway if this persists", true);
  if (r.status != 200)
    return text_reply("restart failed: " + sentence(r.message()) + " The kernel is still listed: retry, stop it, or connect for a fresh one.", true);
  // Restarts keep the websocket's kernel; reopen ours so no stale state lingers.
  std::string err;
  if (channel_.kernel() == t->cur.kernel) channel_.open(t->cur.ep, t->cur.kernel, agent_, 10s, err);
  if (!t->cur.made)
    return text_reply("NOTE: the kernel restarted with a fresh interpreter: all state is lost (imports, variables, "
                      "monkeypatches). Redo any setup the task still needs.");
  std::string out, serr;
  if (!run_setup(*t, out, serr)) return text_reply("the kernel restarted, but its setup failed: " + serr, true);
  return text_reply("NOTE: the kernel restarted with a fresh interpreter: startup.py has been re-run (its imports are "
                    "back), but all other state is lost (variables, monkeypatches, other imports). Redo what the task "
                    "still needs." + (out.empty() ? "" : "\n" + out));
}

json Translator::wait_ended(const Target& t, const std::string& job, std::chrono::milliseconds bound, Call& c) {
  auto deadline = std::chrono::steady_clock::now() + bound;
  json rec;
  while (true) {
    double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    auto p = t.http->get("api/kgate/jobs/" + job + "?wait=" + fmt_seconds(std::max(0.0, std::min(left, kSlice))), 30s);
    if (p.status != 200) return rec;
    rec = p.json_body();
    if (!running(rec) || left <= 0 || c.cancelled) return rec;
  }
}

ToolReply Translator::interrupt(Call& c) {
  constexpr auto kEndBound = 5s;  // how long the reply waits for the interrupted job to end
  std::string error;
  auto t = target(c.arguments, error);
  if (!t) return text_reply(error, true);
  if (!t->cur.kgate) {
    auto r = t->http->post("api/kernels/" + t->cur.kernel + "/interrupt", json::object());
    if (r.status != 204) return text_reply("interrupt failed: " + sentence(r.message()), true);
    // No records on a stock server: wait for the kernel to be idle again.
    auto deadline = std::chrono::steady_clock::now() + kEndBound;
    std::string state;
    while (true) {
      auto k = t->http->get("api/kernels/" + t->cur.kernel, 5s);
      state = k.status == 200 ? k.json_body().value("execution_state", "") : "";
      if (state != "busy" || std::chrono::steady_clock::now() >= deadline || c.cancelled) break;
      std::this_thread::sleep_for(100ms);
    }
    if (state == "busy")
      return text_reply("Sent a KeyboardInterrupt, but the kernel is still busy 5 s later (it may be in code that "
                        "does not check for signals). Wait, or restart the kernel.", true);
    return text_reply("Interrupted: the kernel is " + (state.empty() ? std::string("no longer busy") : state) +
                      " again; its state is intact.");
  }
  auto k = t->http->get("api/kgate/kernels/" + t->cur.kernel);
  if (k.status != 200) return text_reply("cannot read kernel " + t->cur.kernel + ": " + k.message(), true);
  json kj = k.json_body();
  std::string job = str_arg(c.arguments, "job");  // a background task beside a user's cell, say
  if (job.empty() && (!kj.contains("running_job") || !kj["running_job"].is_string()))
    return text_reply("nothing is running on kernel " + short_id(t->cur.kernel) + ": there is nothing to interrupt", true);
  if (job.empty()) job = kj["running_job"].get<std::string>();
  auto r = t->http->post("api/kgate/jobs/" + job + "/interrupt", json{{"agent", agent_}});
  if (r.status != 200) return text_reply(sentence(r.message()), true);
  // The reply waits for the end, so the next execute is not refused by the job it stopped.
  json rec = wait_ended(*t, job, kEndBound, c);
  if (!rec.is_object())
    return text_reply("Sent a KeyboardInterrupt to " + job + ", but cannot read it now: check it with poll_job('" + job + "').", true);
  if (running(rec))
    return text_reply(job + " is still running 5 s after the KeyboardInterrupt (it may be in code that does not "
                      "check for signals, such as a long C call). Wait for it with poll_job('" + job +
                      "'), or restart the kernel.", true);
  std::string how = status_of(rec);
  std::string text = job + " ended " + how + " after " + fmt_seconds(rec.value("elapsed", 0.0)) + " s";
  if (how == "interrupted")
    text += " (KeyboardInterrupt). The kernel and its state survive: you can run the next cell.";
  else if (how == "ok")
    text += ": it finished before the interrupt took effect. The kernel is free.";
  else if (how == "error")
    text += ", raising " + rec.value("ename", std::string("an error")) +
            (rec.value("evalue", "").empty() ? "" : ": " + rec.value("evalue", "")) + ". The kernel is free.";
  else
    text += ". See poll_job('" + job + "').";
  return text_reply(text);
}

namespace {

// The first kVerifyLines lines of `text` (each cut at kVerifyLineBytes), indented, and how many
// more there were.
std::string first_lines(const std::string& text) {
  std::string out;
  std::size_t shown = 0, i = 0, total = 0;
  while (i < text.size()) {
    auto nl = text.find('\n', i);
    if (nl == std::string::npos) nl = text.size();
    ++total;
    if (shown < kVerifyLines) {
      std::string line = text.substr(i, std::min(nl - i, kVerifyLineBytes));
      out += "      " + line + (nl - i > kVerifyLineBytes ? " …" : "") + "\n";
      ++shown;
    }
    i = nl + 1;
  }
  if (total > shown) out += "      … (" + std::to_string(total - shown) + " more lines)\n";
  return out;
}

}  // namespace

// verify: "Restart & Run All" in a scratch kernel, so the working kernel is never touched.
ToolReply Translator::verify(Call& c) {
  std::vector<std::string> cells;
  for (const auto& v : c.arguments.at("cells")) cells.push_back(v.get<std::string>());
  const bool keep_going = c.arguments.value("keep_going", false);
  const double timeout = num_arg(c.arguments, "timeout", kDefaultVerifyTimeout);
  std::string spec = str_arg(c.arguments, "kernelspec");
  std::optional<Current> cur = current();
  Endpoint ep;
  std::string error;
  if (!endpoint_for("", cur, ep, error)) return text_reply(error, true);
  auto http = client(ep);
  auto api = http->get("api", 10s);
  if (api.status != 200) return text_reply("cannot reach the gateway at " + ep.url + ": " + api.message(), true);
  const json apij = api.json_body();
  if (!(apij.is_object() && apij.contains("extensions") && apij["extensions"].contains("kgate")))
    return text_reply("verify needs a kgate gateway (it records each cell); " + ep.url + " is not one.", true);
  if (spec.empty() && cur && cur->ep.url == ep.url) {
    auto k = http->get("api/kernels/" + cur->kernel, 10s);
    if (k.status == 200) spec = k.json_body().value("name", "");
  }
  // Where this conversation's kernel is, as its auto kernel would be: its launcher (Slurm,
  // SSH) if it has one, else this machine with this conversation's environment and directory.
  const std::string launcher = cur && cur->ep.url == ep.url ? cur->launcher : "";
  json body = new_kernel_body(ep, launcher);
  if (!spec.empty()) body["name"] = spec;
  auto r = http->post("api/kernels", body, kCreateTimeout);
  const bool queued = r.status == 202;  // a launcher's job, still in its queue
  const std::string id = r.status == 201 || r.status == 200 || queued ? r.json_body().value("id", "") : "";
  if (id.empty())
    return text_reply("could not start a scratch kernel" + (spec.empty() ? "" : " (" + spec + ")") +
                          (launcher.empty() ? "" : " on launcher " + launcher) + " at " + ep.url + ": " + r.message(),
                      true);
  struct StopScratch {  // the scratch kernel never outlives the call, whatever happens
    std::shared_ptr<HttpClient> http;
    std::string id;
    ~StopScratch() { http->request("DELETE", "api/kernels/" + id, nullptr, 15s); }
  } stop_scratch{http, id};
  if (queued) {
    // Its job waits in the launcher's queue: wait for it as long as a cell may run, no longer.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    json kj = r.json_body();
    while (kj.value("execution_state", "") == "starting") {
      if (c.cancelled) return text_reply("verify cancelled while its scratch kernel was queued as " + queue_text(kj), true);
      if (std::chrono::steady_clock::now() >= give_up)
        return text_reply("the scratch kernel was still queued as " + queue_text(kj) + " after " + fmt_seconds(timeout) +
                              " s, so nothing ran; it was cancelled. Try again when the queue is shorter, or with a larger timeout.",
                          true);
      std::this_thread::sleep_for(500ms);
      auto g = http->get("api/kernels/" + id, 10s);
      if (g.status != 200) return text_reply("the queued scratch kernel " + id + " is gone: " + g.message(), true);
      kj = g.json_body();
    }
    if (kj.value("execution_state", "") == "dead")
      return text_reply("the scratch kernel died before it ran: " + kj.value("reason", std::string("no reason given")), true);
  }
  const std::string vid = new_hex_id().substr(0, 8);
  spdlog::info("verify {}: {} cells in scratch kernel {}{}", vid, cells.size(), id,
               launcher.empty() ? "" : " on launcher " + launcher);
  Target t{Current{ep, id, false, true, true, launcher, false}, http};

  std::string head = "verify " + vid + ": a fresh " + (spec.empty() ? std::string("default") : spec) + " kernel (" +
                     id.substr(0, 8) + (launcher.empty() ? "" : ", on launcher " + launcher) +
                     ", stopped afterwards; your kernel was not touched)";
  std::string setup_out, setup_err;
  if (!run_setup(t, setup_out, setup_err))
    return text_reply(head + "\nits setup failed, so no cell ran:\n" + setup_err, true);
  std::string report;
  std::size_t passed = 0, ran = 0;
  std::string first_failure;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const std::string n = std::to_string(i + 1) + "/" + std::to_string(cells.size());
    if (c.cancelled) break;
    std::string job, refusal;
    bool still = false;
    json rec = run_cell(t, cells[i], timeout, false, &c, job, still, refusal, nullptr,
                        label() + " · verify " + vid + " cell " + n);
    {
      std::lock_guard lk(calls_mu_);
      call_jobs_.erase(&c);
    }
    ++ran;
    std::string status = !refusal.empty() ? "refused" : still ? "timeout" : status_of(rec);
    if (still) {
      t.http->post("api/kgate/jobs/" + job + "/interrupt", json{{"agent", agent_}});
      status = "timeout";
    }
    const bool ok = status == "ok";
    passed += ok;
    report += "  cell " + n + " [" + status + (rec.is_object() && rec.contains("elapsed") ? ", " + fmt_seconds(rec.value("elapsed", 0.0)) + " s" : "") +
              "]" + (job.empty() ? "" : " " + job) + "\n";
    if (!refusal.empty()) report += "      " + refusal + "\n";
    if (rec.is_object()) {
      std::string text = rec.value("output", "");
      if (rec.contains("result") && rec["result"].is_string()) text += (text.empty() || text.back() == '\n' ? "" : "\n") + rec["result"].get<std::string>();
      report += first_lines(text);
      if (rec["error"].is_object())
        report += "      " + rec["error"].value("ename", std::string("error")) + ": " + rec["error"].value("evalue", "") + "\n";
    }
    if (still) report += "      still running after " + fmt_seconds(timeout) + " s: interrupted\n";
    if (!ok && first_failure.empty()) first_failure = "cell " + n + " " + (status == "error" && rec["error"].is_object()
                                                                              ? "raised " + rec["error"].value("ename", std::string("an error"))
                                                                              : status);
    if (!ok && (!keep_going || !refusal.empty())) break;
  }
  const std::size_t not_run = cells.size() - ran;
  std::string verdict = first_failure.empty() && !c.cancelled
                            ? "all " + std::to_string(cells.size()) + " cells passed"
                            : (c.cancelled ? std::string("cancelled") : "FAILED: " + first_failure) + " (" +
                                  std::to_string(passed) + " of " + std::to_string(cells.size()) + " passed" +
                                  (not_run ? ", " + std::to_string(not_run) + " not run" : "") + ")";
  ToolReply out = text_reply(head + "\n" + verdict + "\n" + report);
  out.is_error = !first_failure.empty();
  return out;
}

namespace {

// server_status's lines on kgate's kernel side (DEV.md §14): which features are on, which are off
// and why, and who was refused a shutdown.
std::string kernel_side_text(const json& side) {
  std::string on, off;
  if (const auto f = side.find("features"); f != side.end() && f->is_object())
    for (const auto& [name, v] : f->items()) {
      if (v == true) on += (on.empty() ? "" : ", ") + name;
      else off += "\n  off: " + name + (v.is_string() ? " (" + v.get<std::string>() + ")" : "");
    }
  std::string out = "\nkernel side: " + (on.empty() ? std::string("off") : "on (" + on + ")");
  if (on.empty() && side.value("reason", "").size()) out += ": " + side.value("reason", "");
  else out += off;
  if (const auto r = side.find("refused"); r != side.end() && r->is_array() && !r->empty()) {
    const json& last = r->back();
    out += "\nrefused shutdowns: " + std::to_string(r->size()) + ", the last from session " +
           last.value("session", "?") + (last.value("username", "").empty() ? "" : " (user " + last.value("username", "") + ")") +
           " at " + last.value("at", "?");
  }
  return out;
}

}  // namespace

ToolReply Translator::server_status(Call&) {
  std::optional<Current> cur = current();
  Endpoint ep;
  std::string error;
  if (!endpoint_for("", cur, ep, error)) return text_reply(error, true);
  auto http = client(ep);
  std::string out = "gateway: " + ep.url;
  auto api = http->get("api", 5s);
  if (api.status != 200) return text_reply(out + " (unreachable: " + api.message() + ")", true);
  json apij = api.json_body();
  out += " (" + apij.value("server", std::string("jupyter")) + " " + apij.value("version", "") + ")";
  if (!cur) return text_reply(out + "\nno current kernel: connect, or execute (which makes an auto kernel)");
  out += "\nkernel: " + cur->kernel + (cur->auto_kernel ? " (auto kernel of this conversation)" : "");
  auto k = http->get((cur->kgate ? "api/kgate/kernels/" : "api/kernels/") + cur->kernel, 5s);
  if (k.status == 404) return text_reply(out + " — gone (connect to create or attach to another)", true);
  json kj = k.json_body();
  out += "\nstate: " + kj.value("execution_state", "?");
  if (kj.value("responsive", true) == false && kj.value("execution_state", "") != "dead")
    out += " — UNRESPONSIVE: no heartbeat for " + fmt_seconds(kj.value("silent_seconds", 0.0)) +
           " s (the process is stopped or frozen: send it SIGCONT, or restart the kernel)";
  if (kj.contains("kgate_placement") && kj["kgate_placement"].is_object())
    out += "\nruns " + kgate::client::placement_text(kj["kgate_placement"]) +
           (kj.value("execution_state", "") == "starting" ? " — queued: execute works once it runs" : "");
  if (kj.contains("running_job") && kj["running_job"].is_string()) {
    const std::string job = kj["running_job"].get<std::string>();
    out += "\nrunning: " + job;
    // A background task says whose it is: the agent may stop its own, not the user's.
    auto r = http->get("api/kgate/jobs/" + job, 5s);
    json rec = r.status == 200 ? r.json_body() : json();
    if (rec.is_object() && rec.value("task", false))
      out += rec.value("origin", "") == "user" ? " (the user's background task)"
             : rec.value("agent", "") == agent_ ? " (your background task: interrupt(job='" + job + "') stops it)"
                                                : " (another agent's background task)";
  }
  if (kj.contains("kgate_kernel_side") && kj["kgate_kernel_side"].is_object()) out += kernel_side_text(kj["kgate_kernel_side"]);
  if (kj.contains("claim") && kj["claim"].is_object()) {
    auto& cl = kj["claim"];
    out += "\nheld by: " + (cl.value("agent", "") == agent_ ? std::string("you") : cl.value("label", "") + " (" + cl.value("agent", "") + ")");
  }
  if (kj.contains("connection_file") && kj["connection_file"].is_string())
    out += "\nconnection file: " + kj["connection_file"].get<std::string>();
  if (kj.contains("attach_command") && kj["attach_command"].is_string())
    out += "\nattach a console: " + kj["attach_command"].get<std::string>();
  Target t{*cur, http};
  std::vector<std::string> to_ack;
  out += foreign_note(t, to_ack);
  ack(t, to_ack);
  return text_reply(out);
}

}  // namespace kgate::mcp
