// A Jupyter message as kgate handles it, on either side of the kernel runtime: the channel
// names, a message from a kernel (KernelMessage) and one from a client (ClientMessage).  No I/O:
// the kernel runtime (kgate/kernel/), the websocket codec, the records and the client's proxy
// wire all pass these, and only the first owns sockets.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kgate/jupyter/wire.hpp"

namespace kgate {

enum class Channel { shell, control, stdin_, iopub };
std::string_view channel_name(Channel c) noexcept;
std::optional<Channel> parse_channel(std::string_view name) noexcept;

// What the kernel-facing side knows of one message, parsed once on the I/O thread.
struct KernelMessage {
  Channel channel = Channel::iopub;
  WireMessage wire;           // identities cleared; raw JSON parts as the kernel sent them
  std::string msg_id;         // header.msg_id
  std::string msg_type;       // header.msg_type
  std::string parent_msg_id;  // parent_header.msg_id ("" when none)
  // Who this message is for: the route of the client whose request it answers (shell,
  // control and stdin), or "" for everyone (iopub).
  std::string route;
  bool synthesized = false;   // made by kgate (a dead-kernel reply, a status), not the kernel
};
using KernelMessagePtr = std::shared_ptr<const KernelMessage>;

// A message made by kgate itself (a status, an error reply, a notice): a fresh header from
// `session`, the given parent header text ("{}" for none), empty metadata.
KernelMessage synthesize_message(Channel channel, std::string_view msg_type,
                                 std::string_view session, std::string parent_header,
                                 const json& content);

// A message a client sends to a kernel.  The gateway fills it from a websocket frame.
struct ClientMessage {
  Channel channel = Channel::shell;
  WireMessage wire;  // header/parent/metadata/content as JSON text, buffers raw
  std::string msg_id;
  std::string msg_type;
  std::string route;  // the sender's route: replies to this message carry it back
  std::string session;  // header.session ("" when absent): kgate's host session is refused (docs/dev/security.md)
};

}  // namespace kgate
