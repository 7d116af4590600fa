// Image outputs made fit for a model: base64 in and out, decoded and resized to a pixel cap.
//
// Built on OpenSSL (base64, digests) and stb (stb_image, stb_image_resize, stb_image_write).
// Pure functions of their arguments: safe to call from any thread (nothing here touches stb's
// global settings).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace kgate::mcp {

// What fit_image made of one image output.
struct FittedImage {
  bool ok = false;
  std::string mime;    // the format of `base64`: that of the input bytes, image/png or image/jpeg
  std::string base64;  // the image, base64 without line breaks
  int width = 0, height = 0;
  std::string error;   // why not ok, one phrase a model can read ("the data is not base64", ...)
};

// Decodes `base64_data` (whitespace and line breaks allowed, as Jupyter sends them), decodes the
// image and, when width * height > max_pixels, resizes it (aspect ratio kept, so that
// width * height <= max_pixels) and re-encodes it in its own format (PNG, or JPEG at quality 85).
// An image within the cap is passed through: the same bytes, the base64 only normalised.
// max_pixels 0 means no cap.
//
// Formats: PNG and JPEG.  A mime that disagrees with the bytes is corrected (an image/png output
// holding a JPEG comes back as image/jpeg).  Other formats stb can read (GIF, BMP) under an
// image/png or image/jpeg mime are re-encoded in the mime's format.  WebP is refused (not ok):
// stb has no WebP codec, so a WebP can be neither checked nor resized, and an unchecked image
// could be any size.  Images over kMaxSourcePixels are refused before decoding.
// Never throws for bad input; only std::bad_alloc can escape.
FittedImage fit_image(std::string_view base64_data, std::string_view mime, std::size_t max_pixels);

// Images with more pixels than this are not decoded (a 64 Mpx RGBA image is 256 MB of pixels).
inline constexpr std::size_t kMaxSourcePixels = std::size_t(64) << 20;

// Standard base64 (RFC 4648 alphabet, '=' padding), no line breaks.
std::string base64_encode(std::string_view bytes);
// Standard base64 back to bytes.  ASCII whitespace anywhere is ignored; missing '=' padding is
// accepted; anything else that is not base64 (a stray character, padding in the middle, a
// dangling sixth bit group) is nullopt.
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace kgate::mcp
