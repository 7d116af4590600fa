// A cell's outputs rendered for a model: concise text, and MCP content blocks with images.
#include "kgate/mcp/render.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <regex>
#include <type_traits>

#include <dlfcn.h>
#include <libxml/HTMLparser.h>
#include <libxml/tree.h>
#include <openssl/evp.h>

#include "kgate/mcp/images.hpp"
#include "kgate/jupyter/utf8.hpp"

namespace kgate::mcp {

namespace {

// The text mimes shown, in this order, when text/plain says nothing (render_text).
constexpr std::array<std::string_view, 4> kRichMimes = {"text/markdown", "text/html", "text/latex",
                                                        "application/javascript"};
// The image mimes in the order one is picked from a bundle.
constexpr std::array<std::string_view, 3> kImageMimes = {"image/jpeg", "image/png", "image/webp"};

// Chars kept free for the line render_text puts at a cut (it is shorter than this even with
// four 20-digit numbers).
constexpr std::size_t kCutNoteReserve = 200;

// HTML past this many bytes is not parsed (the text shown is capped far below it anyway).
constexpr std::size_t kMaxHtmlBytes = std::size_t(2) << 20;
// Elements nested deeper than this are not read (libxml2 stops at 256 without HTML_PARSE_HUGE).
constexpr int kMaxHtmlDepth = 512;

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

// kgate::strip_ansi (the records' rule, src/records/jobs.cpp) on text made valid_utf8 first, so the
// output is valid UTF-8.
std::string strip_ansi(std::string_view raw) { return kgate::strip_ansi(valid_utf8(raw)); }

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

// One rendered output: its tag, the mime shown (empty for plain text) and its text.
struct Piece {
  std::string tag;
  std::string mime;
  std::string text;
};

bool blank(std::string_view s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos; }

// The image a bundle shows (render_content: the first of kImageMimes), its data and mime.
std::optional<std::string> bundle_image(const json& data, std::string_view& mime) {
  if (!data.is_object()) return std::nullopt;
  for (const auto m : kImageMimes)
    if (auto d = mime_text(data, m)) {
      mime = m;
      return d;
    }
  return std::nullopt;
}

Piece data_piece(std::string tag, const json& data) {
  Piece p{std::move(tag), {}, {}};
  if (!data.is_object()) return p;
  const std::optional<std::string> plain = mime_text(data, "text/plain");
  if (plain && !blank(*plain) && !is_default_repr(*plain)) {
    p.text = strip_ansi(*plain);
    return p;
  }
  for (const auto mime : kRichMimes)
    if (auto text = mime_text(data, mime)) {
      p.mime = mime;
      p.text = mime == "text/html" ? html_to_text(*text) : strip_ansi(*text);
      return p;
    }
  std::string_view image_mime;
  if (plain && !bundle_image(data, image_mime)) p.text = strip_ansi(*plain);  // all there is
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

namespace {

// One place in a reply, in the order of the outputs: a text, an image, or a line of its own (the
// tag before an image, or a note for one that cannot be sent).
struct Item {
  enum class Kind { text, image, line };
  Kind kind = Kind::text;
  Piece piece;             // text: the output's text; line: the line (in `text`)
  std::size_t out = 0;     // the output it came from (a merged stream run: the last)
  bool stream = false;     // text of a stream run: cleaned once the run is complete
  bool dropped = false;    // a repeated image, or the repeated text of its output
  std::string_view mime;   // image: its mime in the bundle; then the mime sent
  std::string data;        // image: its base64, as the bundle has it; then as sent
};

// The outputs as items, texts cleaned and trimmed (some may be left empty); with `images`, an
// image item before the text of each output that has one.
std::vector<Item> layout(const std::vector<CellOutput>& outs, const RenderOptions& opts, bool images) {
  std::vector<Item> items;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    const CellOutput& o = outs[k];
    switch (o.kind) {
      case CellOutput::Kind::stream: {
        std::string name = o.name.empty() ? "stdout" : valid_utf8(o.name);
        std::string text = o.cut ? "[" + std::to_string(o.cut) + " earlier bytes of output were cut]\n" : std::string();
        text += o.text;
        Item* last = items.empty() ? nullptr : &items.back();
        if (last && last->stream && last->out + 1 == k && last->piece.tag == name) {
          last->piece.text += text;
          last->out = k;
        } else {
          Item it;
          it.piece = {std::move(name), {}, std::move(text)};
          it.out = k;
          it.stream = true;
          items.push_back(std::move(it));
        }
        break;
      }
      case CellOutput::Kind::display_data:
      case CellOutput::Kind::execute_result: {
        std::string_view mime;
        if (auto data = images ? bundle_image(o.data, mime) : std::nullopt) {
          Item img;
          img.kind = Item::Kind::image;
          img.out = k;
          img.mime = mime;
          img.data = std::move(*data);
          items.push_back(std::move(img));
        }
        Item it;
        it.piece = data_piece(o.kind == CellOutput::Kind::display_data ? "display_data" : "execute_result", o.data);
        it.out = k;
        items.push_back(std::move(it));
        break;
      }
      case CellOutput::Kind::error: {
        Item it;
        it.piece = error_piece(o, opts);
        it.out = k;
        items.push_back(std::move(it));
        break;
      }
    }
  }
  for (auto& it : items) {
    if (it.kind != Item::Kind::text) continue;
    if (it.stream) it.piece.text = clean_stream(it.piece.text);
    it.piece.text.resize(trim_trailing_space(it.piece.text).size());
  }
  return items;
}

std::string open_tag(const Piece& p) { return "<" + p.tag + (p.mime.empty() ? "" : " mime=\"" + p.mime + "\"") + ">\n"; }

std::string shown(const Piece& p, bool bare) {
  if (bare) return p.text;
  return open_tag(p) + p.text + "\n</" + p.tag + ">";
}

// The texts of a reply, and whether the one text is shown bare.
struct Texts {
  std::vector<Piece*> pieces;
  bool bare = false;
};

Texts texts_of(std::vector<Item>& items) {
  Texts t;
  for (auto& it : items)
    if (it.kind == Item::Kind::text && !it.dropped && !it.piece.text.empty()) t.pieces.push_back(&it.piece);
  t.bare = t.pieces.size() == 1 && t.pieces.front()->tag != "stderr";
  return t;
}

// Cuts texts so that they and `overhead` chars of tags and lines fit in `max` (render_text: an
// equal share each, the shares of short texts left to the long ones).  max 0 = no cap.
void fit_texts(const std::vector<Piece*>& pieces, std::size_t overhead, std::size_t max) {
  if (max == 0 || pieces.empty()) return;
  std::vector<std::pair<std::size_t, Piece*>> sized;
  std::size_t total = 0;
  for (Piece* p : pieces) {
    sized.emplace_back(chars(p->text), p);
    total += sized.back().first;
  }
  std::size_t left = max > overhead ? max - overhead : 0;
  if (total <= left) return;
  std::stable_sort(sized.begin(), sized.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::size_t n = sized.size();
  for (auto& [size, p] : sized) {
    const std::size_t share = left / n--;
    if (size > share) {
      p->text = cap_text(std::move(p->text), std::max<std::size_t>(share, 1));
      size = chars(p->text);
    }
    left -= std::min(left, size);
  }
}

// The chars that tags add to the texts when they are not bare, with the "\n" between items.
std::size_t tag_overhead(const Texts& t) {
  std::size_t n = t.pieces.empty() ? 0 : t.pieces.size() - 1;
  if (!t.bare)
    for (const Piece* p : t.pieces) n += chars(open_tag(*p)) + p->tag.size() + 4;
  return n;
}

std::string without_space(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s)
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t' && c != '\f' && c != '\v') out.push_back(c);
  return out;
}

// HTML as readable text: see html_to_text.
class HtmlText {
 public:
  void visit(const xmlNode* first, int depth);
  std::string finish();

 private:
  void element(const xmlNode* n, int depth);
  void text(std::string_view t);
  void breaks(std::size_t n);  // `out_` ends with n line breaks (unless it is empty)

  std::string out_;
  int pre_ = 0;
  bool space_ = false;         // white space is pending (collapsed to one space)
  std::vector<int> lists_;     // open lists: 0 for <ul>, else the next number of an <ol>
  std::vector<bool> rows_;     // open rows: whether a cell was written
};

bool name_in(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

void HtmlText::visit(const xmlNode* first, int depth) {
  if (depth > kMaxHtmlDepth) return;
  for (const xmlNode* n = first; n; n = n->next) {
    if (n->type == XML_TEXT_NODE || n->type == XML_CDATA_SECTION_NODE) {
      if (n->content) text(reinterpret_cast<const char*>(n->content));
    } else if (n->type == XML_ELEMENT_NODE) {
      element(n, depth);
    }
  }
}

void HtmlText::element(const xmlNode* n, int depth) {
  const std::string_view name = n->name ? reinterpret_cast<const char*>(n->name) : "";
  if (name_in(name, {"script", "style", "head", "title", "template", "noscript"})) return;
  if (name == "br") {
    out_ += '\n';
    space_ = false;
    return;
  }
  if (name == "hr") {
    breaks(1);
    out_ += "---";
    breaks(1);
    return;
  }
  if (name == "img") {
    // The attribute's text nodes, read in place (the HTML parser has put its entities in them).
    for (const xmlAttr* a = n->properties; a; a = a->next) {
      if (!a->name || std::string_view(reinterpret_cast<const char*>(a->name)) != "alt") continue;
      std::string alt;
      for (const xmlNode* t = a->children; t; t = t->next)
        if (t->type == XML_TEXT_NODE && t->content) alt += reinterpret_cast<const char*>(t->content);
      if (!blank(alt)) text("[" + alt + "]");
      break;
    }
    return;
  }
  const bool paragraph = name_in(name, {"p", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "dl", "table", "pre",
                                        "blockquote", "figure"});
  const bool line = paragraph || name_in(name, {"div", "li", "tr", "dt", "dd", "section", "article", "header",
                                                "footer", "nav", "aside", "main", "caption", "thead", "tbody", "tfoot",
                                                "form", "details", "summary", "address", "fieldset", "legend",
                                                "figcaption", "body", "html"});
  if (line) breaks(paragraph && lists_.empty() ? 2 : 1);
  if (name == "li") {
    out_ += std::string(2 * (lists_.empty() ? 0 : lists_.size() - 1), ' ');
    if (!lists_.empty() && lists_.back() > 0) out_ += std::to_string(lists_.back()++) + ". ";
    else out_ += "- ";
  } else if ((name == "td" || name == "th") && !rows_.empty()) {
    if (rows_.back()) out_ += " | ";
    rows_.back() = true;
    space_ = false;
  }
  if (name == "ul" || name == "ol") lists_.push_back(name == "ol" ? 1 : 0);
  if (name == "tr") rows_.push_back(false);
  if (name == "pre") ++pre_;
  visit(n->children, depth + 1);
  if (name == "pre") --pre_;
  if (name == "tr") rows_.pop_back();
  if (name == "ul" || name == "ol") lists_.pop_back();
  if (line) breaks(paragraph && lists_.empty() ? 2 : 1);
}

void HtmlText::text(std::string_view t) {
  if (pre_ > 0) {
    out_.append(t);
    space_ = false;
    return;
  }
  for (char c : t) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f') {
      space_ = true;
      continue;
    }
    if (space_ && !out_.empty() && out_.back() != '\n' && out_.back() != ' ') out_ += ' ';
    space_ = false;
    out_ += c;
  }
}

void HtmlText::breaks(std::size_t n) {
  space_ = false;
  while (!out_.empty() && out_.back() == ' ') out_.pop_back();
  if (out_.empty()) return;
  std::size_t have = 0;
  while (have < out_.size() && out_[out_.size() - 1 - have] == '\n') ++have;
  if (have < n) out_.append(n - have, '\n');
}

std::string HtmlText::finish() {
  // Lines without trailing blanks, at most one empty line in a row, none at either end.
  std::string out;
  out.reserve(out_.size());
  std::size_t empty = 0;
  std::size_t i = 0;
  while (i <= out_.size()) {
    std::size_t nl = out_.find('\n', i);
    if (nl == std::string::npos) nl = out_.size();
    const std::string_view line = trim_trailing_space(std::string_view(out_).substr(i, nl - i));
    if (line.empty()) {
      ++empty;
    } else {
      if (!out.empty()) out.append(empty ? "\n\n" : "\n");
      out.append(line);
      empty = 0;
    }
    i = nl + 1;
  }
  return out;
}

// libxml2, opened when the first HTML output comes and not at start: with the ICU, zlib and
// liblzma it brings, loading it was about 1 ms of kgate-mcp's start and 0.8 MB of its memory
// (bench/README.md).  Its package stays a dependency (cmake/Package.cmake).
struct LibXml {
  void* handle = nullptr;
  void (*init_parser)() = nullptr;
  htmlDocPtr (*read_memory)(const char*, int, const char*, const char*, int) = nullptr;
  void (*free_doc)(xmlDocPtr) = nullptr;
  std::string error;  // why it could not be opened; "" when it was
};

LibXml open_libxml(const char* soname) {
  LibXml x;
  x.handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!x.handle) {
    const char* e = dlerror();
    x.error = e ? e : std::string(soname) + ": cannot be opened";
    return x;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(x.handle, name));
    if (!fn && x.error.empty()) x.error = std::string(soname) + " has no " + name;
  };
  sym(x.init_parser, "xmlInitParser");
  sym(x.read_memory, "htmlReadMemory");
  sym(x.free_doc, "xmlFreeDoc");
  if (!x.error.empty()) {
    dlclose(x.handle);
    x.handle = nullptr;
  }
  return x;
}

