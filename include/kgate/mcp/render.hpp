// A cell's outputs rendered for a model: concise text, and MCP content blocks with images.
//
// The rules start from clikernel's rendering contract (reference/mcp.md §1.5): streams cleaned
// as a terminal would show them, one mime per output, tags only when there are several outputs,
// tracebacks capped per line with the exception line whole, and the total capped under Claude
// Code's limit (docs/dev/kernel-lifecycle.md.7).  Unlike clikernel, outputs keep the order the kernel sent them in (stdout,
// stderr and display_data interleaved, images in place), text/plain is preferred unless it is
// only a default `<... object>` repr, and every text emitted is valid UTF-8 (kgate/utf8.hpp's
// valid_utf8: ill-formed bytes become U+FFFD).  Pure functions:
// safe to call from any thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kgate/mcp/client.hpp"
#include "kgate/jupyter/wire.hpp"

namespace kgate::mcp {

// CellOutput, output_from_iopub and outputs_from_record: kgate/client/outputs.hpp.

struct RenderOptions {
  std::size_t traceback_line = 180;    // chars per traceback line (clikernel's MAXLEN); 0 = no cap
  std::size_t max_text = 40000;        // chars of text in all (Claude Code files away > 50,000)
  std::size_t max_pixels = 768 * 768;  // width * height of each image; 0 = no cap
  std::size_t max_images = 10;         // images per reply (each ~800 tokens at the cap; Claude Code
                                       // allows 25,000 tokens per result); the rest become notes
};

// HTML as readable text (libxml2's HTML parser, which recovers from any input): the text nodes
// with entities decoded and white space collapsed (kept inside <pre>), a line break at each
// block element (<p>, <div>, <br>, <li>, <tr>, headings ...) and a blank line around
// paragraphs, headings, lists, tables and <pre>; list items start "- " (<ul>) or "N. " (<ol>),
// table cells are joined by " | ", an <img> gives its alt text in brackets, and <script>,
// <style>, <head> and comments give nothing.  Over 2 MiB of HTML, the rest is not read and a
// last line says how much.
// libxml2 is opened (dlopen) at the first call, not at kgate-mcp's start; when it cannot be,
// the text is a line saying why and then the HTML as it is.
std::string html_to_text(std::string_view html);

// The library html_to_text opens, and "" when `soname` opens as it would, else why not
// (dlerror's words, or the function it lacks).
inline constexpr const char* kLibXmlSoname = "libxml2.so.2";
std::string libxml_error(const char* soname = kLibXmlSoname);

// Whether a text/plain is only Python's default repr, `<module.Class object>` or
// `<module.Class object at 0x7f...>`, as IPython's HTML, Markdown and Image objects have.
bool is_default_repr(std::string_view text_plain);

// A stream as a terminal would leave it: alternate-screen sessions (ESC[?1049h ... ESC[?1049l,
// also ?47 and ?1047) dropped with what they drew, one never left dropping the rest; ANSI
// escapes stripped; "\r\n" -> "\n"; per line only the text after the last '\r' (a trailing '\r'
// overwrites nothing); each '\b' erases the character before it on its line.
std::string clean_stream(std::string_view s);

// The traceback joined by "\n" with ANSI escapes stripped.  In every chunk but the last, a line
// over `line_cap` chars is kept whole if it starts (after leading blanks) with "File " or
// "Cell " (the frame's location), dropped if it is only carets, tildes and blanks (an anchor
// line under a cut source line), and otherwise cut to `line_cap` chars + "…".  The last chunk,
// the exception line, is never cut.  line_cap 0 = no cap.
std::string cap_traceback(const std::vector<std::string>& tb, std::size_t line_cap);

// The concise text of a cell's outputs, in the order the kernel sent them.  Each output gives
// one text:
//   - streams: a run of consecutive outputs of one stream name is one text, concatenated, then
//     clean_stream; a stream with `cut` starts with a line saying how many bytes were cut;
//   - execute_result / display_data: text/plain, unless it is blank or is_default_repr; else the
//     first of text/markdown (as is), text/html (html_to_text), text/latex,
//     application/javascript; else the default repr, unless the bundle has an image (which
//     says more); ANSI stripped;
//   - error: cap_traceback (or "ename: evalue" when there is no traceback).
// Trailing white space is trimmed, and texts left blank are dropped.  One text, other than
// stderr -> it, bare.  Several (or stderr) -> each as "<tag>\n...\n</tag>", joined by "\n";
// tag = the stream name, execute_result, display_data or error, and a mime other than text/plain
// adds mime="...".  Images are left out.
// Over max_text chars (code points) in all, texts are cut in their middle, the largest first:
// each text gets an equal share of the budget (max_text less the tags), a text under its share
// keeps all of it and leaves the rest to the others.  A cut text keeps about a fifth of its share
// from its head and the rest from its tail, snapped to line ends nearby, and a line at the cut
// says how many chars were cut there and of how many.  The result is at most max_text chars (for
// shares over 200: the line at the cut takes up to 200).
std::string render_text(const std::vector<CellOutput>& outs, const RenderOptions& opts = {});

// The MCP tools/call "content" array: the texts of render_text, with each image in its place.
// An output with an image (at most one per output: the first of image/jpeg, image/png,
// image/webp) gives the text tag
//   <media id="1a2b3c4d" type="output" mime="image/png">
// (id = the first 8 hex digits of the SHA-256 of the image bytes sent), then
// {"type":"image","data":<base64>,"mimeType":...} fitted by fit_image, then the output's text.
// Texts between images are joined ("\n") into one text block, which ends with the tag of the
// image after it.  No text block is empty: with no text after the last image, the image is the
// last block; with no output at all the array is empty.  The same image data twice in one reply
// (matplotlib shows a figure that is the cell's value as its execute_result and again as a
// display_data) is sent once, and the second output's text is dropped too when it is the same.
// An image that cannot be returned (bad base64, not an image, WebP, over max_images) is a line
// in its place, <media-unavailable mime="image/png": why>, and never fails the call.
json render_content(const std::vector<CellOutput>& outs, const RenderOptions& opts = {});

}  // namespace kgate::mcp
