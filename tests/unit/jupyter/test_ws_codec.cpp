// Unit tests for the websocket codec: legacy JSON, legacy binary and v1 frames, checked
// against an independent decoder, against jupyter_server's own functions, and for errors.
#include "kgate/jupyter/ws_codec.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "support.hpp"

namespace kgate::gw {
namespace {

namespace fs = std::filesystem;

// ---- helpers ---------------------------------------------------------------------------

using kgate::test::read_file;
using kgate::test::TempDir;
using kgate::test::write_file;

// Runs a Python script with arguments; returns its stdout, fails the test on a non-zero exit.
std::string run_python(const TempDir& dir, const std::string& script, const std::vector<std::string>& args) {
  const test::CommandResult r = test::run_python_script(dir.path(), script, args, /*merge_stderr=*/true);
  EXPECT_EQ(r.status, 0) << "python failed:\n" << r.output;
  return r.output;
}

std::string hex(std::string_view s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string all_bytes() {
  std::string s;
  for (int i = 0; i < 256; ++i) s.push_back(char(i));
  return s;
}

std::uint32_t rd_u32be(std::string_view s, std::size_t at) {
  auto p = reinterpret_cast<const unsigned char*>(s.data()) + at;
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | p[3];
}
std::uint64_t rd_u64le(std::string_view s, std::size_t at) {
  auto p = reinterpret_cast<const unsigned char*>(s.data()) + at;
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void wr_u32be(std::string& s, std::uint32_t v) {
  s.push_back(char(v >> 24));
  s.push_back(char(v >> 16));
  s.push_back(char(v >> 8));
  s.push_back(char(v));
}
void wr_u64le(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}
void set_u32be(std::string& s, std::size_t at, std::uint32_t v) {
  std::string b;
  wr_u32be(b, v);
  s.replace(at, 4, b);
}
void set_u64le(std::string& s, std::size_t at, std::uint64_t v) {
  std::string b;
  wr_u64le(b, v);
  s.replace(at, 8, b);
}

// An independent port of jupyter_server's deserialize_binary_message: the JSON part and the
// raw buffers.  Throws on a malformed frame (the test only feeds it our encoder's output).
struct LegacyBinary {
  json msg;
  std::vector<std::string> buffers;
};
LegacyBinary jupyter_deserialize_binary(std::string_view b) {
  if (b.size() < 4) throw std::runtime_error("short");
  const std::uint32_t nbufs = rd_u32be(b, 0);
  if (b.size() < 4 * (std::size_t(nbufs) + 1)) throw std::runtime_error("short offsets");
  std::vector<std::size_t> offsets;
  for (std::uint32_t i = 0; i < nbufs; ++i) offsets.push_back(rd_u32be(b, 4 + 4 * i));
  offsets.push_back(b.size());
  std::vector<std::string> bufs;
  for (std::size_t i = 0; i + 1 < offsets.size(); ++i) {
    if (offsets[i] > offsets[i + 1] || offsets[i + 1] > b.size()) throw std::runtime_error("bad offsets");
    bufs.emplace_back(b.substr(offsets[i], offsets[i + 1] - offsets[i]));
  }
  LegacyBinary out;
  out.msg = json::parse(bufs.at(0));
  out.buffers.assign(bufs.begin() + 1, bufs.end());
  return out;
}

// A v1 frame built by hand (serialize_msg_to_ws_v1's layout) from arbitrary segments.
std::string make_v1(std::string_view channel, const std::vector<std::string>& parts) {
  std::vector<std::string_view> segs{channel};
  for (auto& p : parts) segs.emplace_back(p);
  const std::uint64_t n = segs.size() + 1;
  std::string out;
  wr_u64le(out, n);
  std::uint64_t off = 8 * (n + 1);
  for (auto s : segs) {
    wr_u64le(out, off);
    off += s.size();
  }
  wr_u64le(out, off);
  for (auto s : segs) out += s;
  return out;
}

// A legacy binary frame built by hand (serialize_binary_message's layout).
std::string make_legacy_binary(std::string_view js, const std::vector<std::string>& buffers) {
  std::vector<std::string_view> parts{js};
  for (auto& b : buffers) parts.emplace_back(b);
  const std::uint32_t n = std::uint32_t(parts.size());
  std::string out;
  wr_u32be(out, n);
  std::uint32_t off = 4 * (n + 1);
  for (auto p : parts) {
    wr_u32be(out, off);
    off += std::uint32_t(p.size());
  }
  for (auto p : parts) out += p;
  return out;
}

const std::string kHeader =
    R"({"msg_id":"a1b2-c3","msg_type":"comm_msg","session":"sess-1","username":"u","version":"5.3"})";
const std::string kParent = R"({"msg_id":"p-9","msg_type":"comm_open","session":"sess-0"})";
const std::string kMetadata = R"({"m": [1, 2.5, "x"]})";
// Unusual but valid JSON text: the codec must copy it through without re-serialising.
const std::string kContent = R"({"data":  {"text": "h\u00e9llo \u2603", "n": 1.50},   "comm_id": "c"})";

KernelMessage make_kernel_message(Channel ch, std::vector<std::string> buffers = {}) {
  KernelMessage m;
  m.channel = ch;
  m.wire.header = kHeader;
  m.wire.parent_header = kParent;
  m.wire.metadata = kMetadata;
  m.wire.content = kContent;
  m.wire.buffers = std::move(buffers);
  m.msg_id = "a1b2-c3";
  m.msg_type = "comm_msg";
  m.parent_msg_id = "p-9";
  return m;
}

json valid_client_json(std::string_view channel = "shell") {
  return json{{"header", {{"msg_id", "m-1"}, {"msg_type", "execute_request"}, {"session", "s"}}},
              {"parent_header", json::object()},
              {"metadata", {{"k", 1}}},
              {"content", {{"code", "1+1"}, {"silent", false}}},
              {"channel", channel}};
}

// decode_client must report an error: non-empty text, no exception, no crash.
void expect_decode_error(std::string_view data, WsProtocol proto, const std::string& what) {
  ClientMessage out;
  std::string err;
  EXPECT_NO_THROW(err = decode_client(data, proto, out)) << what;
  EXPECT_FALSE(err.empty()) << what << ": accepted (channel " << channel_name(out.channel)
                            << ", content " << out.wire.content << ")";
}

std::string decode_ok(std::string_view data, WsProtocol proto, ClientMessage& out) {
  std::string err;
  EXPECT_NO_THROW(err = decode_client(data, proto, out));
  EXPECT_EQ(err, "");
  return err;
}

// ---- encode_legacy ---------------------------------------------------------------------

TEST(EncodeLegacy, NoBuffersIsJsonTextFrame) {
  for (Channel ch : {Channel::iopub, Channel::shell, Channel::control, Channel::stdin_}) {
    const KernelMessage m = make_kernel_message(ch);
    const WsFrame f = encode_legacy(m);
    EXPECT_FALSE(f.binary);
    const json j = json::parse(f.data);
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j.at("header"), json::parse(kHeader));
    EXPECT_EQ(j.at("parent_header"), json::parse(kParent));
    EXPECT_EQ(j.at("metadata"), json::parse(kMetadata));
    EXPECT_EQ(j.at("content"), json::parse(kContent));
    EXPECT_EQ(j.at("buffers"), json::array());
    EXPECT_EQ(j.at("msg_id"), "a1b2-c3");
    EXPECT_EQ(j.at("msg_type"), "comm_msg");
    EXPECT_EQ(j.at("channel"), std::string(channel_name(ch)));
    EXPECT_EQ(j.size(), 8u) << f.data;
    // The content is relayed as the kernel wrote it, not re-serialised.
    EXPECT_NE(f.data.find(kContent), std::string::npos) << f.data;
  }
}

TEST(EncodeLegacy, EmptyPartsBecomeEmptyObjects) {
  KernelMessage m = make_kernel_message(Channel::iopub);
  m.wire.parent_header.clear();
  m.wire.metadata.clear();
  m.wire.content.clear();
  const json j = json::parse(encode_legacy(m).data);
  EXPECT_EQ(j.at("parent_header"), json::object());
  EXPECT_EQ(j.at("metadata"), json::object());
  EXPECT_EQ(j.at("content"), json::object());
}

TEST(EncodeLegacy, MsgIdAndTypeAreJsonEscaped) {
  KernelMessage m = make_kernel_message(Channel::shell);
  m.msg_id = "quote\"back\\slash\nnl";
  m.msg_type = "t\x01";
  const json j = json::parse(encode_legacy(m).data);
  EXPECT_EQ(j.at("msg_id"), m.msg_id);
  EXPECT_EQ(j.at("msg_type"), m.msg_type);
}

TEST(EncodeLegacy, BuffersMakeBinaryFrame) {
  const std::vector<std::string> bufs = {std::string("abc"), std::string(), all_bytes(),
                                         std::string("\0\0", 2)};
  const KernelMessage m = make_kernel_message(Channel::iopub, bufs);
  const WsFrame f = encode_legacy(m);
  ASSERT_TRUE(f.binary);
  const std::uint32_t nbufs = rd_u32be(f.data, 0);
  EXPECT_EQ(nbufs, 1 + bufs.size());
  EXPECT_EQ(rd_u32be(f.data, 4), 4 * (nbufs + 1)) << "the first offset follows the offset table";

  const LegacyBinary d = jupyter_deserialize_binary(f.data);
  EXPECT_EQ(d.msg.at("header"), json::parse(kHeader));
  EXPECT_EQ(d.msg.at("parent_header"), json::parse(kParent));
  EXPECT_EQ(d.msg.at("metadata"), json::parse(kMetadata));
  EXPECT_EQ(d.msg.at("content"), json::parse(kContent));
  EXPECT_EQ(d.msg.at("msg_id"), "a1b2-c3");
  EXPECT_EQ(d.msg.at("msg_type"), "comm_msg");
  EXPECT_EQ(d.msg.at("channel"), "iopub");
  EXPECT_FALSE(d.msg.contains("buffers")) << "jupyter adds buffers from the binary parts";
  ASSERT_EQ(d.buffers.size(), bufs.size());
  for (std::size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(hex(d.buffers[i]), hex(bufs[i])) << i;
}

TEST(EncodeLegacy, SingleEmptyBufferIsStillBinary) {
  const KernelMessage m = make_kernel_message(Channel::shell, {std::string()});
  const WsFrame f = encode_legacy(m);
  ASSERT_TRUE(f.binary);
  const LegacyBinary d = jupyter_deserialize_binary(f.data);
  ASSERT_EQ(d.buffers.size(), 1u);
  EXPECT_EQ(d.buffers[0], "");
  EXPECT_EQ(d.msg.at("channel"), "shell");
}

// ---- encode_v1 -------------------------------------------------------------------------

TEST(EncodeV1, Layout) {
  for (std::size_t nb : {0u, 1u, 3u}) {
    std::vector<std::string> bufs = {all_bytes(), std::string(), std::string("xyz")};
    bufs.resize(nb);
    const KernelMessage m = make_kernel_message(Channel::control, bufs);
    const WsFrame f = encode_v1(m);
    EXPECT_TRUE(f.binary);
    ASSERT_GE(f.data.size(), 8u);
    const std::uint64_t n = rd_u64le(f.data, 0);
    ASSERT_EQ(n, 6 + nb);
    ASSERT_GE(f.data.size(), 8 * (n + 1));
    std::vector<std::uint64_t> offs;
    for (std::uint64_t i = 0; i < n; ++i) offs.push_back(rd_u64le(f.data, 8 * (i + 1)));
    EXPECT_EQ(offs.front(), 8 * (n + 1));
    EXPECT_EQ(offs.back(), f.data.size()) << "last offset = total length";
    for (std::size_t i = 0; i + 1 < offs.size(); ++i) ASSERT_LE(offs[i], offs[i + 1]);
    auto seg = [&](std::size_t i) { return f.data.substr(offs[i], offs[i + 1] - offs[i]); };
    EXPECT_EQ(seg(0), "control");
    EXPECT_EQ(seg(1), kHeader);
    EXPECT_EQ(seg(2), kParent);
    EXPECT_EQ(seg(3), kMetadata);
    EXPECT_EQ(seg(4), kContent);
    for (std::size_t i = 0; i < nb; ++i) EXPECT_EQ(hex(seg(5 + i)), hex(bufs[i])) << i;
  }
}

TEST(EncodeV1, RoundTripsThroughDecodeClient) {
  const std::vector<std::string> bufs = {all_bytes(), std::string()};
  const KernelMessage m = make_kernel_message(Channel::stdin_, bufs);
  ClientMessage out;
  decode_ok(encode_v1(m).data, WsProtocol::v1, out);
  EXPECT_EQ(out.channel, Channel::stdin_);
  EXPECT_EQ(out.msg_id, "a1b2-c3");
  EXPECT_EQ(out.msg_type, "comm_msg");
  EXPECT_EQ(out.wire.header, kHeader);
  EXPECT_EQ(out.wire.parent_header, kParent);
  EXPECT_EQ(out.wire.metadata, kMetadata);
  EXPECT_EQ(out.wire.content, kContent);
  ASSERT_EQ(out.wire.buffers.size(), 2u);
  EXPECT_EQ(out.wire.buffers[0], all_bytes());
  EXPECT_EQ(out.wire.buffers[1], "");
}

// ---- gathered frames: large parts are sent from the message, not copied -----------------

// Whether one of g's pieces is `part` itself (the same bytes in memory, not a copy).
bool sent_in_place(const WsGather& g, const std::string& part) {
  for (std::size_t i = 0; i < g.count(); ++i)
    if (g.piece(i).data() == part.data() && g.piece(i).size() == part.size() && !g.owned(i)) return true;
  return false;
}

KernelMessage big_message(Channel ch, std::vector<std::string> buffers = {}) {
  KernelMessage m = make_kernel_message(ch, std::move(buffers));
  m.wire.content = R"({"name": "stdout", "text": ")" + std::string(100000, 'x') + R"(\n"})";
  return m;
}

TEST(WsGather, SmallMessageIsOnePiece) {
  const KernelMessage m = make_kernel_message(Channel::iopub);
  EXPECT_EQ(gather_legacy(m).count(), 1u);
  EXPECT_EQ(gather_v1(m).count(), 1u);
  EXPECT_EQ(gather_legacy(m).flatten().data, encode_legacy(m).data);
}

TEST(WsGather, LegacyJsonSendsLargeContentInPlace) {
  const KernelMessage m = big_message(Channel::iopub);
  const WsGather g = gather_legacy(m);
  EXPECT_FALSE(g.binary());
  EXPECT_TRUE(sent_in_place(g, m.wire.content));
  const WsFrame f = g.flatten();
  EXPECT_EQ(f.data.size(), g.size());
  const json j = json::parse(f.data);
  EXPECT_EQ(j.at("content"), json::parse(m.wire.content));
  EXPECT_EQ(j.at("header"), json::parse(kHeader));
  EXPECT_EQ(j.at("channel"), "iopub");
}

TEST(WsGather, LegacyBinarySendsContentAndBuffersInPlace) {
  std::vector<std::string> bufs = {std::string(50000, '\xff'), std::string("small"), all_bytes()};
  KernelMessage m = big_message(Channel::iopub, bufs);
  // Parts each under the copy threshold that together make one own piece over it: those bytes
  // must be copied out of the JSON's own buffer, not referenced.
  m.wire.metadata = R"({"pad": ")" + std::string(3000, 'm') + R"("})";
  m.wire.parent_header = R"({"msg_id": "p-9", "pad": ")" + std::string(3000, 'p') + R"("})";
  const WsGather g = gather_legacy(m);
  ASSERT_TRUE(g.binary());
  EXPECT_TRUE(sent_in_place(g, m.wire.content));
  EXPECT_TRUE(sent_in_place(g, m.wire.buffers[0]));
  const LegacyBinary d = jupyter_deserialize_binary(g.flatten().data);
  EXPECT_EQ(d.msg.at("content"), json::parse(m.wire.content));
  EXPECT_EQ(d.msg.at("metadata"), json::parse(m.wire.metadata));
  EXPECT_EQ(d.msg.at("parent_header"), json::parse(m.wire.parent_header));
  ASSERT_EQ(d.buffers.size(), bufs.size());
  for (std::size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(hex(d.buffers[i]), hex(bufs[i])) << i;
}

TEST(WsGather, V1SendsLargePartsInPlace) {
  const KernelMessage m = big_message(Channel::shell, {std::string(8192, 'b')});
  const WsGather g = gather_v1(m);
  EXPECT_TRUE(sent_in_place(g, m.wire.content));
  EXPECT_TRUE(sent_in_place(g, m.wire.buffers[0]));
  ClientMessage out;
  decode_ok(g.flatten().data, WsProtocol::v1, out);
  EXPECT_EQ(out.wire.content, m.wire.content);
  ASSERT_EQ(out.wire.buffers.size(), 1u);
  EXPECT_EQ(out.wire.buffers[0], m.wire.buffers[0]);
}

// ---- cross-checks against jupyter_server ------------------------------------------------

const char* kPyDecode = R"PY(
import json, sys
from jupyter_server.base.zmqhandlers import deserialize_binary_message, deserialize_msg_from_ws_v1
legacy = open(sys.argv[1], 'rb').read()
v1 = open(sys.argv[2], 'rb').read()
msg = deserialize_binary_message(legacy)
bufs = [bytes(b).hex() for b in msg.pop('buffers')]
channel, parts = deserialize_msg_from_ws_v1(v1)
print(json.dumps({'legacy': msg, 'legacy_buffers': bufs,
                  'v1_channel': channel, 'v1_parts': [bytes(p).hex() for p in parts]}))
)PY";

TEST(JupyterInterop, JupyterDecodesOurFrames) {
  TempDir dir{"kgate-wscodec"};
  const std::vector<std::string> bufs = {std::string(), all_bytes(), std::string("tail")};
  const KernelMessage m = make_kernel_message(Channel::iopub, bufs);
  const WsFrame legacy = encode_legacy(m);
  const WsFrame v1 = encode_v1(m);
  ASSERT_TRUE(legacy.binary);
  write_file(dir.path() / "legacy.bin", legacy.data);
  write_file(dir.path() / "v1.bin", v1.data);
  const std::string out =
      run_python(dir, kPyDecode, {(dir.path() / "legacy.bin").string(), (dir.path() / "v1.bin").string()});
  const json j = json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;

  const json& lm = j.at("legacy");
  EXPECT_EQ(lm.at("header"), json::parse(kHeader));
  EXPECT_EQ(lm.at("parent_header"), json::parse(kParent));
  EXPECT_EQ(lm.at("metadata"), json::parse(kMetadata));
  EXPECT_EQ(lm.at("content"), json::parse(kContent));
  EXPECT_EQ(lm.at("msg_id"), "a1b2-c3");
  EXPECT_EQ(lm.at("msg_type"), "comm_msg");
  EXPECT_EQ(lm.at("channel"), "iopub");
  ASSERT_EQ(j.at("legacy_buffers").size(), bufs.size());
  for (std::size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(j.at("legacy_buffers")[i], hex(bufs[i])) << i;

  EXPECT_EQ(j.at("v1_channel"), "iopub");
  const json& parts = j.at("v1_parts");
  ASSERT_EQ(parts.size(), 4 + bufs.size());
  EXPECT_EQ(parts[0], hex(kHeader));
  EXPECT_EQ(parts[1], hex(kParent));
  EXPECT_EQ(parts[2], hex(kMetadata));
  EXPECT_EQ(parts[3], hex(kContent));
  for (std::size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(parts[4 + i], hex(bufs[i])) << i;
}

const char* kPyEncode = R"PY(
import json, sys, os
from jupyter_server.base.zmqhandlers import serialize_binary_message, serialize_msg_to_ws_v1
d = sys.argv[1]
header = {'msg_id': 'py-id-1', 'msg_type': 'comm_msg', 'session': 'py-sess', 'username': 'u',
          'version': '5.3'}
parent = {'msg_id': 'py-parent'}
metadata = {'meta': [1, None, True]}
content = {'comm_id': 'c1', 'data': {'text': 'h\u00e9llo \u2603'}}
buffers = [b'', bytes(range(256)), b'end']
msg = {'header': header, 'parent_header': parent, 'metadata': metadata, 'content': content,
       'buffers': buffers, 'channel': 'control'}
open(os.path.join(d, 'legacy.bin'), 'wb').write(serialize_binary_message(msg))
parts = [json.dumps(x).encode('utf-8') for x in (header, parent, metadata, content)] + buffers
open(os.path.join(d, 'v1.bin'), 'wb').write(serialize_msg_to_ws_v1(parts, 'stdin'))
for i, p in enumerate(parts[:4]):
    open(os.path.join(d, 'part%d.json' % i), 'wb').write(p)
)PY";

TEST(JupyterInterop, WeDecodeJupyterFrames) {
  TempDir dir{"kgate-wscodec"};
  run_python(dir, kPyEncode, {dir.path().string()});
  const json header = {{"msg_id", "py-id-1"}, {"msg_type", "comm_msg"}, {"session", "py-sess"},
                       {"username", "u"}, {"version", "5.3"}};
  const json parent = {{"msg_id", "py-parent"}};
  const json metadata = {{"meta", {1, nullptr, true}}};
  const json content = {{"comm_id", "c1"}, {"data", {{"text", "h\xc3\xa9llo \xe2\x98\x83"}}}};
  const std::vector<std::string> bufs = {std::string(), all_bytes(), std::string("end")};

  {
    SCOPED_TRACE("legacy binary");
    ClientMessage out;
    decode_ok(read_file(dir.path() / "legacy.bin"), WsProtocol::legacy, out);
    EXPECT_EQ(out.channel, Channel::control);
    EXPECT_EQ(out.msg_id, "py-id-1");
    EXPECT_EQ(out.msg_type, "comm_msg");
    EXPECT_EQ(json::parse(out.wire.header), header);
    EXPECT_EQ(json::parse(out.wire.parent_header), parent);
    EXPECT_EQ(json::parse(out.wire.metadata), metadata);
    EXPECT_EQ(json::parse(out.wire.content), content);
    ASSERT_EQ(out.wire.buffers.size(), bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(hex(out.wire.buffers[i]), hex(bufs[i])) << i;
  }
  {
    SCOPED_TRACE("v1");
    ClientMessage out;
    decode_ok(read_file(dir.path() / "v1.bin"), WsProtocol::v1, out);
    EXPECT_EQ(out.channel, Channel::stdin_);
    EXPECT_EQ(out.msg_id, "py-id-1");
    EXPECT_EQ(out.msg_type, "comm_msg");
    // v1 parts are relayed byte for byte.
    EXPECT_EQ(out.wire.header, read_file(dir.path() / "part0.json"));
    EXPECT_EQ(out.wire.parent_header, read_file(dir.path() / "part1.json"));
    EXPECT_EQ(out.wire.metadata, read_file(dir.path() / "part2.json"));
    EXPECT_EQ(out.wire.content, read_file(dir.path() / "part3.json"));
    EXPECT_EQ(json::parse(out.wire.content), content);
    ASSERT_EQ(out.wire.buffers.size(), bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(hex(out.wire.buffers[i]), hex(bufs[i])) << i;
  }
}

// ---- decode_client: accepted frames -----------------------------------------------------

TEST(DecodeClient, LegacyJson) {
  for (std::string ch : {"shell", "control", "stdin"}) {
    ClientMessage out;
    decode_ok(valid_client_json(ch).dump(), WsProtocol::legacy, out);
    EXPECT_EQ(channel_name(out.channel), ch);
    EXPECT_EQ(out.msg_id, "m-1");
    EXPECT_EQ(out.msg_type, "execute_request");
    EXPECT_EQ(json::parse(out.wire.header), valid_client_json().at("header"));
    EXPECT_EQ(json::parse(out.wire.parent_header), json::object());
    EXPECT_EQ(json::parse(out.wire.metadata), (json{{"k", 1}}));
    EXPECT_EQ(json::parse(out.wire.content), valid_client_json().at("content"));
    EXPECT_TRUE(out.wire.buffers.empty());
  }
}

TEST(DecodeClient, LegacyJsonMissingChannelIsShell) {
  json j = valid_client_json();
  j.erase("channel");
  ClientMessage out;
  out.channel = Channel::control;
  decode_ok(j.dump(), WsProtocol::legacy, out);
  EXPECT_EQ(out.channel, Channel::shell);
}

TEST(DecodeClient, LegacyJsonLeadingWhitespace) {
  ClientMessage out;
  decode_ok(" \t\r\n  " + valid_client_json("control").dump() + "\n", WsProtocol::legacy, out);
  EXPECT_EQ(out.channel, Channel::control);
  EXPECT_EQ(out.msg_id, "m-1");
}

TEST(DecodeClient, LegacyJsonMissingOrNullPartsAreEmptyObjects) {
  json j = valid_client_json();
  j.erase("metadata");
  j.erase("content");
  j["parent_header"] = nullptr;
  j["buffers"] = json::array();
  ClientMessage out;
  decode_ok(j.dump(), WsProtocol::legacy, out);
  EXPECT_EQ(out.wire.parent_header, "{}");
  EXPECT_EQ(out.wire.metadata, "{}");
  EXPECT_EQ(out.wire.content, "{}");
}

TEST(DecodeClient, LegacyBinarySentAsTextOrBinary) {
  // The decoder does not see the opcode: the same bytes decode either way.
  json j = valid_client_json("stdin");
  j.erase("channel");
  j["channel"] = "stdin";
  const std::vector<std::string> bufs = {all_bytes(), std::string(), std::string("z")};
  const std::string frame = make_legacy_binary(j.dump(), bufs);
  ClientMessage out;
  decode_ok(frame, WsProtocol::legacy, out);
  EXPECT_EQ(out.channel, Channel::stdin_);
  EXPECT_EQ(out.msg_id, "m-1");
  EXPECT_EQ(json::parse(out.wire.content), valid_client_json().at("content"));
  ASSERT_EQ(out.wire.buffers.size(), 3u);
  EXPECT_EQ(out.wire.buffers[0], all_bytes());
  EXPECT_EQ(out.wire.buffers[1], "");
  EXPECT_EQ(out.wire.buffers[2], "z");
}

TEST(DecodeClient, LegacyBinaryWithoutBuffers) {
  ClientMessage out;
  decode_ok(make_legacy_binary(valid_client_json().dump(), {}), WsProtocol::legacy, out);
  EXPECT_EQ(out.msg_id, "m-1");
  EXPECT_TRUE(out.wire.buffers.empty());
}

TEST(DecodeClient, V1) {
  const std::vector<std::string> parts = {R"({"msg_id":"v1-id","msg_type":"kernel_info_request"})", "{}", "",
                                          R"({"x": 1})", all_bytes(), ""};
  ClientMessage out;
  decode_ok(make_v1("control", parts), WsProtocol::v1, out);
  EXPECT_EQ(out.channel, Channel::control);
  EXPECT_EQ(out.msg_id, "v1-id");
  EXPECT_EQ(out.msg_type, "kernel_info_request");
  EXPECT_EQ(out.wire.header, parts[0]);
  EXPECT_EQ(out.wire.parent_header, "{}");
  EXPECT_EQ(out.wire.metadata, "{}") << "an empty segment is an empty object";
  EXPECT_EQ(out.wire.content, R"({"x": 1})");
  ASSERT_EQ(out.wire.buffers.size(), 2u);
  EXPECT_EQ(out.wire.buffers[0], all_bytes());
  EXPECT_EQ(out.wire.buffers[1], "");
}

// ---- decode_client: errors --------------------------------------------------------------

TEST(DecodeClientErrors, Garbage) {
  for (auto proto : {WsProtocol::legacy, WsProtocol::v1}) {
    expect_decode_error("", proto, "empty");
    expect_decode_error("hello world", proto, "text");
    expect_decode_error(std::string(1, '\0'), proto, "one NUL");
    expect_decode_error(std::string(64, '\0'), proto, "NULs");
    expect_decode_error(std::string(64, '\xff'), proto, "0xff");
    expect_decode_error("[1,2,3]", proto, "array");
    expect_decode_error("   ", proto, "blanks");
  }
  expect_decode_error("{", WsProtocol::legacy, "open brace");
  expect_decode_error("  {\"header\":", WsProtocol::legacy, "cut JSON");
  expect_decode_error(valid_client_json().dump() + "x", WsProtocol::legacy, "trailing garbage");
  expect_decode_error(valid_client_json().dump(), WsProtocol::v1, "legacy JSON on a v1 socket");
}

TEST(DecodeClientErrors, TruncatedLegacyBinary) {
  const std::string frame = make_legacy_binary(valid_client_json().dump(), {std::string("abc"), all_bytes()});
  // A legacy frame has no total length: only a cut before the last buffer is detectable.
  const std::size_t last = rd_u32be(frame, 4 + 4 * 2);
  for (std::size_t len = 0; len < last; ++len)
    expect_decode_error(std::string_view(frame).substr(0, len), WsProtocol::legacy, "cut at " + std::to_string(len));
}

TEST(DecodeClientErrors, TruncatedV1) {
  const std::string frame = make_v1("shell", {R"({"msg_id":"i","msg_type":"t"})", "{}", "{}", "{}", "buf"});
  for (std::size_t len = 0; len < frame.size(); ++len)
    expect_decode_error(std::string_view(frame).substr(0, len), WsProtocol::v1, "cut at " + std::to_string(len));
}

TEST(DecodeClientErrors, LegacyBinaryBadOffsets) {
  const std::string js = valid_client_json().dump();
  const std::string good = make_legacy_binary(js, {std::string("abc"), std::string("defg")});
  {
    ClientMessage out;
    decode_ok(good, WsProtocol::legacy, out);
  }
  std::string f = good;
  set_u32be(f, 4, std::uint32_t(good.size() + 1));
  expect_decode_error(f, WsProtocol::legacy, "first offset past the end");
  f = good;
  set_u32be(f, 4, 0);
  expect_decode_error(f, WsProtocol::legacy, "first offset inside the offset table");
  f = good;
  set_u32be(f, 4, 8);
  expect_decode_error(f, WsProtocol::legacy, "first offset inside the offset table (2)");
  f = good;
  set_u32be(f, 8, rd_u32be(good, 12) + 1);  // buffer 1 starts after buffer 2
  expect_decode_error(f, WsProtocol::legacy, "decreasing offsets");
  f = good;
  set_u32be(f, 12, 0xffffffffu);
  expect_decode_error(f, WsProtocol::legacy, "last offset 0xffffffff");
  f = good;
  set_u32be(f, 8, rd_u32be(good, 4) - 1);
  expect_decode_error(f, WsProtocol::legacy, "buffer before the JSON part");
}

TEST(DecodeClientErrors, LegacyBinaryBadCount) {
  const std::string good = make_legacy_binary(valid_client_json().dump(), {std::string("abc")});
  for (std::uint32_t n : {0u, 3u, 1025u, 100000u, 0x7fffffffu, 0x80000000u, 0xffffffffu}) {
    std::string f = good;
    set_u32be(f, 0, n);
    expect_decode_error(f, WsProtocol::legacy, "nbufs " + std::to_string(n));
  }
  // A count whose offset table alone is longer than the frame.
  std::string f;
  wr_u32be(f, 1000);
  wr_u32be(f, 8);
  expect_decode_error(f, WsProtocol::legacy, "offset table longer than the frame");
}

TEST(DecodeClientErrors, V1BadOffsets) {
  const std::vector<std::string> parts = {R"({"msg_id":"i","msg_type":"t"})", "{}", "{}", "{}", "buf"};
  const std::string good = make_v1("shell", parts);
  {
    ClientMessage out;
    decode_ok(good, WsProtocol::v1, out);
  }
  const std::uint64_t n = rd_u64le(good, 0);
  ASSERT_EQ(n, 7u);
  auto at = [](std::uint64_t i) { return std::size_t(8 * (i + 1)); };
  std::string f = good;
  set_u64le(f, at(n - 1), good.size() + 1);
  expect_decode_error(f, WsProtocol::v1, "last offset past the end");
  f = good;
  set_u64le(f, at(0), 0);
  expect_decode_error(f, WsProtocol::v1, "first offset inside the table");
  f = good;
  set_u64le(f, at(2), rd_u64le(good, at(3)) + 1);
  expect_decode_error(f, WsProtocol::v1, "decreasing offsets");
  f = good;
  set_u64le(f, at(1), ~std::uint64_t(0));
  expect_decode_error(f, WsProtocol::v1, "offset 2^64-1");
  f = good;
  set_u64le(f, at(n - 1), ~std::uint64_t(0));
  expect_decode_error(f, WsProtocol::v1, "last offset 2^64-1");
}

TEST(DecodeClientErrors, V1BadCount) {
  const std::string good = make_v1("shell", {R"({"msg_id":"i","msg_type":"t"})", "{}", "{}", "{}"});
  for (std::uint64_t n : {std::uint64_t(0), std::uint64_t(1), std::uint64_t(5), std::uint64_t(7),
                          std::uint64_t(1025), std::uint64_t(1) << 32, std::uint64_t(1) << 61,
                          (std::uint64_t(1) << 61) - 1, ~std::uint64_t(0), ~std::uint64_t(0) / 8}) {
    std::string f = good;
    set_u64le(f, 0, n);
    expect_decode_error(f, WsProtocol::v1, "offset count " + std::to_string(n));
  }
}

TEST(DecodeClientErrors, Channels) {
  for (std::string ch : {"iopub", "nope", "", "Shell", "hb"}) {
    expect_decode_error(valid_client_json(ch).dump(), WsProtocol::legacy, "legacy channel '" + ch + "'");
    expect_decode_error(make_legacy_binary(valid_client_json(ch).dump(), {"b"}), WsProtocol::legacy,
                        "legacy binary channel '" + ch + "'");
    expect_decode_error(make_v1(ch, {R"({"msg_id":"i","msg_type":"t"})", "{}", "{}", "{}"}), WsProtocol::v1,
                        "v1 channel '" + ch + "'");
  }
  json j = valid_client_json();
  j["channel"] = 5;
  expect_decode_error(j.dump(), WsProtocol::legacy, "numeric channel");
}

TEST(DecodeClientErrors, LegacyHeaderProblems) {
  auto with = [](auto mutate) {
    json j = valid_client_json();
    mutate(j);
    return j.dump();
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"missing header", with([](json& j) { j.erase("header"); })},
      {"null header", with([](json& j) { j["header"] = nullptr; })},
      {"array header", with([](json& j) { j["header"] = json::array({1}); })},
      {"string header", with([](json& j) { j["header"] = "{}"; })},
      {"missing msg_id", with([](json& j) { j["header"].erase("msg_id"); })},
      {"missing msg_type", with([](json& j) { j["header"].erase("msg_type"); })},
      {"empty msg_id", with([](json& j) { j["header"]["msg_id"] = ""; })},
      {"numeric msg_id", with([](json& j) { j["header"]["msg_id"] = 7; })},
      {"null msg_type", with([](json& j) { j["header"]["msg_type"] = nullptr; })},
      {"msg_id only at top level", with([](json& j) {
         j["header"].erase("msg_id");
         j["msg_id"] = "m-1";
       })},
  };
  for (auto& [what, text] : cases) {
    expect_decode_error(text, WsProtocol::legacy, "legacy JSON: " + what);
    expect_decode_error(make_legacy_binary(text, {"b"}), WsProtocol::legacy, "legacy binary: " + what);
  }
}

TEST(DecodeClientErrors, LegacyNonObjectParts) {
  for (const char* key : {"content", "metadata", "parent_header"}) {
    for (json bad : {json::array({1}), json("text"), json(5), json(true)}) {
      json j = valid_client_json();
      j[key] = bad;
      expect_decode_error(j.dump(), WsProtocol::legacy, std::string("legacy JSON ") + key + " = " + bad.dump());
      expect_decode_error(make_legacy_binary(j.dump(), {"b"}), WsProtocol::legacy,
                          std::string("legacy binary ") + key + " = " + bad.dump());
    }
  }
  expect_decode_error("[" + valid_client_json().dump() + "]", WsProtocol::legacy, "message in an array");
  expect_decode_error(make_legacy_binary("[1]", {}), WsProtocol::legacy, "legacy binary JSON part is an array");
  expect_decode_error(make_legacy_binary("{not json", {"b"}), WsProtocol::legacy, "legacy binary invalid JSON");
}

TEST(DecodeClientErrors, V1HeaderProblems) {
  const std::vector<std::pair<std::string, std::string>> headers = {
      {"empty header", ""},
      {"invalid JSON header", "{\"msg_id\":"},
      {"array header", "[1]"},
      {"string header", "\"x\""},
      {"missing msg_id", R"({"msg_type":"t"})"},
      {"missing msg_type", R"({"msg_id":"i"})"},
      {"numeric msg_id", R"({"msg_id":1,"msg_type":"t"})"},
      {"null msg_type", R"({"msg_id":"i","msg_type":null})"},
      {"header with trailing garbage", R"({"msg_id":"i","msg_type":"t"}x)"},
  };
  for (auto& [what, h] : headers)
    expect_decode_error(make_v1("shell", {h, "{}", "{}", "{}"}), WsProtocol::v1, "v1: " + what);
}

// The legacy decoder refuses an empty header.msg_id or msg_type ("must be a non-empty
// string"); the v1 decoder must refuse the same header.
TEST(DecodeClientErrors, V1EmptyMsgIdOrType) {
  expect_decode_error(make_v1("shell", {R"({"msg_id":"","msg_type":"t"})", "{}", "{}", "{}"}), WsProtocol::v1,
                      "v1: empty msg_id");
  expect_decode_error(make_v1("shell", {R"({"msg_id":"i","msg_type":""})", "{}", "{}", "{}"}), WsProtocol::v1,
                      "v1: empty msg_type");
}

TEST(DecodeClientErrors, V1InvalidJsonParts) {
  const std::string h = R"({"msg_id":"i","msg_type":"t"})";
  for (int i = 1; i <= 3; ++i) {
    std::vector<std::string> parts = {h, "{}", "{}", "{}"};
    parts[std::size_t(i)] = "{\"a\":";
    expect_decode_error(make_v1("shell", parts), WsProtocol::v1, "v1 part " + std::to_string(i) + " invalid JSON");
  }
}

// nlohmann's parser stops at a NUL byte as if the input ended there, so "{}\0x" would parse as
// {}; kgate relays v1 parts as they came, and must not relay one that is not JSON (found by
// fuzz_ws_codec: a content of "{}\0..." re-encoded for a legacy client did not decode back).
TEST(DecodeClientErrors, V1PartsWithANulByte) {
  const std::string h = R"({"msg_id":"i","msg_type":"t"})";
  const std::string with_nul("{}\0{\"x\": 1}", 11);
  for (int i = 0; i <= 3; ++i) {
    std::vector<std::string> parts = {h, "{}", "{}", "{}"};
    parts[std::size_t(i)] = i == 0 ? h + std::string(1, '\0') : with_nul;
    ClientMessage out;
    const std::string err = decode_client(make_v1("shell", parts), WsProtocol::v1, out);
    EXPECT_NE(err.find("NUL byte"), std::string::npos) << "part " << i << ": " << err;
  }
  // In a string, as JSON writes it, a NUL is fine.
  ClientMessage out;
  EXPECT_EQ(decode_client(make_v1("shell", {h, "{}", "{}", R"({"text": "a\u0000b"})"}), WsProtocol::v1, out), "");
}

// The legacy decoder requires parent_header, metadata and content to be objects; the v1
// decoder only checks that they are JSON, so a non-object content reaches the kernel.
TEST(DecodeClientErrors, V1NonObjectParts) {
  const std::string h = R"({"msg_id":"i","msg_type":"t"})";
  const char* names[] = {"", "parent_header", "metadata", "content"};
  std::vector<std::string> accepted;
  for (int i = 1; i <= 3; ++i) {
    for (const char* bad : {"[1]", "5", "\"text\"", "true", "null"}) {
      std::vector<std::string> parts = {h, "{}", "{}", "{}"};
      parts[std::size_t(i)] = bad;
      ClientMessage out;
      std::string err;
      EXPECT_NO_THROW(err = decode_client(make_v1("shell", parts), WsProtocol::v1, out));
      // null may be read as {} (the legacy decoder does that), but never relayed as "null".
      const std::string* got[] = {nullptr, &out.wire.parent_header, &out.wire.metadata, &out.wire.content};
      const bool normalised = std::string(bad) == "null" && err.empty() && *got[i] == "{}";
      if (err.empty() && !normalised) accepted.push_back(std::string(names[i]) + " = " + bad);
    }
  }
  std::string list;
  for (auto& a : accepted) list += "\n  " + a;
  EXPECT_TRUE(accepted.empty()) << "v1 frames accepted with a non-object part:" << list;
}

// ---- nesting limit -----------------------------------------------------------------------

std::string nested_arrays(std::size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

// Client JSON may nest kMaxJsonDepth levels (counting the message object itself); one more
// is refused, in every layout.
TEST(DecodeClientNesting, LimitIsExact) {
  const std::size_t limit = std::size_t(kMaxJsonDepth);
  auto legacy = [](std::size_t arrays) {  // {"header":{..},"content":{"a":[[..]]}}: 2 + arrays
    return R"({"header":{"msg_id":"i","msg_type":"t"},"content":{"a":)" + nested_arrays(arrays) + "}}";
  };
  auto v1 = [](std::size_t arrays) {  // content {"a":[[..]]}: 1 + arrays
    return make_v1("shell", {R"({"msg_id":"i","msg_type":"t"})", "{}", "{}", "{\"a\":" + nested_arrays(arrays) + "}"});
  };
  ClientMessage out;
  EXPECT_EQ(decode_client(legacy(limit - 2), WsProtocol::legacy, out), "");
  EXPECT_EQ(decode_client(make_legacy_binary(legacy(limit - 2), {"b"}), WsProtocol::legacy, out), "");
  EXPECT_EQ(decode_client(v1(limit - 1), WsProtocol::v1, out), "");
  EXPECT_EQ(json::parse(out.wire.content).at("a").dump(), nested_arrays(limit - 1));
  expect_decode_error(legacy(limit - 1), WsProtocol::legacy, "legacy JSON one level too deep");
  expect_decode_error(make_legacy_binary(legacy(limit - 1), {"b"}), WsProtocol::legacy, "legacy binary one level too deep");
  expect_decode_error(v1(limit), WsProtocol::v1, "v1 content one level too deep");
  for (int part = 1; part <= 3; ++part) {
    std::vector<std::string> parts = {R"({"msg_id":"i","msg_type":"t"})", "{}", "{}", "{}"};
    parts[std::size_t(part)] = "{\"a\":" + nested_arrays(limit) + "}";
    expect_decode_error(make_v1("shell", parts), WsProtocol::v1, "v1 part " + std::to_string(part) + " too deep");
  }
  expect_decode_error(make_v1("shell", {R"({"msg_id":"i","msg_type":"t","x":)" + nested_arrays(limit) + "}", "{}", "{}", "{}"}),
                      WsProtocol::v1, "v1 header too deep");
}

// Brackets inside strings (code, text, escaped quotes) are not nesting.
TEST(DecodeClientNesting, BracketsInStringsDoNotCount) {
  const std::string brackets(5000, '[');
  json j = valid_client_json();
  j["content"]["code"] = "print(\"" + brackets + "\\\") + \"" + std::string(3000, '{') + "\"";
  j["header"]["note"] = "\\" + brackets;
  ClientMessage out;
  EXPECT_EQ(decode_client(j.dump(), WsProtocol::legacy, out), "");
  EXPECT_EQ(json::parse(out.wire.content).at("code"), j["content"]["code"]);
  EXPECT_EQ(decode_client(make_legacy_binary(j.dump(), {"b"}), WsProtocol::legacy, out), "");
  EXPECT_EQ(decode_client(make_v1("shell", {j["header"].dump(), "{}", "{}", j["content"].dump()}), WsProtocol::v1, out), "");
  EXPECT_EQ(json::parse(out.wire.content).at("code"), j["content"]["code"]);
}

// ---- robustness -------------------------------------------------------------------------

// Runs `fn` in a forked child: "" if the child exited normally with status 0, else how it
// ended (a stack overflow or any other crash kills only the child, not the test binary).
std::string survives(const std::function<void()>& fn) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    fn();
    ::_exit(0);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return "waitpid failed";
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0) return "exit status " + std::to_string(WEXITSTATUS(status));
  return "";
}

// A hostile client can nest JSON deeply; the decoder must answer (accept or refuse) without
// overflowing the stack.  jupyter_server refuses such a message (RecursionError).
TEST(DecodeClientRobustness, DeeplyNestedJson) {
  const std::size_t depth = 100000;  // a 200 kB frame, far below max_ws_message_bytes
  const std::string h = R"({"msg_id":"i","msg_type":"t"})";
  const std::string legacy = R"({"header":{"msg_id":"i","msg_type":"t"},"content":{"a":)" + nested_arrays(depth) + "}}";
  const std::string legacy_hdr = R"({"header":{"msg_id":"i","msg_type":"t","x":)" + nested_arrays(depth) + "}}";
  const std::string v1 = make_v1("shell", {h, "{}", "{}", "{\"a\":" + nested_arrays(depth) + "}"});
  auto run = [](std::string_view data, WsProtocol proto) {
    return [data, proto] {
      ClientMessage out;
      try {
        (void)decode_client(data, proto, out);
      } catch (...) {
        ::_exit(3);
      }
    };
  };
  EXPECT_EQ(survives(run(legacy, WsProtocol::legacy)), "") << "legacy JSON, nested content";
  EXPECT_EQ(survives(run(legacy_hdr, WsProtocol::legacy)), "") << "legacy JSON, nested header";
  EXPECT_EQ(survives(run(make_legacy_binary(legacy, {"b"}), WsProtocol::legacy)), "") << "legacy binary";
  EXPECT_EQ(survives(run(v1, WsProtocol::v1)), "") << "v1, nested content";
}

// On success the decoder's output must be sane: a client channel and JSON parts.
void check_decoded(std::string_view data, WsProtocol proto) {
  ClientMessage out;
  std::string err;
  ASSERT_NO_THROW(err = decode_client(data, proto, out)) << hex(data.substr(0, 64));
  if (!err.empty()) return;
  EXPECT_NE(out.channel, Channel::iopub);
  EXPECT_TRUE(json::accept(out.wire.header)) << hex(data.substr(0, 64));
  EXPECT_TRUE(json::accept(out.wire.parent_header));
  EXPECT_TRUE(json::accept(out.wire.metadata));
  EXPECT_TRUE(json::accept(out.wire.content));
}

TEST(DecodeClientFuzz, RandomBytes) {
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> len(0, 160);
  for (int iter = 0; iter < 4000; ++iter) {
    std::string s(std::size_t(len(rng)), '\0');
    for (auto& c : s) c = char(byte(rng));
    // Sometimes make the prefix look like a plausible header so the decoders go further.
    if (iter % 4 == 1 && s.size() >= 8) set_u32be(s, 0, std::uint32_t(iter % 5));
    if (iter % 4 == 2 && s.size() >= 8) set_u64le(s, 0, std::uint64_t(6 + iter % 3));
    if (iter % 4 == 3 && !s.empty()) s[0] = '{';
    check_decoded(s, WsProtocol::legacy);
    check_decoded(s, WsProtocol::v1);
    if (HasFatalFailure()) return;
  }
}

TEST(DecodeClientFuzz, MutatedValidFrames) {
  const std::string js = valid_client_json("control").dump();
  const std::vector<std::pair<std::string, WsProtocol>> seeds = {
      {js, WsProtocol::legacy},
      {make_legacy_binary(js, {std::string("abc"), all_bytes().substr(0, 40)}), WsProtocol::legacy},
      {make_v1("shell", {R"({"msg_id":"i","msg_type":"t"})", "{}", R"({"a":1})", R"({"b":[1,2]})", "xy", ""}),
       WsProtocol::v1},
  };
  std::mt19937 rng(77);
  std::uniform_int_distribution<int> byte(0, 255);
  for (const auto& [seed, proto] : seeds) {
    {
      ClientMessage out;
      decode_ok(seed, proto, out);
    }
    for (int iter = 0; iter < 3000; ++iter) {
      std::string s = seed;
      const int edits = 1 + int(rng() % 4);
      for (int e = 0; e < edits && !s.empty(); ++e) {
        const std::size_t pos = rng() % s.size();
        switch (rng() % 5) {
          case 0: s[pos] = char(byte(rng)); break;                       // flip a byte
          case 1: s.resize(pos); break;                                  // truncate
          case 2: s.insert(pos, 1, char(byte(rng))); break;              // insert
          case 3: s.erase(pos, 1 + rng() % 8); break;                    // delete a run
          case 4: s[pos % std::min<std::size_t>(s.size(), 64)] = char(byte(rng)); break;  // header area
        }
      }
      check_decoded(s, proto);
      // Either opcode and either protocol may receive any bytes.
      check_decoded(s, proto == WsProtocol::v1 ? WsProtocol::legacy : WsProtocol::v1);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace kgate::gw