const LibXml& libxml() {
  static const LibXml x = [] {
    LibXml l = open_libxml(kLibXmlSoname);
    if (l.error.empty()) l.init_parser();
    return l;
  }();
  return x;
}

}  // namespace

std::string libxml_error(const char* soname) {
  LibXml x = open_libxml(soname);
  if (x.handle) dlclose(x.handle);
  return x.error;
}

std::string html_to_text(std::string_view html) {
  const LibXml& xml = libxml();
  std::size_t cut = std::min(html.size(), kMaxHtmlBytes);
  while (cut < html.size() && cut > 0 && continuation(html[cut])) --cut;  // not inside a character
  const std::string src = valid_utf8(html.substr(0, cut));
  std::string rest;
  if (cut < html.size()) rest = "[… " + std::to_string(html.size() - cut) + " more bytes of HTML not shown …]";
  std::string text;
  if (!xml.error.empty()) {
    // Without libxml2 the HTML itself, which a model can read too, and why.
    text = "[HTML shown as it is: " + xml.error + "]\n" + src;
  } else if (!blank(src)) {
    htmlDocPtr doc = xml.read_memory(src.data(), int(src.size()), nullptr, "UTF-8",
                                     HTML_PARSE_RECOVER | HTML_PARSE_NOERROR | HTML_PARSE_NOWARNING | HTML_PARSE_NONET);
    if (doc) {
      HtmlText walker;
      walker.visit(doc->children, 0);
      xml.free_doc(doc);
      text = walker.finish();
    }
  }
  if (!rest.empty()) text += (text.empty() ? "" : "\n") + rest;
  return valid_utf8(text);
}

