// A cell's outputs rendered for a model: concise text, and MCP content blocks with images.
//
// The rules follow clikernel's rendering contract (reference/mcp.md §1.5): streams cleaned as a
// terminal would show them, one mime per output, tags only when there are several outputs,
// tracebacks capped per line with the exception line whole, and the total capped under Claude
// Code's limit (§4.7).  Pure functions: safe to call from any thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kgate/wire.hpp"

namespace kgate::mcp {

// One output of a cell, as its iopub message carried it.
struct CellOutput {
  enum class Kind { stream, execute_result, display_data, error };
  Kind kind = Kind::stream;
  std::string name;                    // stream: "stdout" / "stderr"
  std::string text;                    // stream text
  json data = json::object();          // execute_result / display_data: the mime bundle
  std::string ename, evalue;           // error
  std::vector<std::string> traceback;  // error
};

// From an iopub message's msg_type and content; nullopt for types that are not outputs (status,
// execute_input, clear_output, update_display_data, comms ...).  Fields of the wrong type are
// left empty rather than refused.
std::optional<CellOutput> output_from_iopub(std::string_view msg_type, const json& content);

// From a kgate job record (GET /api/kgate/jobs/{job}, README "Session records"):
//   "output" (stdout and stderr interleaved: one stream named "stdout", headed by a line saying
//            how many bytes "output_cut" dropped from its front),
//   "result" (an execute_result with that text/plain, likewise headed when "result_cut"),
//   "error"  ({ename, evalue, traceback} or null: an error output),
//   "note"   (why the job ended as it did, when the protocol does not say: a "stderr" stream).
// Missing or null fields give no output.
std::vector<CellOutput> outputs_from_record(const json& job);

struct RenderOptions {
  std::size_t traceback_line = 180;    // chars per traceback line (clikernel's MAXLEN); 0 = no cap
  std::size_t max_text = 40000;        // chars of text in all (Claude Code files away > 50,000)
  std::size_t max_pixels = 768 * 768;  // width * height of each image; 0 = no cap
  std::size_t max_images = 10;         // images per reply (each ~800 tokens at the cap; Claude Code
                                       // allows 25,000 tokens per result); the rest become notes
};

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

// The concise text of a cell's outputs (clikernel's render_text).  Each output gives one text:
//   - streams: all text of one name concatenated, then clean_stream;
//   - execute_result / display_data: the first of text/markdown, text/html,
//     application/javascript, text/latex, text/plain in the bundle (ANSI stripped);
//   - error: cap_traceback (or "ename: evalue" when there is no traceback).
// Trailing newlines are trimmed, and texts left blank are dropped.  Order: display_data in
// arrival order, then stdout, then stderr (then any other stream name), then errors and
// execute_results in arrival order.  One text -> it, bare.  Several -> each as
// "<tag>\n...\n</tag>", joined by "\n"; tag = the stream name, execute_result, display_data or
// error, and a mime other than text/plain adds mime="...".
// Over max_text chars (code points), the middle is cut: about a fifth of the budget is kept from
// the head and the rest from the tail, snapped to line ends nearby, and a line at the cut says
// how many chars were cut there and of how many.  The result is at most max_text chars (for a
// max_text over 200: the line at the cut takes up to 200).
std::string render_text(const std::vector<CellOutput>& outs, const RenderOptions& opts = {});

// The MCP tools/call "content" array.  Without images: [{"type":"text","text":render_text}].
// With images: for each output with one (at most one per output: the first of image/jpeg,
// image/png, image/webp), a text block with its tag
//   <media id="1a2b3c4d" type="output" mime="image/png">
// (id = the first 8 hex digits of the SHA-256 of the image bytes sent), then
// {"type":"image","data":<base64>,"mimeType":...} fitted by fit_image; and last the rendered
// text as a text block.  An image that cannot be returned (bad base64, not an image, WebP, over
// max_images) adds a line after the text, <media-unavailable mime="image/png": why>, and
// never fails the call.
json render_content(const std::vector<CellOutput>& outs, const RenderOptions& opts = {});

}  // namespace kgate::mcp
