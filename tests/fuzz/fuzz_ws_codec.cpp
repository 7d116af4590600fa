// Fuzz target: the websocket message decoders (gateway/ws_codec.hpp): legacy JSON, legacy
// binary and v1 frames from a client, and the v1 splitter.  A message a client frame decodes
// to is re-encoded the way kgate sends to clients (legacy and v1); that must split back into
// the same parts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kgate/jupyter/ws_codec.hpp"

namespace {

// A broken property: says which, then aborts (libFuzzer keeps the input).
void must(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_ws_codec: %s\n", what);
  std::abort();
}

void reencode(const kgate::ClientMessage& c) {
  kgate::KernelMessage k;
  k.channel = c.channel;
  k.wire = c.wire;
  k.msg_id = c.msg_id;
  k.msg_type = c.msg_type;
  auto v1 = kgate::encode_v1(k);
  std::vector<std::string_view> parts;
  must(kgate::split_v1(v1.data, parts).empty(), "kgate::split_v1(v1.data, parts).empty()");
  must(parts.size() == 5 + c.wire.buffers.size(), "parts.size() == 5 + c.wire.buffers.size()");
  must(parts[1] == c.wire.header && parts[4] == c.wire.content, "parts[1] == c.wire.header && parts[4] == c.wire.content");
  for (std::size_t i = 0; i < c.wire.buffers.size(); ++i) must(parts[5 + i] == c.wire.buffers[i], "parts[5 + i] == c.wire.buffers[i]");
  // And what kgate sends a legacy client decodes as a client frame again.
  auto legacy = kgate::encode_legacy(k);
  kgate::ClientMessage back;
  must(kgate::decode_client(legacy.data, kgate::WsProtocol::legacy, back).empty(), "kgate::decode_client(legacy.data, kgate::WsProtocol::legacy, back).empty()");
  must(back.msg_id == c.msg_id && back.msg_type == c.msg_type && back.wire.buffers == c.wire.buffers, "back.msg_id == c.msg_id && back.msg_type == c.msg_type && back.wire.buffers == c.wire.buffers");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view frame(reinterpret_cast<const char*>(data), size);
  for (auto proto : {kgate::WsProtocol::legacy, kgate::WsProtocol::v1}) {
    kgate::ClientMessage out;
    if (kgate::decode_client(frame, proto, out).empty()) reencode(out);
  }
  std::vector<std::string_view> parts;
  if (kgate::split_v1(frame, parts).empty())
    for (auto p : parts) must(p.data() >= frame.data() && p.data() + p.size() <= frame.data() + frame.size(), "p.data() >= frame.data() && p.data() + p.size() <= frame.data() + frame.size()");
  return 0;
}
