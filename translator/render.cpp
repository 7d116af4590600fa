// A cell's outputs rendered for a model: concise text, and MCP content blocks with images.
#include "render.hpp"

#include <algorithm>
#include <array>
#include <cstdio>

#include <openssl/evp.h>

#include "images.hpp"

namespace kgate::mcp {

namespace {

// The text mimes in the order a model is shown them (a DataFrame renders as its HTML).
constexpr std::array<std::string_view, 5> kTextMimes = {"text/markdown", "text/html", "application/javascript",
                                                        "text/latex", "text/plain"};
// The image mimes in the order one is picked from a bundle.
constexpr std::array<std::string_view, 3> kImageMimes = {"image/jpeg", "image/png", "image/webp"};

// Chars kept free for the line render_text puts at a cut (it is shorter than this even with
// four 20-digit numbers).
constexpr std::size_t kCutNoteReserve = 200;

bool continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Code points in s (a stray continuation byte counts as part of the one before it).
std::size_t chars(std::string_view s) {
  return std::size_t(std::count_if(s.begin(), s.end(), [](char c) { return !continuation(c); }));
}

// The byte offset of the n-th code point of s (s.size() when s has fewer).
std::size_t char_offset(std::string_view s, std::size_t n) {
  std::size_t i = 0;
  for (; i < s.size(); ++i)
    if (!continuation(s[i]) && n-- == 0) return i;
  return i;
}

// Removes ANSI escapes: CSI (ESC [, parameter and intermediate bytes 0x20-0x3F, a final byte
// 0x40-0x7E), OSC (ESC ] ... BEL or ESC \) and the short forms (ESC, intermediates 0x20-0x2F,
// a final byte 0x30-0x7E: ESC ( B, ESC =, ...).  A malformed escape loses only its ASCII bytes,
// so a UTF-8 character after it is never split; an unterminated OSC ends at the line's end.
std::string strip_ansi(std::string_view s) {
  auto in = [&](std::size_t i, char lo, char hi) { return i < s.size() && s[i] >= lo && s[i] <= hi; };
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '\x1b') {
      out.push_back(s[i++]);
      continue;
    }
    ++i;
    if (i < s.size() && s[i] == '[') {
      ++i;
      while (in(i, 0x20, 0x3F)) ++i;
      if (in(i, 0x40, 0x7E)) ++i;
    } else if (i < s.size() && s[i] == ']') {
      ++i;
      while (i < s.size() && s[i] != '\a' && s[i] != '\n' && !(s[i] == '\x1b' && i + 1 < s.size() && s[i + 1] == '\\')) ++i;
      if (i < s.size() && s[i] != '\n') i += s[i] == '\a' ? 1 : 2;
    } else {
      while (in(i, 0x20, 0x2F)) ++i;
      if (in(i, 0x30, 0x7E)) ++i;
    }
  }
  return out;
}

// If s[i..] is a private mode set/reset for the alternate screen (ESC [ ? 47|1047|1049 h|l),
// its length, with `enter` set to whether it is the 'h'; else 0.
std::size_t alt_screen_switch(std::string_view s, std::size_t i, bool& enter) {
  if (s.compare(i, 3, "\x1b[?") != 0) return 0;
  std::size_t j = i + 3;
  while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
  if (j >= s.size() || (s[j] != 'h' && s[j] != 'l')) return 0;
  const std::string_view mode = s.substr(i + 3, j - i - 3);
  if (mode != "1049" && mode != "1047" && mode != "47") return 0;
  enter = s[j] == 'h';
  return j + 1 - i;
}

// s without what was drawn on the alternate screen: a full-screen program's frames vanish when
// it exits, and the main screen shows what was there before and what came after.
std::string drop_alt_screen(std::string_view s) {
  if (s.find("\x1b[?") == std::string_view::npos) return std::string(s);
  std::string out;
  out.reserve(s.size());
  bool alt = false;
  for (std::size_t i = 0; i < s.size();) {
    bool enter = false;
    if (const std::size_t n = alt_screen_switch(s, i, enter)) {
      alt = enter;
      i += n;
      continue;
    }
    if (!alt) out.push_back(s[i]);
    ++i;
  }
  return out;
}