bool is_default_repr(std::string_view text_plain) {
  const auto start = text_plain.find_first_not_of(" \t\r\n");
  if (start == std::string_view::npos) return false;
  const std::string_view t = trim_trailing_space(text_plain.substr(start));
  if (t.size() > 512) return false;
  static const std::regex kDefault(R"(<[A-Za-z_][A-Za-z0-9_.]* object( at 0x[0-9A-Fa-f]+)?>)");
  return std::regex_match(t.begin(), t.end(), kDefault);
}

std::string render_text(const std::vector<CellOutput>& outs, const RenderOptions& opts) {
  std::vector<Item> items = layout(outs, opts, false);
  const Texts t = texts_of(items);
  fit_texts(t.pieces, tag_overhead(t), opts.max_text);
  std::string text;
  for (const Piece* p : t.pieces) {
    if (!text.empty()) text.push_back('\n');
    text += shown(*p, t.bare);
  }
  return text;
}

json render_content(const std::vector<CellOutput>& outs, const RenderOptions& opts) {
  std::vector<Item> items = layout(outs, opts, true);
  // The images: each sent once, fitted, at most max_images; the others become lines.
  std::map<std::string, std::string> seen;  // an image's data (no white space) -> its output's text
  std::size_t images = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    Item& it = items[i];
    if (it.kind != Item::Kind::image) continue;
    Item* own_text = i + 1 < items.size() && items[i + 1].out == it.out && items[i + 1].kind == Item::Kind::text
                         ? &items[i + 1] : nullptr;
    std::string key = without_space(it.data);
    if (const auto dup = seen.find(key); dup != seen.end()) {
      it.dropped = true;
      if (own_text && own_text->piece.text == dup->second) own_text->dropped = true;
      continue;
    }
    seen.emplace(std::move(key), own_text ? own_text->piece.text : std::string());
    auto unavailable = [&](const std::string& why) {
      it.kind = Item::Kind::line;
      it.piece.text = "<media-unavailable mime=\"" + std::string(it.mime) + "\": " + valid_utf8(why) + ">";
      it.data.clear();
    };
    if (images >= opts.max_images) {
      unavailable("over the limit of " + std::to_string(opts.max_images) + " images in one reply");
      continue;
    }
    FittedImage img = fit_image(it.data, it.mime, opts.max_pixels);
    if (!img.ok) {
      unavailable(img.error);
      continue;
    }
    ++images;
    it.piece.text = "<media id=\"" + media_id(img.base64) + "\" type=\"output\" mime=\"" + img.mime + "\">";
    it.data = std::move(img.base64);
    it.piece.mime = img.mime;
  }

  const Texts t = texts_of(items);
  std::size_t overhead = tag_overhead(t);
  for (const auto& it : items)
    if (it.kind != Item::Kind::text && !it.dropped) overhead += chars(it.piece.text) + 1;
  fit_texts(t.pieces, overhead, opts.max_text);

  json blocks = json::array();
  std::string text;
  auto add = [&](const std::string& line) {
    if (!text.empty()) text.push_back('\n');
    text += line;
  };
  for (auto& it : items) {
    if (it.dropped) continue;
    switch (it.kind) {
      case Item::Kind::text:
        if (!it.piece.text.empty()) add(shown(it.piece, t.bare));
        break;
      case Item::Kind::line: add(it.piece.text); break;
      case Item::Kind::image:
        add(it.piece.text);
        blocks.push_back(text_block(std::move(text)));
        text.clear();
        blocks.push_back({{"type", "image"}, {"data", std::move(it.data)}, {"mimeType", it.piece.mime}});
        break;
    }
  }
  if (!text.empty()) blocks.push_back(text_block(std::move(text)));
  return blocks;
}

}  // namespace kgate::mcp
