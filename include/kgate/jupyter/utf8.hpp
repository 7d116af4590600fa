// UTF-8 hygiene for text that comes from kernels: a kernel may send any bytes (ipykernel packs
// its messages with errors='surrogateescape', so a str holding '\udcff' goes out as the raw
// byte 0xFF), and JSON must carry valid UTF-8.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace kgate {

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF):
// simdjson's validator (SIMD, the implementation it picks for this CPU at run time).
bool is_valid_utf8(std::string_view s) noexcept;
// `s` with every ill-formed sequence replaced by U+FFFD, one per maximal subpart (the Unicode
// standard's practice, as Python's and the WHATWG decoders do).  Valid text is copied as is.
std::string valid_utf8(std::string_view s);
// The same in place: `s` is rebuilt only when it is not valid.
void make_valid_utf8(std::string& s);
// JSON text for a response or a file whatever the strings in `j` hold: invalid UTF-8 in them
// becomes U+FFFD instead of throwing (nlohmann's strict dump throws type_error.316).
std::string dump_json(const nlohmann::json& j, int indent = -1);

// The columns `s` takes on a terminal: wcwidth(3) of each character in the C.UTF-8 locale (2 for
// East Asian wide ones and most emoji, 0 for combining marks and controls), 1 for each byte of
// an ill-formed sequence (a terminal shows it as one replacement character).
std::size_t display_width(std::string_view s);

// Rows of cells as text: each column padded to its widest cell (display_width), two spaces
// between columns, the last non-empty cell of a row unpadded, each line `indent` first.
std::string format_table(const std::vector<std::vector<std::string>>& rows, std::string_view indent = "");

// Removes ANSI escape sequences (CSI, OSC and the other string and short forms) without taking
// a byte of a multi-byte character: valid UTF-8 stays valid.
std::string strip_ansi(std::string_view s);

}  // namespace kgate
