// kgate proxy-kernel's pure pieces (see proxy_wire.hpp).
#include "kgate/client/proxy_wire.hpp"
#include "kgate/client/listing.hpp"

#include "kgate/jupyter/ws_codec.hpp"

#include <cstdint>
#include <vector>

namespace kgate::client::proxy {

namespace {

bool is_dead(const json& k) { return k.is_object() && k.value("execution_state", "") == "dead"; }

double number_or(const json& k, const char* key, double fallback) {
  auto it = k.find(key);
  return it != k.end() && it->is_number() ? it->get<double>() : fallback;
}

}  // namespace

std::string choose_kernel(const json& kernels) {
  if (!kernels.is_array()) return {};
  const json* claimed = nullptr;
  const json* newest = nullptr;
  for (const auto& k : kernels) {
    if (!k.is_object() || !k.contains("id") || !k["id"].is_string() || is_dead(k)) continue;
    auto claim = k.find("claim");
    if (claim != k.end() && claim->is_object() && claim->value("alive", false)) {
      if (!claimed || number_or(k, "idle_seconds", 1e18) < number_or(*claimed, "idle_seconds", 1e18)) claimed = &k;
    }
    if (!newest) {
      newest = &k;
    } else if (k.contains("age_seconds") || newest->contains("age_seconds")) {
      if (number_or(k, "age_seconds", 1e18) < number_or(*newest, "age_seconds", 1e18)) newest = &k;
    } else if (k.value("last_activity", "") > newest->value("last_activity", "")) {  // ISO times sort as text
      newest = &k;
    }
  }
  if (claimed) return (*claimed)["id"].get<std::string>();
  return newest ? (*newest)["id"].get<std::string>() : std::string();
}

std::string match_kernel(const json& kernels, const std::string& want, std::string& error) {
  const auto hits = kernels_matching(kernels, want);
  if (hits.size() == 1) return hits.front();
  error = hits.empty() ? "kgate kernel " + want + " is gone (no kernel has that id)"
                       : "kernel id prefix " + want + " is ambiguous (" + std::to_string(hits.size()) +
                             " kernels start with it): give more of the id";
  return {};
}

std::string decode_v1_frame(std::string_view data, Channel& channel, WireMessage& out) {
  std::vector<std::string_view> parts;
  if (auto e = split_v1(data, parts); !e.empty()) return e;
  const std::size_t n = parts.size() + 1;  // offsets
  auto seg = [&](std::size_t i) { return parts[i]; };
  auto ch = parse_channel(seg(0));
  if (!ch) return "v1 frame: unknown channel \"" + std::string(seg(0)) + "\"";
  channel = *ch;
  if (!json_depth_within(seg(1))) return "v1 frame: the header nests too deep";
  json header = json::parse(seg(1), nullptr, false);
  if (!header.is_object()) return "v1 frame: the header is not a JSON object";
  out.header = std::string(seg(1));
  std::string* dst[] = {&out.parent_header, &out.metadata, &out.content};
  for (int i = 0; i < 3; ++i) {
    auto s = seg(2 + i);
    *dst[i] = s.empty() || s == "null" ? std::string("{}") : std::string(s);
  }
  for (std::uint64_t i = 5; i + 1 < n; ++i) out.buffers.emplace_back(seg(i));
  return {};
}

}  // namespace kgate::client::proxy