std::string_view trim_trailing_space(std::string_view s) {
  const auto end = s.find_last_not_of(" \t\r\n\f\v");
  return end == std::string_view::npos ? std::string_view() : s.substr(0, end + 1);
}

// Whether a traceback line is only an anchor under a source line (carets, tildes, blanks).
bool anchor_only(std::string_view line) { return line.find_first_not_of("^~ ") == std::string_view::npos; }

// One traceback chunk with each line capped as cap_traceback says.
std::string cap_lines(std::string_view chunk, std::size_t cap) {
  std::string out;
  out.reserve(std::min(chunk.size(), cap * 8 + 64));
  std::size_t i = 0;
  while (i < chunk.size()) {
    const std::size_t nl = chunk.find('\n', i);
    const std::size_t end = nl == std::string_view::npos ? chunk.size() : nl;
    const std::string_view line = chunk.substr(i, end - i);
    const std::string_view eol = nl == std::string_view::npos ? std::string_view() : std::string_view("\n");
    i = nl == std::string_view::npos ? chunk.size() : nl + 1;
    if (chars(line) <= cap) {
      out.append(line).append(eol);
      continue;
    }
    const auto start = line.find_first_not_of(" \t");
    const std::string_view body = start == std::string_view::npos ? std::string_view() : line.substr(start);
    if (body.starts_with("File ") || body.starts_with("Cell ")) {
      out.append(line).append(eol);
    } else if (!anchor_only(line)) {
      out.append(line.substr(0, char_offset(line, cap))).append("…").append(eol);
    }  // else: an anchor line too long to keep; its source line was cut anyway
  }
  return out;
}

// The text of a mime bundle entry: a string, or nbformat's list of lines.
std::optional<std::string> mime_text(const json& data, std::string_view mime) {
  const auto it = data.find(mime);
  if (it == data.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return std::nullopt;
  std::string s;
  for (const auto& part : *it) {
    if (!part.is_string()) return std::nullopt;
    s += part.get_ref<const std::string&>();
  }
  return s;
}

std::string str_field(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::size_t count_field(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<std::size_t>() : 0;
}

std::vector<std::string> traceback_field(const json& j) {
  std::vector<std::string> tb;
  const auto it = j.find("traceback");
  if (it == j.end() || !it->is_array()) return tb;
  for (const auto& line : *it)
    if (line.is_string()) tb.push_back(line.get<std::string>());
  return tb;
}

CellOutput error_output(const json& content) {
  CellOutput o;
  o.kind = CellOutput::Kind::error;
  o.ename = str_field(content, "ename");
  o.evalue = str_field(content, "evalue");
  o.traceback = traceback_field(content);
  return o;
}

// One rendered output: its tag, the mime shown (empty for plain text) and its text.
struct Piece {
  std::string tag;
  std::string mime;
  std::string text;
};

Piece data_piece(std::string tag, const json& data) {
  Piece p{std::move(tag), {}, {}};
  if (!data.is_object()) return p;
  for (const auto mime : kTextMimes)
    if (auto text = mime_text(data, mime)) {
      if (mime != "text/plain") p.mime = mime;
      p.text = strip_ansi(*text);
      break;
    }
  return p;
}

Piece error_piece(const CellOutput& o, const RenderOptions& opts) {
  if (!o.traceback.empty()) return {"error", {}, cap_traceback(o.traceback, opts.traceback_line)};
  std::string text = o.ename;
  if (!o.evalue.empty()) text += (text.empty() ? "" : ": ") + o.evalue;
  return {"error", {}, strip_ansi(text)};
}

// text cut in the middle to at most `max` chars, as render_text says.
std::string cap_text(std::string text, std::size_t max) {
  const std::size_t total = chars(text);
  if (max == 0 || total <= max) return text;
  const std::size_t budget = max > kCutNoteReserve ? max - kCutNoteReserve : 0;
  const std::size_t head = budget / 5;
  std::size_t head_end = char_offset(text, head);
  std::size_t tail_begin = char_offset(text, total - (budget - head));
  // Cut at line ends when one is near: back over at most a quarter of the head, forward over at
  // most an eighth of the tail.  This only shortens what is kept.
  if (head_end > 0) {
    const std::size_t nl = text.rfind('\n', head_end - 1);
    if (nl != std::string::npos && nl + 1 >= head_end - head_end / 4) head_end = nl + 1;
  }
  if (tail_begin < text.size() && tail_begin > 0 && text[tail_begin - 1] != '\n') {
    const std::size_t nl = text.find('\n', tail_begin);
    if (nl != std::string::npos && nl + 1 <= tail_begin + (text.size() - tail_begin) / 8) tail_begin = nl + 1;
  }
  const std::string_view head_text = std::string_view(text).substr(0, head_end);
  const std::string_view tail_text = std::string_view(text).substr(tail_begin);
  const std::size_t kept_head = chars(head_text), kept_tail = chars(tail_text);
  std::string out;
  out.reserve(head_text.size() + tail_text.size() + kCutNoteReserve);
  out.append(head_text);
  if (!head_text.empty() && head_text.back() != '\n') out.push_back('\n');
  out += "[… " + std::to_string(total - kept_head - kept_tail) + " chars cut here: above are the first " +
         std::to_string(kept_head) + " and below the last " + std::to_string(kept_tail) + " of " +
         std::to_string(total) + " chars …]\n";
  out.append(tail_text);
  return out;
}

std::string media_id(std::string_view base64) {
  const auto bytes = base64_decode(base64);
  if (!bytes) return "00000000";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!EVP_Digest(bytes->data(), bytes->size(), md, &len, EVP_sha256(), nullptr) || len < 4) return "00000000";
  char hex[9];
  std::snprintf(hex, sizeof hex, "%02x%02x%02x%02x", md[0], md[1], md[2], md[3]);
  return hex;
}

json text_block(std::string text) { return {{"type", "text"}, {"text", std::move(text)}}; }

}  // namespace

