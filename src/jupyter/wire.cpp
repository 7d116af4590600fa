// The Jupyter wire protocol: framing, HMAC-signing (OpenSSL EVP_MAC) and header helpers.
#include "kgate/jupyter/wire.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <new>
#include <stdexcept>
#include <utility>

#include <sys/mman.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <simdjson.h>

#include "kgate/jupyter/connection.hpp"

namespace kgate {

namespace {

// ---- error category --------------------------------------------------------------------

class WireCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "kgate.wire"; }
  std::string message(int ev) const override {
    switch (static_cast<wire_errc>(ev)) {
      case wire_errc::missing_delimiter:
        return "no <IDS|MSG> delimiter frame";
      case wire_errc::too_few_frames:
        return "too few frames after the delimiter";
      case wire_errc::missing_signature:
        return "message is not signed";
      case wire_errc::bad_signature:
        return "invalid message signature";
      case wire_errc::frame_too_large:
        return "message is too large";
      case wire_errc::bad_json:
        return "malformed JSON message part";
    }
    return "unknown wire error";
  }
};

// ---- HMAC ------------------------------------------------------------------------------

// Python's hashlib names (what follows "hmac-" in a signature_scheme) -> OpenSSL digests.
struct DigestName {
  std::string_view scheme;
  const char* openssl;
};
constexpr DigestName kDigests[] = {
    {"md5", "MD5"},           {"sha1", "SHA1"},           {"sha224", "SHA224"},
    {"sha256", "SHA256"},     {"sha384", "SHA384"},       {"sha512", "SHA512"},
    {"sha3_224", "SHA3-224"}, {"sha3_256", "SHA3-256"},   {"sha3_384", "SHA3-384"},
    {"sha3_512", "SHA3-512"}, {"blake2b", "BLAKE2B-512"}, {"blake2s", "BLAKE2S-256"},
};

struct MacDeleter {
  void operator()(EVP_MAC* m) const noexcept { EVP_MAC_free(m); }
};
struct MacCtxDeleter {
  void operator()(EVP_MAC_CTX* c) const noexcept { EVP_MAC_CTX_free(c); }
};
struct MdDeleter {
  void operator()(EVP_MD* m) const noexcept { EVP_MD_free(m); }
};

// The HMAC algorithm object, fetched once.  An EVP_MAC is immutable and may be shared by
// threads; each sign() call makes its own EVP_MAC_CTX from it.
EVP_MAC* hmac_algorithm() {
  static const std::unique_ptr<EVP_MAC, MacDeleter> mac{EVP_MAC_fetch(nullptr, "HMAC", nullptr)};
  if (!mac) throw std::runtime_error("OpenSSL: HMAC is not available");
  return mac.get();
}

std::string to_hex(const unsigned char* data, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(n * 2, '\0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[data[i] >> 4];
    out[2 * i + 1] = kHex[data[i] & 0x0f];
  }
  return out;
}


// A parsed JSON document, with simdjson (which validates all of it, UTF-8 included). Documents up
// to 64 KiB (headers: every message has two) reuse one parser per thread; a larger one gets a
// parser of its own, so no thread keeps buffers the size of the largest message it saw.
template <class Fn>
bool with_document(std::string_view text, Fn&& fn) {
  constexpr std::size_t kReused = 64u << 10;
  simdjson::dom::element doc;
  if (text.size() <= kReused) {
    static thread_local simdjson::dom::parser reused;
    static thread_local std::string padded;  // the text and simdjson's padding, without a malloc
    if (padded.capacity() < kReused + simdjson::SIMDJSON_PADDING) padded.reserve(kReused + simdjson::SIMDJSON_PADDING);
    padded.assign(text);
    if (reused.parse(padded.data(), padded.size(), false).get(doc)) return false;
    return fn(doc);
  }
  simdjson::dom::parser own;
  if (own.parse(text.data(), text.size()).get(doc)) return false;  // copied to a padded buffer
  return fn(doc);
}

// A copy this large is written into memory fresh from the kernel, a page fault per 4 KiB;
// transparent huge pages (where the system allows them on request) make that one per 2 MiB.
constexpr std::size_t kHugeCopyBytes = 4u << 20;

