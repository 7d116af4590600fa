// The tools kgate-mcp offers, and the one piece of state it keeps: a pointer to its current
// kernel (on which gateway, whether this conversation made it, whether it is the auto kernel).
//
// Threading: tool calls run concurrently on the server's worker threads.  `mu_` guards the
// pointer; `create_mu_` makes parallel first calls share one auto kernel.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kgate/mcp/client.hpp"
#include "kgate/mcp/jsonrpc.hpp"

namespace kgate::mcp {

// Where the tools are served from.
struct Hosting {
  // How the agent's label names it, after the client's name: "kgate-mcp pid 123" (the
  // conversation's own process) or "kgate /mcp session 1a2b3c4d".
  std::string where;
  // kgate-mcp: a kernel made on the default gateway gets this process's cwd and environment,
  // which are the conversation's. kgate's /mcp: the process is kgate, whose are not: neither.
  bool send_environment = true;
  // kgate's /mcp: only the kgate that serves it. A gateways.toml name or a URL is refused: the
  // client holds this kgate's token, not the tokens gateways.toml holds for the others.
  bool this_gateway_only = false;
  // kgate's /mcp in the stateless 2026-07-28 era: one translator per request, so nothing spans
  // requests but what the client names. A kernel tool without `kernel` is refused (there is no
  // current kernel to fall back on, and no auto kernel: nothing would stop it).
  bool stateless = false;
  // The stdio process's: "kgate-mcp pid N", sending its environment, any gateway.
  static Hosting stdio_process();
};

class Translator final : public ToolHandler {
 public:
  explicit Translator(Config cfg, Hosting hosting = Hosting::stdio_process());
  ~Translator() override;

  json tool_list() const override;
  std::string instructions() const override;
  ToolReply call(Call& call) override;
  void cancelled(Call& call) override;
  void ending() override;  // interrupts the cells of the calls in flight
  void client_info(const std::string& name, const std::string& version) override;  // names the agent's label
  void shutdown() override;  // stops the auto kernel (if still the conversation's), closes links

  const std::string& agent_id() const { return agent_; }

 private:
  struct Current {
    Endpoint ep;
    std::string kernel;
    bool auto_kernel = false;  // made by execute: stopped when the conversation ends
    bool made = false;         // made by this translator: restart re-runs the setup
    bool kgate = false;        // the gateway has kgate's extensions
    std::string launcher;      // the gateway's launcher it was made on ("" = the gateway's machine)
    bool setup_pending = false;  // queued (a scheduler's job): startup.py runs once it is ready
  };
  struct Target {              // the kernel a call acts on
    Current cur;
    std::shared_ptr<HttpClient> http;
  };

  // One MCP tool: what tools/list shows of it and the member tools/call runs.  The tools are
  // one table, tools() in tool_table.cpp.
  struct Hints {  // MCP's tool annotations
    bool read_only, destructive, idempotent, open_world;
  };
  struct Tool {
    const char* name;
    const char* title;
    Hints hints;
    bool task;                 // may run as an MCP task (execution.taskSupport "optional")
    const char* description;   // what the model reads: at most 700 characters
    json (*schema)();          // the inputSchema
    ToolReply (Translator::*run)(Call&);
    // Loaded with the first request (_meta "anthropic/alwaysLoad"): Claude Code defers the
    // others behind ToolSearch, which costs the model a turn before its first call.
    bool always_load = false;
  };
  static const std::vector<Tool>& tools();

  ToolReply connect(Call& c);
  ToolReply execute(Call& c);
  ToolReply poll_job(Call& c);
  ToolReply list_kernels(Call& c);
  ToolReply stop_kernel(Call& c);
  ToolReply restart(Call& c);
  ToolReply interrupt(Call& c);
  ToolReply server_status(Call& c);
  ToolReply verify(Call& c);

