// Fuzz target: the Jupyter wire codec (kgate/wire.hpp): framing, HMAC check, JSON parts.
//
// The input is cut into frames.  Each message is decoded three ways: unsigned, signed with the
// fuzzer's own signature frame (almost always rejected), and signed with the correct signature
// put in by the harness, so the JSON checks behind the HMAC are reached too.  Whatever decodes
// must encode and decode again to the same message.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kgate/jupyter/wire.hpp"

namespace {

void must(bool ok) {
  if (!ok) std::abort();
}

void round_trip(const kgate::WireMessage& m, const kgate::Signer& signer) {
  auto frames = kgate::encode(m, signer);
  std::vector<std::string_view> views(frames.begin(), frames.end());
  kgate::WireMessage again;
  must(!kgate::decode(views, signer, again, {}, true));
  must(again.header == m.header && again.parent_header == m.parent_header && again.metadata == m.metadata &&
       again.content == m.content && again.buffers == m.buffers && again.identities == m.identities);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const kgate::Signer unsigned_session;
  static const kgate::Signer signer("fuzz-key", "hmac-sha256");
  FuzzedDataProvider in(data, size);
  const bool fix_signature = in.ConsumeBool();
  const bool validate = in.ConsumeBool();
  const std::size_t limit = in.ConsumeIntegralInRange<std::size_t>(1, 1 << 16);
  std::vector<std::string> frames;
  while (in.remaining_bytes() > 0 && frames.size() < 64) frames.push_back(in.ConsumeRandomLengthString(4096));

  std::vector<std::string_view> views(frames.begin(), frames.end());
  kgate::DecodeLimits limits;
  limits.max_message_bytes = limit;
  for (const kgate::Signer* s : {&unsigned_session, &signer}) {
    kgate::WireMessage out;
    if (!kgate::decode(views, *s, out, limits, validate) && validate) round_trip(out, *s);
  }
  if (fix_signature) {  // put the right HMAC after the delimiter, wherever it is
    for (std::size_t i = 0; i + 5 < frames.size(); ++i) {
      if (frames[i] != kgate::kDelimiter) continue;
      frames[i + 1] = signer.sign(frames[i + 2], frames[i + 3], frames[i + 4], frames[i + 5]);
      std::vector<std::string_view> fixed(frames.begin(), frames.end());
      kgate::WireMessage out;
      if (!kgate::decode(fixed, signer, out, {}, true)) round_trip(out, signer);
      break;
    }
  }
  (void)kgate::json_depth_within(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
