// The tools' private helpers and limits, shared by translator/mcp/tool*.cpp (defined in
// tool_util.cpp).  The tools themselves are one table: tool_table.cpp.
#pragma once

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

extern char** environ;

namespace kgate::mcp {
namespace tool_util {

using namespace std::chrono_literals;

inline constexpr double kDefaultTimeout = 30;    // execute: seconds before a cell becomes a job to poll
inline constexpr int kMaxTimeout = 3600;       // also the inputSchema's maximum
inline constexpr double kDefaultPollWait = 10;   // poll_job: a ceiling, not a delay
inline constexpr int kMaxPollWait = 30;
inline constexpr double kSlice = 1.0;            // waits are sliced so cancellation and progress are prompt
inline constexpr auto kCreateTimeout = 120s;
inline constexpr double kSetupTimeout = 120;
inline constexpr auto kInterruptWait = 10s;   // a cancelled task: how long its interrupted cell may take to end
inline constexpr double kBackgroundWait = 1;   // execute(background): how long the reply waits for a quick task
inline constexpr int kMaxVerifyCells = 200;     // verify: cells per call (the inputSchema's maxItems)
inline constexpr double kDefaultVerifyTimeout = 120;  // verify: seconds per cell
inline constexpr std::size_t kVerifyLines = 5, kVerifyLineBytes = 300;  // verify: output shown per cell
// MCP 2026-07-28 (MRTR): an input() is answered by the client's retry of the call. The cell
// waits this long for it (kgate interrupts it then: execute's input_timeout), and the retry's
// requestState is honoured as long.
inline constexpr double kInputRetryTimeout = 600;
// A kernel that a stateless request (kgate's /mcp, 2026-07-28) made for an execute without one:
// kgate culls it after this many seconds idle (kgate_cull_idle_timeout).
inline constexpr int kStatelessKernelIdle = 1800;
// getpass() is never asked of the user through the client.
inline constexpr const char* kSecretNote =
    "NOTE: the cell's getpass() was not answered and the cell was interrupted: MCP does not allow asking the user "
    "for secrets. Have the code read them from the environment (os.environ) instead.";

// How long a job's last outputs may come after its record says it ended (the websocket and the
// HTTP reply are separate streams).
inline constexpr auto kChannelLag = 2s;

// The requestState of an execute answered input_required: what the retry resumes (its job, its
// kernel, the agent, the code's digest, the input request's key, an expiry), in JSON, signed
// with a key of this process's, so a client can neither forge nor alter it.
const std::string& state_key();
std::string keyed_digest(const std::string& text);
std::string seal_state(const json& payload);
std::optional<json> open_state(const std::string& state, std::string& why);
// Whether the client can show a form: elicitation declared, with form mode (an empty object
// means form).
bool elicits_forms(const json& caps);
// The form that asks for a cell's input(): an elicitation/create's params.
json input_form(const std::string& prompt);
json text_block(const std::string& s);
ToolReply text_reply(const std::string& s, bool is_error = false);
std::string short_id(const std::string& id);
std::string str_arg(const json& args, const char* key, const std::string& fallback = "");
// Types and bounds were checked against the tool's inputSchema before the call (check_arguments).
double num_arg(const json& args, const char* key, double fallback);
std::string status_of(const json& job);
bool running(const json& job);
// The cell did not complete: it raised (an error, KeyboardInterrupt), or it never ran to its end.
bool failed(const json& job);
// A message from the gateway as a sentence of its own, so that a hint can follow it.
std::string sentence(std::string s);
std::string fmt_seconds(double s);
// Substitutes the embedded Python templates' placeholders with JSON string literals (a JSON
// string is a valid Python str literal).
// One pass over the template, so a placeholder inside the inserted source is left alone; bytes
// that are not UTF-8 become U+FFFD rather than failing the call.
std::string py_template(std::string_view tpl, const std::string& source, const std::string& path);
std::optional<std::string> read_file(const std::filesystem::path& p);
std::string content_text(const json& content);
void append_text(json& content, const std::string& text);
std::string json_str(const json& j, const char* key);
// A kgate job's outputs.  From the kernel channel when it saw the job's request from its first
// message (every output, in the order the kernel sent it: stdout, stderr, display_data, images),
// with the record's note; else from the record (text only: stdout and stderr interleaved, no
// display_data) after the images the channel has of it.  `watched`: the channel was open on the
// job's kernel before the job was sent, so a request it has not seen yet is only late.
std::vector<CellOutput> job_outputs(KernelChannel& channel, const json& rec, bool watched);
// "Slurm job 12 (PENDING, Resources)" from a kernel model's kgate_placement.
std::string queue_text(const json& model);

}  // namespace tool_util
using namespace tool_util;
}  // namespace kgate::mcp
