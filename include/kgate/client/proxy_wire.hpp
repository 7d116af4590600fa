// kgate proxy-kernel's pure pieces: choosing the kernel to attach to, and reading v1 websocket
// frames from the server (ws_codec.hpp decodes only what clients send).  No I/O, any thread.
#pragma once

#include <string>
#include <string_view>

#include "kgate/jupyter/messages.hpp"
#include "kgate/jupyter/wire.hpp"

namespace kgate::client::proxy {

// The kernel a proxy attaches to when none is named, from GET api/kgate/kernels (kgate) or
// GET api/kernels (any Jupyter server): the agent's current kernel (a live claim; with several,
// the one active most recently), else the newest (smallest age_seconds; on a plain Jupyter
// server the latest last_activity).  Dead kernels are skipped.  "" when there is none.
std::string choose_kernel(const json& kernels);

// The kernel `want` names in a GET api/kernels list: the exact id, else the one id it is a
// prefix of.  "" and `error` set when there is none or several.
std::string match_kernel(const json& kernels, const std::string& want, std::string& error);

// Decodes a v1 websocket frame from the server (any channel, iopub included).  "" on success,
// else what is wrong with it.
std::string decode_v1_frame(std::string_view data, Channel& channel, WireMessage& out);

}  // namespace kgate::client::proxy
