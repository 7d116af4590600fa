// Unit tests for the wire codec: jupyter_client reference vectors, HMAC, errors and fuzzing.
#include "kgate/jupyter/wire.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support.hpp"

namespace kgate {
namespace {

// ---- helpers ---------------------------------------------------------------------------

using kgate::test::matches_pattern;

std::string base64_decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  unsigned acc = 0;
  int bits = 0;
  for (const char c : in) {
    if (c == '=') break;
    const int v = value(c);
    if (v < 0) throw std::runtime_error("bad base64");
    acc = (acc << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

std::vector<std::string_view> views(const std::vector<std::string>& frames) {
  return {frames.begin(), frames.end()};
}

// One reference message from tests/data/wire_vectors.json.
struct Vector {
  std::string name, key, scheme, signature;
  std::size_t n_identities = 0, n_buffers = 0;
  std::vector<std::string> frames;
};

const std::vector<Vector>& vectors() {
  static const std::vector<Vector> all = [] {
    std::ifstream in(kgate::test::data_dir() / "wire_vectors.json");
    if (!in) throw std::runtime_error("cannot open wire_vectors.json");
    const json doc = json::parse(in);
    std::vector<Vector> out;
    for (const auto& c : doc.at("cases")) {
      Vector v;
      v.name = c.at("name").get<std::string>();
      v.key = c.at("key").get<std::string>();
      v.scheme = c.at("scheme").get<std::string>();
      v.signature = c.at("signature").get<std::string>();
      v.n_identities = c.at("n_identities").get<std::size_t>();
      v.n_buffers = c.at("n_buffers").get<std::size_t>();
      for (const auto& f : c.at("frames_b64")) {
        v.frames.push_back(base64_decode(f.get<std::string>()));
      }
      out.push_back(std::move(v));
    }
    return out;
  }();
  return all;
}

WireMessage sample_message() {
  WireMessage m;
  m.identities = {"router-id", std::string("\0\x01\xff", 3)};
  m.header = make_header("execute_request", "sess-1").dump();
  m.parent_header = "{}";
  m.metadata = R"({"k": "v"})";
  m.content = R"({"code": "1+1", "text": "h\u00e9llo \u4e16\u754c"})";
  m.buffers = {std::string("\x00\x01\x02", 3), ""};
  return m;
}

// ---- jupyter_client reference vectors --------------------------------------------------

TEST(WireVectors, FileHasCoverage) {
  const auto& all = vectors();
  ASSERT_GE(all.size(), 40u);
  std::set<std::string> schemes;
  bool unsigned_case = false, buffers = false, unicode_key = false;
  for (const auto& v : all) {
    schemes.insert(v.scheme);
    unsigned_case |= v.key.empty();
    buffers |= v.n_buffers > 0;
    unicode_key |= v.key.find("\xd0\xba") != std::string::npos;  // Cyrillic 'к'
  }
  EXPECT_TRUE(schemes.count("hmac-sha256") && schemes.count("hmac-sha512") &&
              schemes.count("hmac-md5"));
  EXPECT_TRUE(unsigned_case);
  EXPECT_TRUE(buffers);
  EXPECT_TRUE(unicode_key);
}

TEST(WireVectors, SignMatchesSession) {
  for (const auto& v : vectors()) {
    SCOPED_TRACE(v.name);
    const Signer signer(v.key, v.scheme);
    const std::size_t d = v.n_identities;
    EXPECT_EQ(signer.enabled(), !v.key.empty());
    EXPECT_EQ(signer.sign(v.frames[d + 2], v.frames[d + 3], v.frames[d + 4], v.frames[d + 5]),
              v.signature);
    EXPECT_TRUE(signer.verify(v.signature, v.frames[d + 2], v.frames[d + 3], v.frames[d + 4],
                              v.frames[d + 5]));
  }
}

TEST(WireVectors, DecodeAcceptsSessionFrames) {
  for (const auto& v : vectors()) {
    SCOPED_TRACE(v.name);
    const Signer signer(v.key, v.scheme);
    WireMessage m;
    ASSERT_EQ(decode(views(v.frames), signer, m, {}, /*validate_json=*/true), std::error_code{});
    const std::size_t d = v.n_identities;
    ASSERT_EQ(m.identities.size(), d);
    for (std::size_t i = 0; i < d; ++i) EXPECT_EQ(m.identities[i], v.frames[i]);
    EXPECT_EQ(m.header, v.frames[d + 2]);
    EXPECT_EQ(m.parent_header, v.frames[d + 3]);
    EXPECT_EQ(m.metadata, v.frames[d + 4]);
    EXPECT_EQ(m.content, v.frames[d + 5]);
    ASSERT_EQ(m.buffers.size(), v.n_buffers);
    for (std::size_t i = 0; i < v.n_buffers; ++i) EXPECT_EQ(m.buffers[i], v.frames[d + 6 + i]);
  }
}

TEST(WireVectors, EncodeReproducesSessionFrames) {
  for (const auto& v : vectors()) {
    SCOPED_TRACE(v.name);
    const Signer signer(v.key, v.scheme);
    const std::size_t d = v.n_identities;
    WireMessage m;
    m.identities.assign(v.frames.begin(), v.frames.begin() + static_cast<std::ptrdiff_t>(d));
    m.header = v.frames[d + 2];
    m.parent_header = v.frames[d + 3];
    m.metadata = v.frames[d + 4];
    m.content = v.frames[d + 5];
    m.buffers.assign(v.frames.begin() + static_cast<std::ptrdiff_t>(d + 6), v.frames.end());
    EXPECT_EQ(encode(m, signer), v.frames);
  }
}

TEST(WireVectors, TamperedFramesAreRejected) {
  for (const auto& v : vectors()) {
    if (v.key.empty()) continue;
    SCOPED_TRACE(v.name);
    const Signer signer(v.key, v.scheme);
    const std::size_t d = v.n_identities;
    WireMessage m;
    for (std::size_t part = d + 2; part <= d + 5; ++part) {
      auto frames = v.frames;
      frames[part] += " ";
      EXPECT_EQ(decode(views(frames), signer, m), wire_errc::bad_signature);
    }
    auto frames = v.frames;
    frames[d + 1][0] = frames[d + 1][0] == '0' ? '1' : '0';
    EXPECT_EQ(decode(views(frames), signer, m), wire_errc::bad_signature);
    frames[d + 1] = v.signature.substr(0, v.signature.size() - 1);
    EXPECT_EQ(decode(views(frames), signer, m), wire_errc::bad_signature);
    frames[d + 1].clear();
    EXPECT_EQ(decode(views(frames), signer, m), wire_errc::missing_signature);
    // Buffers are not signed.
    frames = v.frames;
    frames.push_back("extra buffer");
    EXPECT_EQ(decode(views(frames), signer, m), std::error_code{});
    // A different key must not verify.
    const Signer other(v.key + "x", v.scheme);
    EXPECT_EQ(decode(views(v.frames), other, m), wire_errc::bad_signature);
  }
}

// ---- Signer ----------------------------------------------------------------------------

TEST(Signer, KnownAnswersRfc4231) {
  // RFC 2202 / RFC 4231 test case 2, with the data split over the four signed parts.
  const struct {
    const char* scheme;
    const char* mac;
  } cases[] = {
      {"hmac-md5", "750c783e6ab0b503eaa86e310a5db738"},
      {"hmac-sha1", "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"},
      {"hmac-sha224", "a30e01098bc6dbbf45690f3a7e9e6d0f8bbea2a39e6148008fd05e44"},
      {"hmac-sha256", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {"hmac-sha384",
       "af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e8e2240ca5e69e2c78b3239ec"
       "fab21649"},
      {"hmac-sha512",
       "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65"
       "f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.scheme);
    const Signer s("Jefe", c.scheme);
    EXPECT_EQ(s.sign("what do ya", " want ", "", "for nothing?"), c.mac);
    EXPECT_EQ(s.sign("", "", "", "what do ya want for nothing?"), c.mac);
    EXPECT_TRUE(s.verify(c.mac, "what do ya want", " for", " nothing", "?"));
  }
}

TEST(Signer, UnknownSchemesThrow) {
  for (const char* scheme : {"", "sha256", "hmac-", "hmac-nope", "HMAC-SHA256", "hmac-SHA256",
                             "hmac_sha256", "rsa-sha256", "hmac-sha256 "}) {
    SCOPED_TRACE(scheme);
    EXPECT_THROW(Signer("key", scheme), std::invalid_argument);
    EXPECT_THROW(Signer("", scheme), std::invalid_argument);
  }
  EXPECT_NO_THROW(Signer("key", "hmac-sha3_512"));
  EXPECT_NO_THROW(Signer("key"));
}

TEST(Signer, EmptyKeyIsUnsigned) {
  const Signer s;
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.sign("{}", "{}", "{}", "{}"), "");
  EXPECT_TRUE(s.verify("", "{}", "{}", "{}", "{}"));
  EXPECT_TRUE(s.verify("garbage", "{}", "{}", "{}", "{}"));
}

TEST(Signer, OutputIsLowercaseHexOfDigestLength) {
  const std::pair<const char*, std::size_t> lens[] = {
      {"hmac-md5", 32},    {"hmac-sha1", 40},   {"hmac-sha224", 56}, {"hmac-sha256", 64},
      {"hmac-sha384", 96}, {"hmac-sha512", 128}, {"hmac-sha3_256", 64}, {"hmac-blake2b", 128}};
  for (const auto& [scheme, len] : lens) {
    SCOPED_TRACE(scheme);
    const std::string sig = Signer("k", scheme).sign("a", "b", "c", "d");
    EXPECT_EQ(sig.size(), len);
    EXPECT_TRUE(matches_pattern(sig, std::string(len, 'x'))) << sig;
  }
}

TEST(Signer, VerifyRejectsWrongLengthAndCase) {
  const Signer s("secret");
  const std::string good = s.sign("h", "p", "m", "c");
  EXPECT_TRUE(s.verify(good, "h", "p", "m", "c"));
  EXPECT_FALSE(s.verify("", "h", "p", "m", "c"));
  EXPECT_FALSE(s.verify("a", "h", "p", "m", "c"));
  EXPECT_FALSE(s.verify(good.substr(0, 63), "h", "p", "m", "c"));
  EXPECT_FALSE(s.verify(good + "0", "h", "p", "m", "c"));
  EXPECT_FALSE(s.verify(std::string(100000, 'a'), "h", "p", "m", "c"));
  std::string upper = good;
  for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  ASSERT_NE(upper, good);  // this particular MAC has hex letters in it
  EXPECT_FALSE(s.verify(upper, "h", "p", "m", "c"));
  // Moving bytes between parts changes nothing (HMAC is over the concatenation, as in Python).
  EXPECT_TRUE(s.verify(good, "hp", "", "m", "c"));
  EXPECT_FALSE(s.verify(good, "h", "p", "m", "C"));
}

TEST(Signer, ConcurrentUseIsSafe) {
  const Signer s("shared-key", "hmac-sha512");
  const std::string expected = s.sign("header", "parent", "metadata", "content");
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (std::size_t t = 0; t < failures.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        if (s.sign("header", "parent", "metadata", "content") != expected) ++failures[t];
        if (!s.verify(expected, "header", "parent", "metadata", "content")) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const int f : failures) EXPECT_EQ(f, 0);
}

// ---- decode / encode -------------------------------------------------------------------

TEST(Wire, RoundTripSignedWithBuffers) {
  const Signer s("k3y", "hmac-sha256");
  const WireMessage m = sample_message();
  const auto frames = encode(m, s);
  ASSERT_EQ(frames.size(), 2u + 6u + 2u);
  EXPECT_EQ(frames[2], kDelimiter);
  EXPECT_EQ(frames[3], s.sign(m.header, m.parent_header, m.metadata, m.content));
  WireMessage out;
  ASSERT_EQ(decode(views(frames), s, out, {}, true), std::error_code{});
  EXPECT_EQ(out.identities, m.identities);
  EXPECT_EQ(out.header, m.header);
  EXPECT_EQ(out.parent_header, m.parent_header);
  EXPECT_EQ(out.metadata, m.metadata);
  EXPECT_EQ(out.content, m.content);
  EXPECT_EQ(out.buffers, m.buffers);
}

TEST(Wire, UnsignedEncodeHasEmptySignatureAndIgnoresIncoming) {
  const Signer s;
  WireMessage m = sample_message();
  m.identities.clear();
  m.buffers.clear();
  auto frames = encode(m, s);
  ASSERT_EQ(frames.size(), 6u);
  EXPECT_EQ(frames[0], kDelimiter);
  EXPECT_EQ(frames[1], "");
  frames[1] = "not-checked";
  WireMessage out;
  EXPECT_EQ(decode(views(frames), s, out), std::error_code{});
  EXPECT_TRUE(out.identities.empty());
  EXPECT_TRUE(out.buffers.empty());
}

TEST(Wire, MissingDelimiter) {
  const Signer s;
  WireMessage out;
  EXPECT_EQ(decode({}, s, out), wire_errc::missing_delimiter);
  EXPECT_EQ(decode({"a", "", "{}", "{}", "{}", "{}"}, s, out), wire_errc::missing_delimiter);
  EXPECT_EQ(decode({"<IDS|MSG> ", "", "{}", "{}", "{}", "{}"}, s, out),
            wire_errc::missing_delimiter);
  EXPECT_EQ(decode({"<ids|msg>", "", "{}", "{}", "{}", "{}"}, s, out),
            wire_errc::missing_delimiter);
}

TEST(Wire, TooFewFrames) {
  const Signer s;
  WireMessage out;
  std::vector<std::string_view> f = {"id", kDelimiter};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(decode(f, s, out), wire_errc::too_few_frames) << f.size();
    f.push_back("{}");
  }
  EXPECT_EQ(decode(f, s, out), std::error_code{});
}

TEST(Wire, FirstDelimiterWins) {
  const Signer s("key");
  WireMessage m;
  m.identities = {"a"};
  m.header = R"({"msg_type": "x"})";
  m.parent_header = m.metadata = m.content = "{}";
  m.buffers = {std::string(kDelimiter), std::string(kDelimiter)};
  const auto frames = encode(m, s);
  WireMessage out;
  ASSERT_EQ(decode(views(frames), s, out), std::error_code{});
  EXPECT_EQ(out.identities, m.identities);
  EXPECT_EQ(out.buffers, m.buffers);
}

TEST(Wire, SizeLimitCoversAllFrames) {
  const Signer s("key");
  const WireMessage m = sample_message();
  const auto frames = encode(m, s);
  std::size_t total = 0;
  for (const auto& f : frames) total += f.size();
  WireMessage out;
  EXPECT_EQ(decode(views(frames), s, out, DecodeLimits{total}), std::error_code{});
  EXPECT_EQ(decode(views(frames), s, out, DecodeLimits{total - 1}), wire_errc::frame_too_large);
  EXPECT_EQ(decode(views(frames), s, out, DecodeLimits{0}), wire_errc::frame_too_large);

  // One huge buffer: accepted under the default limit, rejected under a smaller one.
  WireMessage big = m;
  big.buffers = {std::string(std::size_t{64} << 20, 'x')};
  const auto big_frames = encode(big, s);
  EXPECT_EQ(decode(views(big_frames), s, out), std::error_code{});
  EXPECT_EQ(out.buffers.at(0).size(), std::size_t{64} << 20);
  EXPECT_EQ(decode(views(big_frames), s, out, DecodeLimits{std::size_t{1} << 20}),
            wire_errc::frame_too_large);
}

TEST(Wire, HeaderMustBeJsonObject) {
  const Signer s("key");
  for (const char* header : {"", " ", "[]", "1", "\"str\"", "null", "{", "{}}", "{} {}",
                             "{\"a\":}", "{'a': 1}", "{\"a\": NaN}", "\xff\xfe"}) {
    SCOPED_TRACE(header);
    WireMessage m;
    m.header = header;
    m.parent_header = m.metadata = m.content = "{}";
    WireMessage out;
    EXPECT_EQ(decode(views(encode(m, s)), s, out), wire_errc::bad_json);
  }
  WireMessage m;
  m.header = " {\"nested\": [1, {\"x\": null}], \"s\": \"\\u00e9\"} \n";
  m.parent_header = m.metadata = m.content = "{}";
  WireMessage out;
  EXPECT_EQ(decode(views(encode(m, s)), s, out, {}, true), std::error_code{});
}

TEST(Wire, ValidateJsonChecksOtherParts) {
  const Signer s("key");
  for (int part = 0; part < 3; ++part) {
    WireMessage m;
    m.header = m.parent_header = m.metadata = m.content = "{}";
    std::string& bad = part == 0 ? m.parent_header : part == 1 ? m.metadata : m.content;
    for (const char* text : {"", "[]", "{", "42"}) {
      bad = text;
      const auto frames = encode(m, s);
      WireMessage out;
      EXPECT_EQ(decode(views(frames), s, out, {}, false), std::error_code{}) << part << text;
      EXPECT_EQ(decode(views(frames), s, out, {}, true), wire_errc::bad_json) << part << text;
    }
  }
}

TEST(Wire, SignatureIsCheckedBeforeJson) {
  const Signer s("key");
  WireMessage out;
  EXPECT_EQ(decode({kDelimiter, "0000", "not json", "{}", "{}", "{}"}, s, out),
            wire_errc::bad_signature);
  EXPECT_EQ(decode({kDelimiter, "", "not json", "{}", "{}", "{}"}, s, out),
            wire_errc::missing_signature);
}

TEST(Wire, FailedDecodeLeavesOutputUntouched) {
  const Signer s("key");
  WireMessage out;
  out.header = "sentinel";
  out.buffers = {"b"};
  EXPECT_EQ(decode({kDelimiter, "bad", "{}", "{}", "{}", "{}"}, s, out), wire_errc::bad_signature);
  EXPECT_EQ(out.header, "sentinel");
  EXPECT_EQ(out.buffers.size(), 1u);
}

TEST(Wire, DeeplyNestedJsonDoesNotCrash) {
  const Signer s;
  WireMessage out;
  const std::string arrays(1'000'000, '[');
  std::string objects;
  for (int i = 0; i < 200'000; ++i) objects += "{\"a\":";
  objects += "1";
  const std::string closed = objects + std::string(200'000, '}');
  EXPECT_EQ(decode({kDelimiter, "", arrays, "{}", "{}", "{}"}, s, out), wire_errc::bad_json);
  EXPECT_EQ(decode({kDelimiter, "", objects, "{}", "{}", "{}"}, s, out), wire_errc::bad_json);
  // Well-formed but deeper than simdjson's 1024 levels: refused as bad JSON, not a crash.
  EXPECT_EQ(decode({kDelimiter, "", closed, closed, closed, closed}, s, out, {}, true),
            wire_errc::bad_json);
  std::string deep;
  for (int i = 0; i < 1000; ++i) deep += "{\"a\":";
  deep += "1" + std::string(1000, '}');
  EXPECT_EQ(decode({kDelimiter, "", deep, deep, deep, deep}, s, out, {}, true), std::error_code{});
}

TEST(Wire, RandomGarbageNeverThrows) {
  std::mt19937_64 rng(12345);
  const std::vector<std::string> pieces = {
      std::string(kDelimiter), "", "{}", "[]", "{\"a\": 1}", "{", "\xff\xfe\xfd", "null",
      std::string(64, 'a'), std::string(128, 'f'), std::string("\0\0\0", 3)};
  const Signer keyed("fuzz-key", "hmac-sha256");
  const Signer unkeyed;
  auto random_frame = [&]() {
    if (rng() % 3 == 0) return pieces[rng() % pieces.size()];
    std::string f(rng() % 300, '\0');
    for (auto& c : f) c = static_cast<char>(rng());
    return f;
  };
  int accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<std::string> frames(rng() % 14);
    for (auto& f : frames) f = random_frame();
    if (iter % 4 == 0) {
      // A validly signed message with a random mutation, for deeper coverage.
      WireMessage m = sample_message();
      frames = encode(m, keyed);
      auto& victim = frames[rng() % frames.size()];
      if (rng() % 2 && !victim.empty()) {
        victim[rng() % victim.size()] = static_cast<char>(rng());
      }
    }
    const DecodeLimits limits{rng() % 2 ? std::size_t{1} << 30 : rng() % 2000};
    const bool validate = rng() % 2;
    for (const Signer* s : {&keyed, &unkeyed}) {
      WireMessage out;
      std::error_code ec;
      ASSERT_NO_THROW(ec = decode(views(frames), *s, out, limits, validate));
      if (!ec) {
        ++accepted;
        EXPECT_EQ(out.identities.size() + 6 + out.buffers.size(), frames.size());
      } else {
        EXPECT_EQ(&ec.category(), &wire_category());
      }
    }
  }
  EXPECT_GT(accepted, 0);
}

// ---- error category, headers, time -----------------------------------------------------

TEST(Wire, ErrorCategory) {
  EXPECT_STREQ(wire_category().name(), "kgate.wire");
  std::set<std::string> messages;
  for (const auto e : {wire_errc::missing_delimiter, wire_errc::too_few_frames,
                       wire_errc::missing_signature, wire_errc::bad_signature,
                       wire_errc::frame_too_large, wire_errc::bad_json}) {
    const std::error_code ec = e;
    EXPECT_TRUE(ec);
    EXPECT_EQ(&ec.category(), &wire_category());
    EXPECT_EQ(ec, make_error_code(e));
    EXPECT_FALSE(ec.message().empty());
    messages.insert(ec.message());
  }
  EXPECT_EQ(messages.size(), 6u);
  EXPECT_FALSE(std::error_code(99, wire_category()).message().empty());
}

TEST(Wire, MakeHeader) {
  const json h = make_header("kernel_info_request", "abc-session");
  ASSERT_TRUE(h.is_object());
  EXPECT_EQ(h.size(), 6u);
  EXPECT_TRUE(matches_pattern(h.at("msg_id").get<std::string>(), std::string(32, 'x')));
  EXPECT_EQ(h.at("session"), "abc-session");
  EXPECT_EQ(h.at("username"), "kgate");
  EXPECT_EQ(h.at("msg_type"), "kernel_info_request");
  EXPECT_EQ(h.at("version"), "5.3");
  EXPECT_TRUE(h.at("date").is_string());
  EXPECT_EQ(make_header("x", "s", "alice").at("username"), "alice");
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) ids.insert(make_header("x", "s").at("msg_id").get<std::string>());
  EXPECT_EQ(ids.size(), 1000u);
}

TEST(Wire, IsoNowFormat) {
  for (int i = 0; i < 2000; ++i) {
    const std::string t = iso_now();
    ASSERT_TRUE(matches_pattern(t, "dddd-dd-ddTdd:dd:dd.ddddddZ")) << t;
  }
  // And it is the current UTC time.
  const std::string t = iso_now();
  std::tm tm{};
  ASSERT_NE(strptime(t.c_str(), "%Y-%m-%dT%H:%M:%S", &tm), nullptr);
  const std::time_t parsed = timegm(&tm);
  const std::time_t now = std::time(nullptr);
  EXPECT_LE(std::abs(static_cast<long>(now - parsed)), 5L);
}

}  // namespace
}  // namespace kgate