void advise_huge_pages(char* p, std::size_t n) noexcept {
  constexpr std::uintptr_t kHuge = 2u << 20;
  auto from = (reinterpret_cast<std::uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  auto to = (reinterpret_cast<std::uintptr_t>(p) + n) & ~(kHuge - 1);
  if (to > from) ::madvise(reinterpret_cast<void*>(from), to - from, MADV_HUGEPAGE);
}

bool is_json_object(std::string_view text) {  // bad_alloc: decode reports frame_too_large
  return with_document(text, [](simdjson::dom::element doc) { return doc.is_object(); });
}

}  // namespace

const std::error_category& wire_category() noexcept {
  static const WireCategory category;
  return category;
}

std::error_code make_error_code(wire_errc e) noexcept {
  return {static_cast<int>(e), wire_category()};
}

// ---- Signer ----------------------------------------------------------------------------

Signer::Signer(std::string key, std::string_view scheme) : key_(std::move(key)) {
  constexpr std::string_view kPrefix = "hmac-";
  if (scheme.substr(0, kPrefix.size()) != kPrefix) {
    throw std::invalid_argument("signature scheme must be hmac-<digest>, got '" +
                                std::string(scheme) + "'");
  }
  const std::string_view name = scheme.substr(kPrefix.size());
  for (const auto& d : kDigests) {
    if (d.scheme == name) digest_ = d.openssl;
  }
  if (digest_.empty()) {
    throw std::invalid_argument("unknown signature scheme '" + std::string(scheme) + "'");
  }
  const std::unique_ptr<EVP_MD, MdDeleter> md{EVP_MD_fetch(nullptr, digest_.c_str(), nullptr)};
  if (!md) {
    throw std::invalid_argument("signature scheme '" + std::string(scheme) +
                                "' is not available in OpenSSL");
  }
  hex_len_ = static_cast<std::size_t>(EVP_MD_get_size(md.get())) * 2;
  if (!enabled()) {
    hmac_algorithm();  // fail early if HMAC itself is missing
    return;
  }
  std::unique_ptr<EVP_MAC_CTX, MacCtxDeleter> ctx{EVP_MAC_CTX_new(hmac_algorithm())};
  if (!ctx) throw std::runtime_error("OpenSSL: EVP_MAC_CTX_new failed");
  // OSSL_PARAM wants a mutable char*; OpenSSL only reads it.
  std::string digest = digest_;
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest.data(), 0),
      OSSL_PARAM_construct_end(),
  };
  if (EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(key_.data()), key_.size(),
                   params) != 1) {
    throw std::runtime_error("OpenSSL: EVP_MAC_init failed for " + digest_);
  }
  keyed_ = ctx.release();
}

Signer::~Signer() {
  EVP_MAC_CTX_free(keyed_);
  OPENSSL_cleanse(key_.data(), key_.size());
}

std::string Signer::sign(std::string_view header, std::string_view parent,
                         std::string_view metadata, std::string_view content) const {
  if (!enabled()) return {};
  // A copy of the keyed context: ~1 us less per message than a new context keyed each time.
  const std::unique_ptr<EVP_MAC_CTX, MacCtxDeleter> ctx{EVP_MAC_CTX_dup(keyed_)};
  if (!ctx) throw std::runtime_error("OpenSSL: EVP_MAC_CTX_dup failed");
  for (const std::string_view part : {header, parent, metadata, content}) {
    if (EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(part.data()),
                       part.size()) != 1) {
      throw std::runtime_error("OpenSSL: EVP_MAC_update failed");
    }
  }
  unsigned char mac[EVP_MAX_MD_SIZE];
  std::size_t mac_len = 0;
  if (EVP_MAC_final(ctx.get(), mac, &mac_len, sizeof mac) != 1) {
    throw std::runtime_error("OpenSSL: EVP_MAC_final failed");
  }
  return to_hex(mac, mac_len);
}

bool Signer::verify(std::string_view signature, std::string_view header,
                    std::string_view parent, std::string_view metadata,
                    std::string_view content) const {
  if (!enabled()) return true;
  if (signature.size() != hex_len_) return false;
  const std::string expected = sign(header, parent, metadata, content);
  return expected.size() == signature.size() &&
         CRYPTO_memcmp(expected.data(), signature.data(), expected.size()) == 0;
}

// ---- framing ---------------------------------------------------------------------------

