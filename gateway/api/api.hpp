// The REST surface: /api, /api/status, /api/kernels..., /api/kernelspecs..., /kernelspecs/...
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kgate/discovery/discovery.hpp"
#include "kgate/kernel/kernel.hpp"
#include "http/auth.hpp"
#include "http/net.hpp"
#include "http/request.hpp"
#include "options.hpp"

namespace kgate::gw {

class Services;

// A dashed UUID: 8-4-4-4-12 hex digits (either case).  POST /api/kernels's "kernel_id".
bool is_uuid(std::string_view s);

// The file GET /kernelspecs/{name}/{rel} serves: `rel` ('/'-separated, already percent-decoded)
// inside the kernelspec's directory `dir`, as a real path that is a regular file inside dir's
// real path (no "..", ".", absolute paths, NUL, or symlinks leading out).  nullopt otherwise.
std::optional<std::filesystem::path> kernelspec_file(const std::filesystem::path& dir, std::string_view rel);
// The Content-Type of a kernelspec file, by its extension; application/octet-stream otherwise.
std::string kernelspec_content_type(std::string_view file);

// When default_kernel does not name a launchable kernelspec of `cat`: the warning to log (it
// names the setting, what kgate uses instead and the kernelspecs there are).  "" when it does.
std::string default_kernel_warning(const Catalog& cat, const std::string& default_kernel);

// GET /api/kernelspecs's body for `cat`: every launchable entry, in jupyter_server's shape
// (Services::kernelspecs_body keeps it per catalog).
std::string kernelspecs_body_of(const Services& server, const Catalog& cat);

// Starts a kernel exactly as POST /api/kernels with `body` from a loopback client would (the
// env policy of a loopback client applies); `respond` gets that POST's answer (201, 202 or an
// error).  The sessions API starts its kernels with it.
void start_kernel_as_post(Services& server, const json& body, unsigned version, Respond respond);
// Interrupts `job`, as its `agent`, because its input() waited past its input_timeout
// (JobStore::sweep noted why); the outcome is logged.  On the Asio thread (jobs_api.cpp).
void interrupt_unanswered(Services& server, const std::string& job, const std::string& agent,
                          const std::string& why = "its input() had no answer in time");

// The kernel model in jupyter_server's shape.
json kernel_model_json(const KernelModel& m);
// DELETE / interrupt / restart of a kernel; replies like jupyter_server.  `gated`: the caller
// already checked the claim (the kgate restart); else a restart clears it (a person's).
void kernel_action(Services& server, const Request& req, const std::string& id, const std::string& action,
                   Respond respond, bool gated = false);

}  // namespace kgate::gw
