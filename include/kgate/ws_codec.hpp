// Websocket message formats of the Jupyter kernels API: legacy JSON, legacy binary and v1.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kgate/kernel.hpp"

namespace kgate {

inline constexpr std::string_view kV1Protocol = "v1.kernel.websocket.jupyter.org";

enum class WsProtocol { legacy, v1 };

struct WsFrame {
  std::string data;
  bool binary = false;
};

// Kernel -> client.  Legacy: a JSON text frame when the message has no buffers, else the
// legacy binary layout (u32be count, u32be offsets, JSON, buffers).  The JSON is assembled
// from the raw parts, so message content is never re-serialised.
WsFrame encode_legacy(const KernelMessage& m);
// v1: u64le offset count, u64le offsets, then channel, header, parent, metadata, content,
// buffers.
WsFrame encode_v1(const KernelMessage& m);

// The parts of a v1 frame, as views into `data`: channel, header, parent header, metadata,
// content, then the buffers.  Returns "" or what is wrong with its offsets (at most 1024 parts).
std::string split_v1(std::string_view data, std::vector<std::string_view>& parts);

// Client -> kernel.  Either opcode is accepted for every layout: a legacy payload whose first
// non-blank byte is '{' is JSON, anything else is legacy binary.  Returns "" on success, or a
// message saying what is wrong with the frame.
std::string decode_client(std::string_view data, WsProtocol proto, ClientMessage& out);

}  // namespace kgate
