// UTF-8 validation and repair (U+FFFD for what is ill-formed).
#include "kgate/jupyter/utf8.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <cwchar>

#include <locale.h>

#include <simdjson.h>

namespace kgate {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The bytes at s[i] are not ASCII.  Returns the length of the character there when it is
// well-formed (`ok`), else the length of its maximal ill-formed subpart (at least 1).
std::size_t sequence_at(std::string_view s, std::size_t i, bool& ok) noexcept {
  auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;  // no overlongs
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;  // no surrogates
  } else if (c >= 0xE1 && c <= 0xEF) {
    need = 2;
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;  // no overlongs
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;  // nothing past U+10FFFF
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else {
    ok = false;  // a continuation byte, C0, C1 or F5-FF: never starts a character
    return 1;
  }
  std::size_t j = i + 1;
  for (std::size_t k = 0; k < need; ++k, ++j) {
    if (j >= s.size() || b(j) < lo || b(j) > hi) {
      ok = false;
      return j - i;
    }
    lo = 0x80, hi = 0xBF;
  }
  ok = true;
  return j - i;
}

// The length of the ASCII run at the start of s[i..]: eight bytes at a time.
std::size_t ascii_run(std::string_view s, std::size_t i) noexcept {
  const std::size_t from = i;
  while (i + 8 <= s.size()) {
    std::uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    if (w & 0x8080808080808080ull) break;
    i += 8;
  }
  while (i < s.size() && static_cast<unsigned char>(s[i]) < 0x80) ++i;
  return i - from;
}

// The offset of the first ill-formed sequence in `s`, or s.size().
std::size_t first_invalid(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    i += ascii_run(s, i);
    if (i >= s.size()) break;
    bool ok = false;
    std::size_t n = sequence_at(s, i, ok);
    if (!ok) return i;
    i += n;
  }
  return s.size();
}

}  // namespace

bool is_valid_utf8(std::string_view s) noexcept { return simdjson::validate_utf8(s.data(), s.size()); }

std::string valid_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::size_t bad = first_invalid(s);
  if (bad == s.size()) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  out.append(s.substr(0, bad));
  std::size_t i = bad;
  while (i < s.size()) {
    std::size_t run = ascii_run(s, i);
    out.append(s.substr(i, run));
    i += run;
    if (i >= s.size()) break;
    bool ok = false;
    std::size_t n = sequence_at(s, i, ok);
    if (ok) out.append(s.substr(i, n));
    else out.append(kReplacement);
    i += n;
  }
  return out;
}

void make_valid_utf8(std::string& s) {
  if (!is_valid_utf8(s)) s = valid_utf8(s);
}

std::string dump_json(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::size_t display_width(std::string_view s) {
  // wcwidth reads the calling thread's LC_CTYPE: C.UTF-8 for the call, whatever the process's.
  static const locale_t utf8 = ::newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  const locale_t before = utf8 ? ::uselocale(utf8) : static_cast<locale_t>(nullptr);
  std::size_t width = 0;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t run = ascii_run(s, i);
    for (std::size_t k = i; k < i + run; ++k) width += std::isprint(static_cast<unsigned char>(s[k])) ? 1 : 0;
    i += run;
    if (i >= s.size()) break;
    bool ok = false;
    const std::size_t n = sequence_at(s, i, ok);
    if (!ok) {
      width += n;
      i += n;
      continue;
    }
    std::uint32_t cp = static_cast<unsigned char>(s[i]) & (0x7F >> n);
    for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    const int w = utf8 ? ::wcwidth(static_cast<wchar_t>(cp)) : 1;
    width += w > 0 ? static_cast<std::size_t>(w) : 0;
    i += n;
  }
  if (utf8) ::uselocale(before);
  return width;
}

std::string format_table(const std::vector<std::vector<std::string>>& rows, std::string_view indent) {
  std::vector<std::size_t> widths;
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (widths.size() <= i) widths.push_back(0);
      widths[i] = std::max(widths[i], display_width(r[i]));
    }
  std::string out;
  for (const auto& r : rows) {
    std::size_t last = r.size();
    while (last > 0 && r[last - 1].empty()) --last;
    out += indent;
    for (std::size_t i = 0; i < last; ++i) {
      out += r[i];
      if (i + 1 < last) out.append(widths[i] - display_width(r[i]) + 2, ' ');
    }
    out += '\n';
  }
  return out;
}

// An escape sequence is ESC and ASCII bytes only, so what is removed never takes a byte of a
// multi-byte character and valid UTF-8 stays valid:
// - CSI: ESC [, parameter and intermediate bytes 0x20-0x3F, a final byte 0x40-0x7E;
// - OSC, DCS, SOS, PM, APC (ESC ] P X ^ _): a string up to BEL, ST (ESC backslash) or the line's end;
//   the string may hold any text, which goes with it;
// - the short forms: ESC, intermediates 0x20-0x2F, a final byte 0x30-0x7E (ESC ( B, ESC =).
// A malformed sequence ends at the first byte that cannot be part of it; that byte is kept.
std::string strip_ansi(std::string_view s) {
  auto in = [&](std::size_t i, unsigned char lo, unsigned char hi) {
    return i < s.size() && static_cast<unsigned char>(s[i]) >= lo && static_cast<unsigned char>(s[i]) <= hi;
  };
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '\x1b') {
      out.push_back(s[i++]);
      continue;
    }
    ++i;
    if (i >= s.size()) break;
    const char k = s[i];
    if (k == '[') {
      ++i;
      while (in(i, 0x20, 0x3F)) ++i;
      if (in(i, 0x40, 0x7E)) ++i;
    } else if (k == ']' || k == 'P' || k == 'X' || k == '^' || k == '_') {
      ++i;
      while (i < s.size() && s[i] != '\a' && s[i] != '\x1b' && s[i] != '\n') ++i;
      if (i < s.size() && s[i] == '\a') ++i;
      else if (i + 1 < s.size() && s[i] == '\x1b' && s[i + 1] == '\\') i += 2;
      // else: an ESC that is not ST begins the next sequence; a newline is kept
    } else {
      while (in(i, 0x20, 0x2F)) ++i;
      if (in(i, 0x30, 0x7E)) ++i;
    }
  }
  return out;
}

}  // namespace kgate
