// The Jupyter wire protocol: framing, HMAC signing and header helpers (pure, no sockets).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

struct evp_mac_ctx_st;  // OpenSSL's EVP_MAC_CTX

namespace kgate {

using json = nlohmann::json;

// The frame that separates routing identities from the signed message.
inline constexpr std::string_view kDelimiter = "<IDS|MSG>";

// Errors the codec reports.  Decoding never throws: a malformed or unsigned message from a
// peer is an ordinary runtime event, dropped and logged by the caller.
enum class wire_errc {
  missing_delimiter = 1,  // no "<IDS|MSG>" frame
  too_few_frames,         // fewer than signature + 4 JSON frames after the delimiter
  missing_signature,      // signing is on and the signature frame is empty
  bad_signature,          // wrong length or wrong value (compared in constant time)
  frame_too_large,        // a frame, or the whole message, is over the decoder's limit
  bad_json,               // a JSON frame does not parse, or the header is not an object
};
const std::error_category& wire_category() noexcept;
std::error_code make_error_code(wire_errc e) noexcept;

// One message as it travels on the wire.  The four JSON parts are kept as the raw text that
// was (or will be) signed, so a message can be relayed without re-serialising its content.
struct WireMessage {
  std::vector<std::string> identities;  // routing ids before the delimiter (iopub: the topic)
  std::string header;                   // JSON object text
  std::string parent_header;            // JSON object text ("{}" when none)
  std::string metadata;                 // JSON object text ("{}" when none)
  std::string content;                  // JSON object text
  std::vector<std::string> buffers;     // raw binary buffers (not signed)
};

// HMAC signer for one connection key.  An empty key makes an unsigned session: sign() returns
// "" and verify() accepts anything.  Thread-safe: sign/verify may be called from any thread.
class Signer {
 public:
  // scheme is the connection file's signature_scheme, "hmac-<digest>" (hmac-sha256, ...).
  // Throws std::invalid_argument for an unknown scheme.
  explicit Signer(std::string key = {}, std::string_view scheme = "hmac-sha256");
  ~Signer();
  Signer(const Signer&) = delete;
  Signer& operator=(const Signer&) = delete;

  bool enabled() const noexcept { return !key_.empty(); }
  // Lowercase hex HMAC over header ‖ parent ‖ metadata ‖ content.
  std::string sign(std::string_view header, std::string_view parent, std::string_view metadata,
                   std::string_view content) const;
  // Length check first, then a constant-time compare.
  bool verify(std::string_view signature, std::string_view header, std::string_view parent,
              std::string_view metadata, std::string_view content) const;

 private:
  std::string key_;
  std::string digest_;  // OpenSSL digest name, e.g. "SHA256"
  std::size_t hex_len_ = 0;
  // An HMAC context with the key and digest set, which sign() copies: the key's pads and the
  // digest's lookup are done once, not per message (null when signing is off).  Only read
  // after construction, so several threads may sign with one Signer.
  ::evp_mac_ctx_st* keyed_ = nullptr;
};

// Spare capacity decode() leaves after a message's content, so a JSON parser that reads past
// the end in blocks (simdjson: SIMDJSON_PADDING) can parse it in place.
inline constexpr std::size_t kJsonPadding = 64;

struct DecodeLimits {
  std::size_t max_message_bytes = std::size_t{1} << 30;  // 1 GiB over all frames
};

// Decodes frames [ids..., delimiter, signature, header, parent, metadata, content, buffers...].
// Checks the signature against `signer` and that header is a JSON object (simdjson's check: all
// of it valid, UTF-8 included, and nested at most 1024 deep) (the other parts
// are checked to be JSON only when `validate_json` is set: relaying does not need it).
std::error_code decode(const std::vector<std::string_view>& frames, const Signer& signer,
                       WireMessage& out, const DecodeLimits& limits = {},
                       bool validate_json = false);

// What routing needs of a message: header.msg_id, header.msg_type and parent_header.msg_id ("" for
// any that is missing or not a string). False when the header is not a JSON object. Read with
// simdjson: every message a kernel sends passes here.
struct MessageIds {
  std::string msg_id, msg_type, parent_msg_id;
};
bool read_message_ids(std::string_view header, std::string_view parent, MessageIds& out);

// Encodes a message into frames, signing it with `signer`.
std::vector<std::string> encode(const WireMessage& msg, const Signer& signer);

// A fresh message header: msg_id (uuid4 hex), session, username, date (ISO-8601 Z with
// microseconds), msg_type, version "5.3".
json make_header(std::string_view msg_type, std::string_view session,
                 std::string_view username = "kgate");

// The deepest nesting of arrays and objects kgate parses from a peer.  nlohmann's parser is
// iterative but dump() and the destructor recurse, so deeper input could exhaust the stack.
inline constexpr int kMaxJsonDepth = 512;
// True when `text` nests arrays/objects at most `max_depth` deep (a linear scan that skips
// strings; it does not validate the JSON).
bool json_depth_within(std::string_view text, int max_depth = kMaxJsonDepth) noexcept;

// The current UTC time as "%Y-%m-%dT%H:%M:%S.%fZ" (always six fractional digits).
std::string iso_now();
// `t` in the same format.
std::string iso_time(std::chrono::system_clock::time_point t);

}  // namespace kgate

template <>
struct std::is_error_code_enum<kgate::wire_errc> : std::true_type {};
