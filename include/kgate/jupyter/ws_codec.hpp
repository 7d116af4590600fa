// Websocket message formats of the Jupyter kernels API: legacy JSON, legacy binary and v1.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kgate/jupyter/messages.hpp"

namespace kgate {

inline constexpr std::string_view kV1Protocol = "v1.kernel.websocket.jupyter.org";

enum class WsProtocol { legacy, v1 };

struct WsFrame {
  std::string data;
  bool binary = false;
};

// A kernel -> client frame as the pieces it is sent from: the bytes kgate writes itself (offset
// tables, JSON keys, short parts) and views of the message's own large parts, which go to the
// socket as they are (a gathered write) instead of being copied into one buffer first.  The
// views point into the KernelMessage it was made from, which must outlive it.
class WsGather {
 public:
  // Parts shorter than this are copied into kgate's own bytes: a small message is then one
  // piece, and a gathered write costs no more than a flat one.
  static constexpr std::size_t kCopyBelow = 4096;

  bool binary() const noexcept { return binary_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t count() const noexcept { return pieces_.size(); }
  std::string_view piece(std::size_t i) const noexcept {
    const Piece& p = pieces_[i];
    return {p.ext ? p.ext : own_.data() + p.pos, p.len};
  }
  bool owned(std::size_t i) const noexcept { return pieces_[i].ext == nullptr; }
  WsFrame flatten() const;

  // Building one (ws_codec.cpp).
  explicit WsGather(bool binary) : binary_(binary) {}
  void own(std::string_view s);    // copied
  void view(std::string_view s);   // referenced (copied when shorter than kCopyBelow)

 private:
  struct Piece {
    const char* ext;  // nullptr: bytes [pos, pos + len) of own_
    std::size_t pos;
    std::size_t len;
  };
  bool binary_;
  std::size_t size_ = 0;
  std::string own_;
  std::vector<Piece> pieces_;
};

// Kernel -> client.  Legacy: a JSON text frame when the message has no buffers, else the
// legacy binary layout (u32be count, u32be offsets, JSON, buffers).  The JSON is assembled
// from the raw parts, so message content is never re-serialised.
WsGather gather_legacy(const KernelMessage& m);
// v1: u64le offset count, u64le offsets, then channel, header, parent, metadata, content,
// buffers.
WsGather gather_v1(const KernelMessage& m);
// The same frames in one buffer.
WsFrame encode_legacy(const KernelMessage& m);
WsFrame encode_v1(const KernelMessage& m);

// The parts of a v1 frame, as views into `data`: channel, header, parent header, metadata,
// content, then the buffers.  Returns "" or what is wrong with its offsets (at most 1024 parts).
std::string split_v1(std::string_view data, std::vector<std::string_view>& parts);

// Client -> kernel.  Either opcode is accepted for every layout: a legacy payload whose first
// non-blank byte is '{' is JSON, anything else is legacy binary.  Returns "" on success, or a
// message saying what is wrong with the frame.
std::string decode_client(std::string_view data, WsProtocol proto, ClientMessage& out);

}  // namespace kgate