  std::shared_ptr<HttpClient> client(const Endpoint& ep);
  std::optional<Current> current();  // a copy of the pointer
  std::string label();               // how kgate shows this agent (claims, records, observe page)
  // The gateway a call means: `host` resolved, or the current kernel's when `host` is "".
  // resolve_gateway, within what hosting_ allows.
  bool resolve(const std::string& host, Endpoint& ep, std::string& error);
  bool endpoint_for(const std::string& host, const std::optional<Current>& cur, Endpoint& ep, std::string& error);
  // The kernel a call names (a unique id prefix) or the current one; `error` says what to do.
  std::optional<Target> target(const json& args, std::string& error);
  // Creates a kernel (setup included) and makes it current.  Returns the reply text, or sets
  // `error` (and `fatal` when it is not an anticipated failure).
  std::string create_kernel(const Endpoint& ep, bool auto_kernel, std::string& error, bool& fatal,
                            const std::string& launcher = "");
  // A queued kernel (connect(launcher=...) answered 202): once it runs, its setup; else why not.
  bool finish_pending_setup(const Target& t, std::string& error);
  void make_current(Current cur);
  // Runs setup (startup.py, inspectors.py) on a kernel this translator made.
  // The tool named by the call.
  ToolReply dispatch(Call& c);
  bool run_setup(const Target& t, std::string& output, std::string& error);
  // Runs code as the agent (kgate) or directly on the websocket (stock server) and waits.
  // `direct` gets the outputs on a stock server (which keeps no records).
  // `label`: the job's label instead of this conversation's (a verification's cells).
  json run_cell(const Target& t, const std::string& code, double timeout, bool host, Call* call,
                std::string& job, bool& still_running, std::string& refusal, std::vector<CellOutput>* direct,
                const std::string& label = "", bool background = false, const json* resume = nullptr);
  // A new kernel's POST /api/kernels body on the default endpoint: this conversation's
  // environment and working directory (when the hosting sends them), as an auto kernel gets.
  json own_environment(const Endpoint& ep) const;
  // `name` is the token_env of a gateways.toml entry.
  bool is_token_env(const std::string& name) const;
  // The body of POST /api/kernels for a kernel of this conversation: on `launcher`, or here.
  json new_kernel_body(const Endpoint& ep, const std::string& launcher) const;
  // The cell of `job` asks for input (`request`: its record's input_request): asks the user
  // through the client (elicitation) and answers it, or interrupts the cell. Returns a note for
  // the reply ("" when answered).
  std::string answer_input(const Target& t, const std::string& job, const json& request, Call& c, double left);
  // Gives `job`'s input() the user's answer (an ElicitResult: accept with content.value, decline
  // or cancel), or interrupts the cell. Returns a note for the reply ("" when answered).
  std::string give_answer(const Target& t, const std::string& job, const json& result);
  // Interrupts `job` because its input() was not answered; returns `why`.
  std::string stop_for_input(const Target& t, const std::string& job, const std::string& why);
  // After an interrupt: waits up to `bound` for `job` to end; its record, or null if unreadable.
  json wait_ended(const Target& t, const std::string& job, std::chrono::milliseconds bound, Call& c);
  // The note on cells the agent did not run, from `rec`'s embedded digest when it is the
  // current kernel's, else from GET .../digest.
  std::string foreign_note(const Target& t, std::vector<std::string>& to_ack, const json& rec = json());
  void ack(const Target& t, const std::vector<std::string>& ids);

  Config cfg_;
  Hosting hosting_;
  std::string agent_;  // this conversation's agent id (random per process)
  std::mutex mu_;
  std::string label_;  // guarded by mu_
  std::optional<Current> current_;
  // A POST /api/kernels is in flight (guarded by mu_): shutdown waits for it, so the kernel it
  // makes becomes current and is stopped, not leaked; it does not wait for the setup after it.
  bool posting_ = false;
  bool posting_marked_ = false;  // that POST carries kgate_conversation (kgate culls what it makes)
  // The kernel create_kernel made and is still setting up (guarded by mu_). Its call has not
  // answered, so the agent does not know of it: shutdown stops it even when it is not an auto kernel.
  std::string setting_up_;
  std::condition_variable posted_;
  std::mutex create_mu_;
  std::mutex clients_mu_;
  std::map<std::string, std::shared_ptr<HttpClient>> clients_;
  // The agent links: one per kgate gateway this conversation acted on (by URL), held from the
  // first call that acts on one of its kernels until exit, which closes them with 1000. kgate
  // calls the agent alive exactly while its link is open, so its claims end with the process.
  struct Link {
    std::shared_ptr<AgentLink> link;
    std::chrono::steady_clock::time_point started;
  };
  std::mutex links_mu_;
  std::map<std::string, Link> links_;
  void hold_link(const Endpoint& ep);  // opens the link (first time: waits briefly for it)
  void drop_links();
  KernelChannel channel_;
  std::mutex calls_mu_;
  std::map<const Call*, std::string> call_jobs_;  // the job each in-flight execute started
  std::map<const Call*, Target> call_targets_;
};

}  // namespace kgate::mcp