std::optional<CellOutput> output_from_iopub(std::string_view msg_type, const json& content) {
  const json& c = content.is_object() ? content : json::object();
  CellOutput o;
  if (msg_type == "stream") {
    o.kind = CellOutput::Kind::stream;
    o.name = str_field(c, "name");
    o.text = str_field(c, "text");
  } else if (msg_type == "execute_result" || msg_type == "display_data") {
    o.kind = msg_type == "display_data" ? CellOutput::Kind::display_data : CellOutput::Kind::execute_result;
    const auto data = c.find("data");
    if (data != c.end() && data->is_object()) o.data = *data;
  } else if (msg_type == "error") {
    o = error_output(c);
  } else {
    return std::nullopt;
  }
  return o;
}

std::vector<CellOutput> outputs_from_record(const json& job) {
  std::vector<CellOutput> outs;
  if (!job.is_object()) return outs;
  const std::string output = str_field(job, "output");
  const std::size_t output_cut = count_field(job, "output_cut");
  if (!output.empty() || output_cut) {
    CellOutput o;
    o.name = "stdout";
    if (output_cut) o.text = "[" + std::to_string(output_cut) + " earlier bytes of output were cut]\n";
    o.text += output;
    outs.push_back(std::move(o));
  }
  const std::string result = str_field(job, "result");
  const std::size_t result_cut = count_field(job, "result_cut");
  if (!result.empty() || result_cut) {
    CellOutput o;
    o.kind = CellOutput::Kind::execute_result;
    std::string text;
    if (result_cut) text = "[" + std::to_string(result_cut) + " earlier bytes of the result were cut]\n";
    o.data["text/plain"] = text + result;
    outs.push_back(std::move(o));
  }
  if (const auto err = job.find("error"); err != job.end() && err->is_object()) outs.push_back(error_output(*err));
  if (const std::string note = str_field(job, "note"); !note.empty()) {
    CellOutput o;
    o.name = "stderr";
    o.text = note;
    outs.push_back(std::move(o));
  }
  return outs;
}

