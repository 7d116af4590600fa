// Image outputs made fit for a model: base64 in and out, decoded and resized to a pixel cap.
#include "kgate/mcp/images.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <memory>
#include <new>
#include <tuple>

#include <openssl/evp.h>
#include <stb_image.h>
#include <stb_image_resize.h>
#include <stb_image_write.h>

namespace kgate::mcp {

namespace {

constexpr int kJpegQuality = 85;

// Base64 text goes through OpenSSL in pieces of this many characters (a multiple of 4, and far
// under the int lengths its API takes); bytes in pieces of kEncodeChunk (a multiple of 3).
constexpr std::size_t kDecodeChunk = std::size_t(1) << 20;
constexpr std::size_t kEncodeChunk = std::size_t(3) << 18;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\f' || c == '\v'; }

bool is_base64_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/';
}

enum class Format { png, jpeg, webp, other };

Format format_of_mime(std::string_view mime) {
  if (mime == "image/png") return Format::png;
  if (mime == "image/jpeg" || mime == "image/jpg") return Format::jpeg;
  if (mime == "image/webp") return Format::webp;
  return Format::other;
}

// The format the bytes say they are, by their signature (not a decoder: stb decodes).
Format format_of_bytes(std::string_view b) {
  if (b.size() >= 8 && b.substr(0, 8) == std::string_view("\x89PNG\r\n\x1a\n", 8)) return Format::png;
  if (b.size() >= 3 && b.substr(0, 3) == "\xff\xd8\xff") return Format::jpeg;
  if (b.size() >= 12 && b.substr(0, 4) == "RIFF" && b.substr(8, 4) == "WEBP") return Format::webp;
  return Format::other;
}

const char* mime_of(Format f) { return f == Format::jpeg ? "image/jpeg" : "image/png"; }

std::string stb_reason() {
  const char* why = stbi_failure_reason();
  return why ? why : "unknown reason";
}

// The largest size with the aspect ratio of w x h (within rounding) and at most `cap` pixels.
std::pair<int, int> fitted_size(int w, int h, std::size_t cap) {
  const double scale = std::sqrt(double(cap) / (double(w) * double(h)));
  // (The epsilon keeps an exact fit, 1200 x 0.64 = 768, from flooring to 767.)
  int nw = std::max(1, int(std::floor(w * scale + 1e-6)));
  int nh = std::max(1, int(std::floor(h * scale + 1e-6)));
  // Floating point can land one pixel over the cap: shave the longer side.
  while (std::size_t(nw) * std::size_t(nh) > cap && (nw > 1 || nh > 1)) {
    if (nw >= nh) --nw;
    else --nh;
  }
  return {nw, nh};
}

void append_to_string(void* context, void* data, int size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data), std::size_t(size));
}

struct StbFree {
  void operator()(stbi_uc* p) const { stbi_image_free(p); }
};

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.resize(4 * ((bytes.size() + 2) / 3) + 1);  // + the NUL EVP_EncodeBlock writes
  std::size_t written = 0;
  for (std::size_t off = 0; off < bytes.size(); off += kEncodeChunk) {
    const std::size_t n = std::min(kEncodeChunk, bytes.size() - off);
    const int got = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data() + written),
                                    reinterpret_cast<const unsigned char*>(bytes.data() + off), int(n));
    written += std::size_t(got);
  }
  out.resize(written);
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  // OpenSSL skips whitespace itself, but it also reads '-' as an end of data and stops there
  // silently: the text is checked (and compacted) here, so only clean base64 reaches it.
  std::string clean;
  clean.reserve(text.size());
  std::size_t pad = 0;
  for (char c : text) {
    if (is_space(c)) continue;
    if (c == '=') {
      ++pad;
    } else if (pad > 0 || !is_base64_char(c)) {
      return std::nullopt;  // padding in the middle, or not base64 at all
    }
    clean.push_back(c);
  }
  const std::size_t data = clean.size() - pad;
  if (pad > 2 || data % 4 == 1 || (pad > 0 && clean.size() % 4 != 0)) return std::nullopt;
  while (clean.size() % 4 != 0) clean.push_back('=');  // unpadded input

  std::unique_ptr<EVP_ENCODE_CTX, decltype(&EVP_ENCODE_CTX_free)> ctx(EVP_ENCODE_CTX_new(), &EVP_ENCODE_CTX_free);
  if (!ctx) throw std::bad_alloc();
  EVP_DecodeInit(ctx.get());
  std::string out;
  out.resize(clean.size() / 4 * 3 + 3);
  std::size_t written = 0;
  for (std::size_t off = 0; off < clean.size(); off += kDecodeChunk) {
    const std::size_t n = std::min(kDecodeChunk, clean.size() - off);
    int got = 0;
    if (EVP_DecodeUpdate(ctx.get(), reinterpret_cast<unsigned char*>(out.data() + written), &got,
                         reinterpret_cast<const unsigned char*>(clean.data() + off), int(n)) < 0)
      return std::nullopt;
    written += std::size_t(got);
  }
  int got = 0;
  if (EVP_DecodeFinal(ctx.get(), reinterpret_cast<unsigned char*>(out.data() + written), &got) < 0)
    return std::nullopt;
  written += std::size_t(got);
  out.resize(written);
  return out;
}