std::error_code decode(const std::vector<std::string_view>& frames, const Signer& signer,
                       WireMessage& out, const DecodeLimits& limits, bool validate_json) {
  try {
    std::size_t delim = 0;
    while (delim < frames.size() && frames[delim] != kDelimiter) ++delim;
    if (delim == frames.size()) return wire_errc::missing_delimiter;
    // signature, header, parent, metadata, content
    if (frames.size() - delim - 1 < 5) return wire_errc::too_few_frames;

    std::size_t total = 0;
    for (const auto& f : frames) {
      if (f.size() > limits.max_message_bytes - total) return wire_errc::frame_too_large;
      total += f.size();
    }

    const std::string_view signature = frames[delim + 1];
    const std::string_view header = frames[delim + 2];
    const std::string_view parent = frames[delim + 3];
    const std::string_view metadata = frames[delim + 4];
    const std::string_view content = frames[delim + 5];

    if (signer.enabled()) {
      if (signature.empty()) return wire_errc::missing_signature;
      bool ok = false;
      try {
        ok = signer.verify(signature, header, parent, metadata, content);
      } catch (const std::exception&) {
        ok = false;
      }
      if (!ok) return wire_errc::bad_signature;
    }

    if (!is_json_object(header)) return wire_errc::bad_json;
    if (validate_json &&
        !(is_json_object(parent) && is_json_object(metadata) && is_json_object(content))) {
      return wire_errc::bad_json;
    }

    WireMessage msg;
    msg.identities.assign(frames.begin(), frames.begin() + static_cast<std::ptrdiff_t>(delim));
    msg.header = header;
    msg.parent_header = parent;
    msg.metadata = metadata;
    msg.content.reserve(content.size() + kJsonPadding);
    if (content.size() >= kHugeCopyBytes) advise_huge_pages(msg.content.data(), msg.content.capacity());
    msg.content.assign(content);
    msg.buffers.assign(frames.begin() + static_cast<std::ptrdiff_t>(delim + 6), frames.end());
    out = std::move(msg);
    return {};
  } catch (const std::bad_alloc&) {
    // Only copying the frames allocates; running out of memory means "too large".
    return wire_errc::frame_too_large;
  }
}

bool read_message_ids(std::string_view header, std::string_view parent, MessageIds& out) {
  auto field = [](simdjson::dom::element doc, const char* key, std::string& dst) {
    std::string_view v;
    if (!doc[key].get_string().get(v)) dst.assign(v);
  };
  if (!with_document(header, [&](simdjson::dom::element doc) {
        if (!doc.is_object()) return false;
        field(doc, "msg_id", out.msg_id);
        field(doc, "msg_type", out.msg_type);
        return true;
      }))
    return false;
  with_document(parent, [&](simdjson::dom::element doc) {
    if (doc.is_object()) field(doc, "msg_id", out.parent_msg_id);
    return true;
  });
  return true;
}

std::vector<std::string> encode(const WireMessage& msg, const Signer& signer) {
  std::vector<std::string> frames;
  frames.reserve(msg.identities.size() + 6 + msg.buffers.size());
  frames.insert(frames.end(), msg.identities.begin(), msg.identities.end());
  frames.emplace_back(kDelimiter);
  frames.push_back(signer.sign(msg.header, msg.parent_header, msg.metadata, msg.content));
  frames.push_back(msg.header);
  frames.push_back(msg.parent_header);
  frames.push_back(msg.metadata);
  frames.push_back(msg.content);
  frames.insert(frames.end(), msg.buffers.begin(), msg.buffers.end());
  return frames;
}

// ---- headers ---------------------------------------------------------------------------

json make_header(std::string_view msg_type, std::string_view session, std::string_view username) {
  return json{
      {"msg_id", new_hex_id()},       {"session", std::string(session)},
      {"username", std::string(username)}, {"date", iso_now()},
      {"msg_type", std::string(msg_type)}, {"version", "5.3"},
  };
}

std::string iso_now() { return iso_time(std::chrono::system_clock::now()); }

std::string iso_time(std::chrono::system_clock::time_point now) {
  using namespace std::chrono;
  const auto secs = time_point_cast<seconds>(now);
  auto micros = duration_cast<microseconds>(now - secs).count();
  std::time_t t = system_clock::to_time_t(secs);
  if (micros < 0) {  // clocks before the epoch: keep the fraction in [0, 1 s)
    micros += 1'000'000;
    --t;
  }
  std::tm tm{};
  gmtime_r(&t, &tm);
  char date[32];
  const std::size_t n = std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  std::snprintf(out, sizeof out, "%.*s.%06ldZ", static_cast<int>(n), date,
                static_cast<long>(micros));
  return out;
}

bool json_depth_within(std::string_view text, int max_depth) noexcept {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace kgate
