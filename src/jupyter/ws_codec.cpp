// Websocket message formats of the Jupyter kernels API: legacy JSON, legacy binary and v1.
#include "kgate/jupyter/ws_codec.hpp"

#include <cstdint>
#include <cstring>
#include <vector>

namespace kgate {

namespace {

void put_u32be(std::string& s, std::uint32_t v) {
  char b[4] = {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  s.append(b, 4);
}
std::uint32_t get_u32be(const unsigned char* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) |
         std::uint32_t(p[3]);
}
void put_u64le(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}
std::uint64_t get_u64le(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// {"header":H,"parent_header":P,"metadata":M,"content":C,[buffers:[],]"msg_id":..,"msg_type":..,"channel":..}
void legacy_json(const KernelMessage& m, bool with_buffers_key, WsGather& out) {
  const WireMessage& w = m.wire;
  auto part = [](const std::string& s) { return s.empty() ? std::string_view("{}") : std::string_view(s); };
  out.own("{\"header\":");
  out.view(w.header);
  out.own(",\"parent_header\":");
  out.view(part(w.parent_header));
  out.own(",\"metadata\":");
  out.view(part(w.metadata));
  out.own(",\"content\":");
  out.view(part(w.content));
  if (with_buffers_key) out.own(",\"buffers\":[]");
  out.own(",\"msg_id\":");
  out.own(json(m.msg_id).dump());
  out.own(",\"msg_type\":");
  out.own(json(m.msg_type).dump());
  out.own(",\"channel\":\"");
  out.own(channel_name(m.channel));
  out.own("\"}");
}

// header.msg_id and header.msg_type, both required non-empty strings.
std::string read_ids(const json& header, ClientMessage& out) {
  auto id = header.find("msg_id");
  auto type = header.find("msg_type");
  if (id == header.end() || !id->is_string() || id->get_ref<const std::string&>().empty())
    return "header.msg_id must be a non-empty string";
  if (type == header.end() || !type->is_string() || type->get_ref<const std::string&>().empty())
    return "header.msg_type must be a non-empty string";
  out.msg_id = id->get<std::string>();
  out.msg_type = type->get<std::string>();
  if (auto session = header.find("session"); session != header.end() && session->is_string())
    out.session = session->get<std::string>();
  return {};
}

// Fills out's parts from a parsed legacy message object.
std::string from_object(json& msg, ClientMessage& out) {
  if (!msg.is_object()) return "a message must be a JSON object";
  std::string channel = "shell";
  if (auto it = msg.find("channel"); it != msg.end() && !it->is_null()) {
    if (!it->is_string()) return "\"channel\" must be a string";
    channel = it->get<std::string>();
  }
  auto ch = parse_channel(channel);
  if (!ch || *ch == Channel::iopub) return "unknown channel \"" + channel + "\"";
  out.channel = *ch;
  auto header = msg.find("header");
  if (header == msg.end() || !header->is_object()) return "\"header\" must be an object";
  if (auto e = read_ids(*header, out); !e.empty()) return e;
  auto part = [&](const char* key, std::string& dst) -> std::string {
    auto it = msg.find(key);
    if (it == msg.end() || it->is_null()) {
      dst = "{}";
      return {};
    }
    if (!it->is_object()) return std::string("\"") + key + "\" must be an object";
    dst = it->dump();
    return {};
  };
  out.wire.header = header->dump();
  if (auto e = part("parent_header", out.wire.parent_header); !e.empty()) return e;
  if (auto e = part("metadata", out.wire.metadata); !e.empty()) return e;
  if (auto e = part("content", out.wire.content); !e.empty()) return e;
  return {};
}

std::string decode_legacy_binary(std::string_view data, ClientMessage& out) {
  auto p = reinterpret_cast<const unsigned char*>(data.data());
  if (data.size() < 8) return "legacy binary frame too short";
  std::uint32_t n = get_u32be(p);
  if (n == 0 || n > 1024 || data.size() < 4 + 4 * std::size_t(n))
    return "legacy binary frame: bad part count";
  std::vector<std::size_t> offs(n + 1);
  for (std::uint32_t i = 0; i < n; ++i) offs[i] = get_u32be(p + 4 + 4 * i);
  offs[n] = data.size();
  for (std::uint32_t i = 0; i < n; ++i)
    if (offs[i] < 4 + 4 * std::size_t(n) || offs[i] > offs[i + 1])
      return "legacy binary frame: offsets out of order or out of range";
  auto part = data.substr(offs[0], offs[1] - offs[0]);
  if (!json_depth_within(part)) return "the message nests deeper than " + std::to_string(kMaxJsonDepth) + " levels";
  json msg = json::parse(part, nullptr, false);
  if (msg.is_discarded()) return "legacy binary frame: the message part is not JSON";
  if (auto e = from_object(msg, out); !e.empty()) return e;
  for (std::uint32_t i = 1; i < n; ++i)
    out.wire.buffers.emplace_back(data.substr(offs[i], offs[i + 1] - offs[i]));
  return {};
}

std::string decode_v1(std::string_view data, ClientMessage& out) {
  std::vector<std::string_view> parts;
  if (auto e = split_v1(data, parts); !e.empty()) return e;
  const std::size_t n = parts.size() + 1;  // offsets
  auto seg = [&](std::size_t i) { return parts[i]; };
  std::string channel(seg(0));
  auto ch = parse_channel(channel);
  if (!ch || *ch == Channel::iopub) return "unknown channel \"" + channel + "\"";
  out.channel = *ch;
  for (std::uint64_t i = 1; i <= 4; ++i) {
    if (!json_depth_within(seg(i))) return "the message nests deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    // A raw NUL is never JSON (in a string it is written \u0000), but nlohmann's parser takes it
    // for the end of the input: "{}\0garbage" would pass as {} and be relayed whole.
    if (seg(i).find('\0') != std::string_view::npos)
      return std::string("v1 frame: ") + (i == 1 ? "header" : i == 2 ? "parent_header" : i == 3 ? "metadata" : "content") +
             " is not valid JSON (it holds a NUL byte)";
  }
  json header = json::parse(seg(1), nullptr, false);
  if (!header.is_object()) return "v1 frame: header is not a JSON object";
  if (auto e = read_ids(header, out); !e.empty()) return e;
  out.wire.header = std::string(seg(1));
  const char* names[] = {"parent_header", "metadata", "content"};
  std::string* dst[] = {&out.wire.parent_header, &out.wire.metadata, &out.wire.content};
  for (int i = 0; i < 3; ++i) {
    auto s = seg(2 + i);
    if (s.empty()) {
      *dst[i] = "{}";
      continue;
    }
    json part = json::parse(s, nullptr, false);
    if (part.is_null()) {  // JSON null means "none", like a missing part
      *dst[i] = "{}";
      continue;
    }
    if (!part.is_object()) return std::string("v1 frame: ") + names[i] + " must be a JSON object";
    *dst[i] = std::string(s);
  }
  for (std::uint64_t i = 5; i + 1 < n; ++i) out.wire.buffers.emplace_back(seg(i));
  return {};
}

}  // namespace

std::string split_v1(std::string_view data, std::vector<std::string_view>& parts) {
  auto p = reinterpret_cast<const unsigned char*>(data.data());
  if (data.size() < 8) return "v1 frame too short";
  std::uint64_t n = get_u64le(p);
  if (n < 6 || n > 1024 || data.size() < 8 * (n + 1)) return "v1 frame: bad offset count";
  std::vector<std::uint64_t> offs(n);
  for (std::uint64_t i = 0; i < n; ++i) offs[i] = get_u64le(p + 8 * (i + 1));
  for (std::uint64_t i = 0; i + 1 < n; ++i)
    if (offs[i] < 8 * (n + 1) || offs[i] > offs[i + 1]) return "v1 frame: offsets out of order";
  if (offs[n - 1] > data.size()) return "v1 frame: offsets past the end";
  parts.clear();
  for (std::uint64_t i = 0; i + 1 < n; ++i) parts.push_back(data.substr(offs[i], offs[i + 1] - offs[i]));
  return {};
}

void WsGather::own(std::string_view s) {
  if (s.empty()) return;
  if (!pieces_.empty() && !pieces_.back().ext && pieces_.back().pos + pieces_.back().len == own_.size()) {
    pieces_.back().len += s.size();  // continues the last piece
  } else {
    pieces_.push_back(Piece{nullptr, own_.size(), s.size()});
  }
  own_.append(s);
  size_ += s.size();
}

void WsGather::view(std::string_view s) {
  if (s.size() < kCopyBelow) return own(s);
  pieces_.push_back(Piece{s.data(), 0, s.size()});
  size_ += s.size();
}

WsFrame WsGather::flatten() const {
  WsFrame f;
  f.binary = binary_;
  f.data.reserve(size_);
  for (std::size_t i = 0; i < pieces_.size(); ++i) f.data += piece(i);
  return f;
}

WsGather gather_legacy(const KernelMessage& m) {
  if (m.wire.buffers.empty()) {
    WsGather out(false);
    legacy_json(m, true, out);
    return out;
  }
  // The JSON's length goes in the offset table before it, so it is built first, on its own.
  WsGather js(true);
  legacy_json(m, false, js);
  std::uint32_t n = std::uint32_t(1 + m.wire.buffers.size());
  std::string table;
  table.reserve(4 + 4 * std::size_t(n));
  put_u32be(table, n);
  std::size_t off = 4 + 4 * std::size_t(n);
  put_u32be(table, std::uint32_t(off));
  off += js.size();
  for (std::size_t i = 0; i + 1 < m.wire.buffers.size(); ++i) {
    put_u32be(table, std::uint32_t(off));
    off += m.wire.buffers[i].size();
  }
  put_u32be(table, std::uint32_t(off));
  WsGather out(true);
  out.own(table);
  for (std::size_t i = 0; i < js.count(); ++i) {
    // js's own bytes are copied (js goes away); its views still point into m.
    if (js.owned(i)) out.own(js.piece(i));
    else out.view(js.piece(i));
  }
  for (auto& b : m.wire.buffers) out.view(b);
  return out;
}

WsGather gather_v1(const KernelMessage& m) {
  const WireMessage& w = m.wire;
  std::string_view ch = channel_name(m.channel);
  std::vector<std::string_view> segs = {ch, w.header, w.parent_header, w.metadata, w.content};
  for (auto& b : w.buffers) segs.emplace_back(b);
  std::uint64_t n = segs.size() + 1;
  std::string table;
  table.reserve(8 * (n + 1));
  put_u64le(table, n);
  std::uint64_t off = 8 * (n + 1);
  for (auto s : segs) {
    put_u64le(table, off);
    off += s.size();
  }
  put_u64le(table, off);
  WsGather out(true);
  out.own(table);
  for (auto s : segs) out.view(s);
  return out;
}

WsFrame encode_legacy(const KernelMessage& m) { return gather_legacy(m).flatten(); }

WsFrame encode_v1(const KernelMessage& m) { return gather_v1(m).flatten(); }

std::string decode_client(std::string_view data, WsProtocol proto, ClientMessage& out) {
  if (proto == WsProtocol::v1) return decode_v1(data, out);
  std::size_t i = 0;
  while (i < data.size() && (data[i] == ' ' || data[i] == '\n' || data[i] == '\r' || data[i] == '\t')) ++i;
  if (i < data.size() && data[i] == '{') {
    if (!json_depth_within(data)) return "the message nests deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    json msg = json::parse(data, nullptr, false);
    if (msg.is_discarded()) return "the frame is not valid JSON";
    return from_object(msg, out);
  }
  return decode_legacy_binary(data, out);
}

}  // namespace kgate
