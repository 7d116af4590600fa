// Unit tests for kgate proxy-kernel's pure helpers: which kernel it attaches to, and reading the
// server's v1 websocket frames (checked against ws_codec's encoder and by hand-built frames).
#include "kgate/client/proxy_wire.hpp"
#include "kgate/client/listing.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kgate/jupyter/ws_codec.hpp"

namespace kgate::client::proxy {
namespace {

json kernel(const std::string& id, double age, double idle, json claim = nullptr, const char* state = "idle") {
  return {{"id", id}, {"age_seconds", age}, {"idle_seconds", idle}, {"claim", claim}, {"execution_state", state}};
}

TEST(ChooseKernel, TheLiveClaimWinsOverANewerKernel) {
  json list = {kernel("old", 100, 5, {{"agent", "a"}, {"label", "l"}, {"alive", true}}), kernel("new", 1, 1)};
  EXPECT_EQ(choose_kernel(list), "old");
}

TEST(ChooseKernel, ADeadClaimDoesNotCountAndTheNewestIsTaken) {
  json list = {kernel("a", 100, 5, {{"agent", "a"}, {"label", "l"}, {"alive", false}}), kernel("b", 3, 1),
               kernel("c", 50, 1)};
  EXPECT_EQ(choose_kernel(list), "b");
}

TEST(ChooseKernel, OfSeveralLiveClaimsTheMostRecentlyActive) {
  json alive = {{"agent", "a"}, {"label", "l"}, {"alive", true}};
  json list = {kernel("a", 10, 30, alive), kernel("b", 20, 2, alive), kernel("c", 1, 0)};
  EXPECT_EQ(choose_kernel(list), "b");
}

TEST(ChooseKernel, DeadKernelsAreSkipped) {
  json list = {kernel("dead", 1, 0, {{"agent", "a"}, {"label", "l"}, {"alive", true}}, "dead"), kernel("ok", 9, 9)};
  EXPECT_EQ(choose_kernel(list), "ok");
  EXPECT_EQ(choose_kernel(json::array({kernel("dead", 1, 0, nullptr, "dead")})), "");
  EXPECT_EQ(choose_kernel(json::array()), "");
  EXPECT_EQ(choose_kernel(json::object()), "");
}

TEST(ChooseKernel, APlainJupyterListingUsesLastActivity) {
  json list = {{{"id", "a"}, {"last_activity", "2026-01-01T10:00:00.000000Z"}, {"execution_state", "idle"}},
               {{"id", "b"}, {"last_activity", "2026-01-01T11:00:00.000000Z"}, {"execution_state", "idle"}}};
  EXPECT_EQ(choose_kernel(list), "b");
}

TEST(MatchKernel, ExactIdOrAUniquePrefix) {
  json list = {{{"id", "abc-1"}}, {{"id", "abd-2"}}, {{"id", "abc"}}};
  std::string err;
  EXPECT_EQ(match_kernel(list, "abc", err), "abc");  // exact wins over the prefix of abc-1
  EXPECT_EQ(match_kernel(list, "abd", err), "abd-2");
  EXPECT_EQ(match_kernel(list, "ab", err), "");
  EXPECT_NE(err.find("ambiguous"), std::string::npos) << err;
  EXPECT_EQ(match_kernel(list, "zz", err), "");
  EXPECT_NE(err.find("kgate kernel zz is gone"), std::string::npos) << err;
}

TEST(KernelsMatching, WhatEveryCallerOfAPrefixGets) {
  json list = json::parse(R"([{"id":"abc"},{"id":"abc-1"},{"id":"abd-2"},{"x":1},{"id":7}])");
  EXPECT_EQ(kgate::client::kernels_matching(list, "abc"), std::vector<std::string>{"abc"});
  EXPECT_EQ(kgate::client::kernels_matching(list, "ab"), (std::vector<std::string>{"abc", "abc-1", "abd-2"}));
  EXPECT_TRUE(kgate::client::kernels_matching(list, "zz").empty());
  EXPECT_TRUE(kgate::client::kernels_matching(json::object(), "a").empty());
}

TEST(DecodeV1, ReadsWhatTheServerEncodes) {
  KernelMessage m;
  m.channel = Channel::iopub;
  m.wire.header = R"({"msg_id":"1","msg_type":"stream"})";
  m.wire.parent_header = R"({"msg_id":"0"})";
  m.wire.metadata = "{}";
  m.wire.content = R"({"name":"stdout","text":"hi"})";
  m.wire.buffers = {std::string("\0\1", 2), "buf2"};
  WsFrame f = encode_v1(m);
  Channel ch = Channel::shell;
  WireMessage w;
  ASSERT_EQ(decode_v1_frame(f.data, ch, w), "");
  EXPECT_EQ(ch, Channel::iopub);
  EXPECT_EQ(w.header, m.wire.header);
  EXPECT_EQ(w.parent_header, m.wire.parent_header);
  EXPECT_EQ(w.content, m.wire.content);
  EXPECT_EQ(w.buffers, m.wire.buffers);
  for (auto c : {Channel::shell, Channel::control, Channel::stdin_}) {
    m.channel = c;
    WireMessage w2;
    ASSERT_EQ(decode_v1_frame(encode_v1(m).data, ch, w2), "");
    EXPECT_EQ(ch, c);
  }
}

void put_u64le(std::string& s, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
}

TEST(DecodeV1, NullAndEmptyPartsAreEmptyObjects) {
  std::string segs[] = {"shell", R"({"msg_id":"1","msg_type":"x"})", "null", "", "{}"};
  std::string out;
  put_u64le(out, 6);
  std::uint64_t off = 8 * 7;
  for (auto& s : segs) {
    put_u64le(out, off);
    off += s.size();
  }
  put_u64le(out, off);
  for (auto& s : segs) out += s;
  Channel ch;
  WireMessage w;
  ASSERT_EQ(decode_v1_frame(out, ch, w), "");
  EXPECT_EQ(w.parent_header, "{}");
  EXPECT_EQ(w.metadata, "{}");
}

TEST(DecodeV1, BadFramesAreNamed) {
  Channel ch;
  WireMessage w;
  EXPECT_NE(decode_v1_frame("short", ch, w), "");
  std::string f;
  put_u64le(f, 3);  // fewer offsets than channel + 4 parts
  EXPECT_NE(decode_v1_frame(f + std::string(64, '\0'), ch, w).find("offset count"), std::string::npos);
  KernelMessage m;
  m.channel = Channel::shell;
  m.wire.header = "[1]";  // not an object
  EXPECT_NE(decode_v1_frame(encode_v1(m).data, ch, w).find("header"), std::string::npos);
  m.wire.header = R"({"msg_id":"1"})";
  std::string good = encode_v1(m).data;
  EXPECT_NE(decode_v1_frame(good.substr(0, good.size() - 3), ch, w).find("past the end"), std::string::npos);
  std::string bad_channel = good;
  bad_channel.replace(8 * 7, 5, "bogus");  // the channel follows the count and 6 offsets
  EXPECT_NE(decode_v1_frame(bad_channel, ch, w).find("unknown channel"), std::string::npos);
}

}  // namespace
}  // namespace kgate::client::proxy
