// kgate's half of the session kernel inside the kernel (docs/dev/kernel-side.md): the Python that kgate
// installs into every ipykernel it launches (src/kernel/kgate_kernel_side.py, embedded at
// build time), and how its answer is read.
#pragma once

#include <string>
#include <string_view>

#include "kgate/jupyter/wire.hpp"

namespace kgate {

// What the kernel side can do; each is on or off (with the reason) per kernel.
inline constexpr std::string_view kKernelSideFeatures[] = {"shutdown_guard", "silent_echo", "stop", "close",
                                                           "tasks", "run_async"};

// The code of the starting cell of a background task running `code` (kgate_kernel_side.start_task).
std::string kernel_side_task_code(const std::string& code);

// The environment variable a launched kernel finds kgate's host session in.
inline constexpr const char* kHostSessionEnv = "KGATE_HOST_SESSION";

// Whether `session` (a message header's) is the host's: `host` itself, or `host` + "." + more
// (kgate's per-kernel sessions). The kernel side applies the same rule; so does JobStore, which
// records no cell of kgate's own.
bool is_host_session(std::string_view session, std::string_view host);

// The content of the silent execute_request that installs the kernel side for `host` (idempotent:
// a kernel that has it answers with its report), with the user_expression that reports it.
json kernel_side_install_request(const std::string& host);

// The kernel side's state from that request's execute_reply content:
//   {"installed": true, "version": N, "features": {name: true | "why off"},
//    "running_task": the request of the background task that runs, or null (absent from a
//    kernel side before version 2, which does not report it)}
// (running_task is taken out by the caller: it is the moment's, not the kernel's state)
//   {"installed": false, "reason": "..."} (the install raised, or an unreadable reply).
json kernel_side_from_reply(const json& content);
// The state of a kernel the side is not installed in, for `reason`: every feature off.
json kernel_side_off(const std::string& reason);
// Whether `state` (Kernel::kernel_side()) has `feature` on.
bool kernel_side_has(const json& state, std::string_view feature);

}  // namespace kgate
