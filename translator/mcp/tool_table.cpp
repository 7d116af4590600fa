// The MCP tools, as one table: each tool's name, title, annotations, description, input schema
// and the Translator member that runs it.  tools/list is read from it and tools/call dispatched
// through it; a new tool is one row here and one member (DEV.md "Changing kgate").
#include "tool_util.hpp"

namespace kgate::mcp {

namespace {

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

// ---------------------------------------------------------------------------------------
// Input schemas

json object_schema(json props, std::vector<std::string> required = {}) {
  json s = {{"type", "object"}, {"properties", std::move(props)}, {"additionalProperties", false}};
  if (!required.empty()) s["required"] = std::move(required);
  return s;
}

json host_prop() {
  return {{"type", "string"}, {"description", "'' = the local kgate; a gateways.toml name; or a URL. Never a token."}};
}

json kernel_prop() {
  return {{"type", "string"},
          {"description", "A unique prefix of a kernel id (see list_kernels); default: the current kernel."}};
}

json connect_schema() {
  return object_schema(
      {{"host", host_prop()},
       {"kernel", {{"type", "string"}, {"description", "An existing kernel's id prefix to attach to; '' creates a new kernel."}}},
       {"launcher", {{"type", "string"}, {"description", "For a new kernel: a launcher of the gateway (list_kernels lists them), e.g. a Slurm partition or an SSH host, where it runs. '' = the gateway's own machine."}}}});
}

json execute_schema() {
  return object_schema(
      {{"code", {{"type", "string"}, {"description", "Python code to run."}}},
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
      {"code"});
}

json poll_schema() {
  return object_schema(
      {{"job", {{"type", "string"}, {"description", "The job id, job-N."}}},
       {"wait",
        {{"type", "number"},
         {"minimum", 0},
         {"maximum", kMaxPollWait},
         {"description", "Seconds to wait at most for it to end (default 10, at most 30)."}}}},
      {"job"});
}

json host_schema() { return object_schema({{"host", host_prop()}}); }
json kernel_schema() { return object_schema({{"kernel", kernel_prop()}}); }
json no_arguments() { return object_schema(json::object()); }

json interrupt_schema() {
  return object_schema(
      {{"kernel", kernel_prop()},
       {"job", {{"type", "string"}, {"description", "The job to stop (job-N); '' = the kernel's running job."}}}});
}

json verify_schema() {
  return object_schema(
      {{"cells",
        {{"type", "array"},
         {"items", {{"type", "string"}}},
         {"minItems", 1},
         {"maxItems", kMaxVerifyCells},
         {"description", "The cells to run in order, each as its own request, as Run All would."}}},
       {"kernelspec",
        {{"type", "string"}, {"description", "The kernelspec of the scratch kernel; '' = the current kernel's."}}},
       {"keep_going",
        {{"type", "boolean"}, {"description", "Run every cell even after one fails (default false: stop at the first error)."}}},
       {"timeout",
        {{"type", "number"},
         {"minimum", 0},
         {"maximum", kMaxTimeout},
         {"description", "Seconds each cell may run (default 120, at most 3600); a cell past it is interrupted and fails."}}}},
      {"cells"});
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The table

const std::vector<Translator::Tool>& Translator::tools() {
  // Titles are for people; the names stay what agents call.  The hints are MCP's annotations
  // (2025-03-26 on), which a client may use to ask before a call or to run read-only tools
  // without asking.  task: MCP tasks (2025-11-25 and the 2026 extension) may run the call as a
  // task; without them the tool answers in the call (execute: with a job id after its timeout).
  //   name, title, {read_only, destructive, idempotent, open_world}, task, description, schema, member,
  //   always_load
  static const std::vector<Tool> table = {
      {"connect", "Connect to a kernel", {false, false, false, false}, false, kConnectDesc, connect_schema,
       &Translator::connect},
      // Arbitrary code: it may change anything the kernel can reach, the network included.
      {"execute", "Run Python code in the kernel", {false, true, false, true}, true, kExecuteDesc, execute_schema,
       &Translator::execute, /*always_load=*/true},
      {"poll_job", "Read a job's state and output", {true, false, true, false}, false, kPollDesc, poll_schema,
       &Translator::poll_job},
      {"list_kernels", "List kernelspecs and kernels", {true, false, true, false}, false, kListDesc, host_schema,
       &Translator::list_kernels},
      // Stopping twice stops once; its variables are lost either way.
      {"stop_kernel", "Stop a kernel", {false, true, true, false}, false, kStopDesc, kernel_schema,
       &Translator::stop_kernel},
      {"restart", "Restart a kernel (its variables are lost)", {false, true, false, false}, false, kRestartDesc,
       kernel_schema, &Translator::restart},
      {"interrupt", "Interrupt the running cell", {false, false, true, false}, false, kInterruptDesc,
       interrupt_schema, &Translator::interrupt},
      {"server_status", "Gateway and kernel status", {true, false, true, false}, false, kStatusDesc, no_arguments,
       &Translator::server_status},
      // Runs code, but in a kernel of its own that it stops: nothing of the working kernel changes.
      {"verify", "Run cells in a fresh scratch kernel", {false, false, false, true}, false, kVerifyDesc,
       verify_schema, &Translator::verify},
  };
  return table;
}

std::string Translator::instructions() const { return kInstructions; }

json Translator::tool_list() const {
  json list = json::array();
  for (const Tool& t : tools()) {
    json a = {{"title", t.title}, {"readOnlyHint", t.hints.read_only}, {"openWorldHint", t.hints.open_world}};
    if (!t.hints.read_only) {  // both are meaningful only for a tool that changes something
      a["destructiveHint"] = t.hints.destructive;
      a["idempotentHint"] = t.hints.idempotent;
    }
    json entry = {{"name", t.name},
                  {"description", t.description},
                  {"inputSchema", t.schema()},
                  {"title", t.title},
                  {"annotations", std::move(a)}};
    if (t.task) entry["execution"] = {{"taskSupport", "optional"}};
    if (t.always_load) entry["_meta"] = {{"anthropic/alwaysLoad", true}};
    list.push_back(std::move(entry));
  }
  return list;
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
  for (const Tool& t : tools())
    if (c.tool == t.name) return (this->*t.run)(c);
  throw InvalidParams("Unknown tool: " + c.tool);
}

}  // namespace kgate::mcp