std::string clean_stream(std::string_view s) {
  const std::string text = strip_ansi(drop_alt_screen(s));
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (true) {
    const std::size_t nl = text.find('\n', i);
    std::string_view line = std::string_view(text).substr(i, nl == std::string::npos ? std::string::npos : nl - i);
    while (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // "\r\n", or a '\r' with nothing after
    if (const auto cr = line.rfind('\r'); cr != std::string_view::npos) line.remove_prefix(cr + 1);
    const std::size_t line_start = out.size();
    for (const char c : line) {
      if (c != '\b') {
        out.push_back(c);
        continue;
      }
      // Erase one whole character, never past the start of the line.
      while (out.size() > line_start && continuation(out.back())) out.pop_back();
      if (out.size() > line_start) out.pop_back();
    }
    if (nl == std::string::npos) break;
    out.push_back('\n');
    i = nl + 1;
  }
  return out;
}

std::string cap_traceback(const std::vector<std::string>& tb, std::size_t line_cap) {
  std::string out;
  for (std::size_t k = 0; k < tb.size(); ++k) {
    if (k) out.push_back('\n');
    std::string chunk = strip_ansi(tb[k]);
    out += k + 1 < tb.size() && line_cap ? cap_lines(chunk, line_cap) : chunk;
  }
  return out;
}

std::string render_text(const std::vector<CellOutput>& outs, const RenderOptions& opts) {
  std::vector<Piece> displays, streams, tail;
  for (const auto& o : outs) {
    switch (o.kind) {
      case CellOutput::Kind::stream: {
        const std::string name = o.name.empty() ? "stdout" : o.name;
        auto it = std::find_if(streams.begin(), streams.end(), [&](const Piece& p) { return p.tag == name; });
        if (it == streams.end()) streams.push_back({name, {}, o.text});
        else it->text += o.text;
        break;
      }
      case CellOutput::Kind::display_data: displays.push_back(data_piece("display_data", o.data)); break;
      case CellOutput::Kind::execute_result: tail.push_back(data_piece("execute_result", o.data)); break;
      case CellOutput::Kind::error: tail.push_back(error_piece(o, opts)); break;
    }
  }
  auto rank = [](const Piece& p) { return p.tag == "stdout" ? 0 : p.tag == "stderr" ? 1 : 2; };
  std::stable_sort(streams.begin(), streams.end(), [&](const Piece& a, const Piece& b) { return rank(a) < rank(b); });
  for (auto& p : streams) p.text = clean_stream(p.text);

  std::vector<Piece> pieces;
  for (auto* group : {&displays, &streams, &tail})
    for (auto& p : *group) {
      p.text.resize(trim_trailing_space(p.text).size());
      if (!p.text.empty()) pieces.push_back(std::move(p));
    }
  std::string text;
  if (pieces.size() == 1) {
    text = std::move(pieces.front().text);
  } else {
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const Piece& p = pieces[k];
      if (k) text.push_back('\n');
      text += "<" + p.tag + (p.mime.empty() ? "" : " mime=\"" + p.mime + "\"") + ">\n";
      text += p.text;
      text += "\n</" + p.tag + ">";
    }
  }
  return cap_text(std::move(text), opts.max_text);
}

json render_content(const std::vector<CellOutput>& outs, const RenderOptions& opts) {
  std::string text = render_text(outs, opts);
  json blocks = json::array();
  std::vector<std::string> notes;
  std::size_t images = 0;
  for (const auto& o : outs) {
    if (o.kind != CellOutput::Kind::display_data && o.kind != CellOutput::Kind::execute_result) continue;
    if (!o.data.is_object()) continue;
    std::string_view mime;
    std::optional<std::string> data;
    for (const auto m : kImageMimes)
      if ((data = mime_text(o.data, m))) {
        mime = m;
        break;
      }
    if (!data) continue;
    auto unavailable = [&](const std::string& why) {
      notes.push_back("<media-unavailable mime=\"" + std::string(mime) + "\": " + why + ">");
    };
    if (images >= opts.max_images) {
      unavailable("over the limit of " + std::to_string(opts.max_images) + " images in one reply");
      continue;
    }
    FittedImage img = fit_image(*data, mime, opts.max_pixels);
    if (!img.ok) {
      unavailable(img.error);
      continue;
    }
    ++images;
    blocks.push_back(text_block("<media id=\"" + media_id(img.base64) + "\" type=\"output\" mime=\"" + img.mime + "\">"));
    blocks.push_back({{"type", "image"}, {"data", std::move(img.base64)}, {"mimeType", img.mime}});
  }
  for (const auto& note : notes) {
    if (!text.empty()) text.push_back('\n');
    text += note;
  }
  blocks.push_back(text_block(std::move(text)));
  return blocks;
}

}  // namespace kgate::mcp