FittedImage fit_image(std::string_view base64_data, std::string_view mime, std::size_t max_pixels) {
  FittedImage r;
  const Format declared = format_of_mime(mime);
  if (declared == Format::webp) {
    r.error = "WebP images are not supported here (no WebP decoder, so its size cannot be checked)";
    return r;
  }
  if (declared == Format::other) {
    r.error = "not an image type kgate-mcp returns (PNG and JPEG only)";
    return r;
  }
  const auto bytes = base64_decode(base64_data);
  if (!bytes) {
    r.error = "the image data is not valid base64";
    return r;
  }
  if (bytes->empty()) {
    r.error = "the image data is empty";
    return r;
  }
  if (bytes->size() > std::size_t(INT_MAX)) {
    r.error = "the image data is over 2 GB";
    return r;
  }
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes->data());
  const int len = int(bytes->size());
  const Format actual = format_of_bytes(*bytes);
  if (actual == Format::webp) {
    r.error = "the data is a WebP image, which is not supported here";
    return r;
  }

  // The header first, so a huge image is refused before its pixels are allocated.
  int w = 0, h = 0, channels = 0;
  if (!stbi_info_from_memory(data, len, &w, &h, &channels)) {
    r.error = "the data is not a readable image (" + stb_reason() + ")";
    return r;
  }
  const std::size_t pixels = std::size_t(w) * std::size_t(h);
  if (w <= 0 || h <= 0 || pixels > kMaxSourcePixels) {
    r.error = "the image is too large to decode (" + std::to_string(w) + "x" + std::to_string(h) + ")";
    return r;
  }
  std::unique_ptr<stbi_uc, StbFree> px(stbi_load_from_memory(data, len, &w, &h, &channels, 0));
  if (!px) {
    r.error = "the image does not decode (" + stb_reason() + ")";
    return r;
  }

  // Keep the bytes' own format when it is one we return; re-encode anything else (a GIF under
  // image/png) in the format its mime asked for.
  const Format out = actual == Format::png || actual == Format::jpeg ? actual : declared;
  r.mime = mime_of(out);
  const bool fits = max_pixels == 0 || pixels <= max_pixels;
  if (fits && out == actual) {
    r.ok = true;
    r.base64 = base64_encode(*bytes);
    r.width = w;
    r.height = h;
    return r;
  }

  int nw = w, nh = h;
  std::unique_ptr<stbi_uc[]> resized;
  const stbi_uc* pixels_out = px.get();
  if (!fits) {
    std::tie(nw, nh) = fitted_size(w, h, max_pixels);
    resized.reset(new stbi_uc[std::size_t(nw) * std::size_t(nh) * std::size_t(channels)]);
    const int alpha = channels == 2 ? 1 : channels == 4 ? 3 : STBIR_ALPHA_CHANNEL_NONE;
    if (!stbir_resize_uint8_srgb(px.get(), w, h, 0, resized.get(), nw, nh, 0, channels, alpha, 0)) {
      r.error = "the image could not be resized";
      return r;
    }
    pixels_out = resized.get();
  }
  std::string encoded;
  const int wrote = out == Format::jpeg
                        ? stbi_write_jpg_to_func(&append_to_string, &encoded, nw, nh, channels, pixels_out, kJpegQuality)
                        : stbi_write_png_to_func(&append_to_string, &encoded, nw, nh, channels, pixels_out, 0);
  if (!wrote || encoded.empty()) {
    r.error = "the resized image could not be encoded";
    return r;
  }
  r.ok = true;
  r.base64 = base64_encode(encoded);
  r.width = nw;
  r.height = nh;
  return r;
}

}  // namespace kgate::mcp
