// Unit tests for the translator's output rendering: stream cleanup, traceback capping, the text
// of a cell's outputs and its cap, MCP content with images (made here with stb_image_write),
// base64, and outputs read from iopub messages and from real job records (kgate's job_json).
#include <gtest/gtest.h>

#include <openssl/evp.h>
#include <stb_image.h>
#include <stb_image_write.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kgate/mcp/images.hpp"
#include "kgate/records/jobs.hpp"
#include "kgate/jupyter/utf8.hpp"
#include "kgate/mcp/render.hpp"
#include "support.hpp"

using namespace kgate;
using namespace kgate::mcp;

namespace {

// --- helpers -----------------------------------------------------------------------------

CellOutput stream(std::string name, std::string text) {
  CellOutput o;
  o.kind = CellOutput::Kind::stream;
  o.name = std::move(name);
  o.text = std::move(text);
  return o;
}

CellOutput result(json data) {
  CellOutput o;
  o.kind = CellOutput::Kind::execute_result;
  o.data = std::move(data);
  return o;
}

CellOutput display(json data) {
  CellOutput o;
  o.kind = CellOutput::Kind::display_data;
  o.data = std::move(data);
  return o;
}

CellOutput error_out(std::string ename, std::string evalue, std::vector<std::string> tb) {
  CellOutput o;
  o.kind = CellOutput::Kind::error;
  o.ename = std::move(ename);
  o.evalue = std::move(evalue);
  o.traceback = std::move(tb);
  return o;
}

std::size_t utf8_chars(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

void append_bytes(void* ctx, void* data, int size) {
  static_cast<std::string*>(ctx)->append(static_cast<const char*>(data), std::size_t(size));
}

// Pixels with structure (gradients and a diagonal), so an encoder cannot collapse them.
std::vector<unsigned char> test_pixels(int w, int h, int channels) {
  std::vector<unsigned char> px(std::size_t(w) * std::size_t(h) * std::size_t(channels));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      unsigned char* p = &px[(std::size_t(y) * std::size_t(w) + std::size_t(x)) * std::size_t(channels)];
      const unsigned char v[4] = {static_cast<unsigned char>(x * 255 / w), static_cast<unsigned char>(y * 255 / h),
                                  static_cast<unsigned char>(std::abs(x - y) < 8 ? 255 : 40),
                                  static_cast<unsigned char>(128 + (x + y) % 128)};
      for (int c = 0; c < channels; ++c) p[c] = v[c];
    }
  return px;
}

std::string make_png(int w, int h, int channels = 3) {
  auto px = test_pixels(w, h, channels);
  std::string out;
  EXPECT_TRUE(stbi_write_png_to_func(&append_bytes, &out, w, h, channels, px.data(), 0));
  return out;
}

std::string make_jpeg(int w, int h, int quality = 90) {
  auto px = test_pixels(w, h, 3);
  std::string out;
  EXPECT_TRUE(stbi_write_jpg_to_func(&append_bytes, &out, w, h, 3, px.data(), quality));
  return out;
}

struct Decoded {
  bool ok = false;
  int w = 0, h = 0, channels = 0;
};

Decoded decode(std::string_view bytes) {
  Decoded d;
  unsigned char* px = stbi_load_from_memory(reinterpret_cast<const unsigned char*>(bytes.data()), int(bytes.size()),
                                            &d.w, &d.h, &d.channels, 0);
  d.ok = px != nullptr;
  stbi_image_free(px);
  return d;
}

std::string sha256_hex8(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  char hex[9];
  std::snprintf(hex, sizeof hex, "%02x%02x%02x%02x", md[0], md[1], md[2], md[3]);
  return hex;
}

// Base64 with a line break every 76 chars, as some kernels send images.
std::string wrapped(std::string_view b64) {
  std::string out;
  for (std::size_t i = 0; i < b64.size(); i += 76) out.append(b64.substr(i, 76)).append("\n");
  return out;
}

json load_json(const std::string& name) {
  std::ifstream in(kgate::test::data_dir() / "render" / name);
  EXPECT_TRUE(in.good()) << name;
  return json::parse(in);
}

// The image blocks of a content array.
std::vector<json> images_of(const json& content) {
  std::vector<json> out;
  for (const auto& b : content)
    if (b["type"] == "image") out.push_back(b);
  return out;
}

}  // namespace

// --- clean_stream ------------------------------------------------------------------------

TEST(CleanStream, StripsAnsiEscapes) {
  EXPECT_EQ(clean_stream("\x1b[31mred\x1b[0m plain \x1b[1;38;5;208mbold\x1b[39;22m"), "red plain bold");
  // An OSC 8 hyperlink and a charset designation.
  EXPECT_EQ(clean_stream("see \x1b]8;;https://example.org\x1b\\the docs\x1b]8;;\x1b\\ now"), "see the docs now");
  EXPECT_EQ(clean_stream("\x1b(Bplain\x1b]0;title\a"), "plain");
  EXPECT_EQ(clean_stream("cut at the end\x1b[3"), "cut at the end");
  // Malformed escapes never split a UTF-8 character (the text must stay valid for JSON).
  EXPECT_EQ(clean_stream("\x1b(é\x1b[ü\x1bñ"), "éüñ");
  EXPECT_EQ(clean_stream("\x1b]0;unterminated title\nnext line"), "\nnext line");
  EXPECT_NO_THROW(json(clean_stream("\x1b(é\x1b[?ü")).dump());
}

TEST(CleanStream, CarriageReturnsKeepTheLastRewrite) {
  EXPECT_EQ(clean_stream("a\r\nb\r\n"), "a\nb\n");
  EXPECT_EQ(clean_stream("10%\r20%\r100%\ndone\n"), "100%\ndone\n");
  EXPECT_EQ(clean_stream("abc\r"), "abc");  // a trailing \r overwrites nothing
  EXPECT_EQ(clean_stream("loading\rok\r\n"), "ok\n");
  // tqdm writes "\r" + the bar each update; only the last one stays.
  EXPECT_EQ(clean_stream("\r  0%|          | 0/3\r 33%|###3      | 1/3\r100%|##########| 3/3\n"),
            "100%|##########| 3/3\n");
}

TEST(CleanStream, BackspacesEraseWithinTheLine) {
  EXPECT_EQ(clean_stream("abc\b\bX"), "aX");
  EXPECT_EQ(clean_stream("\b\bab"), "ab");
  EXPECT_EQ(clean_stream("ab\n\b\b\bc"), "ab\nc");
  EXPECT_EQ(clean_stream("né\bx"), "nx");  // a whole UTF-8 character
  EXPECT_EQ(clean_stream("spin|\b/\b-\b\\\bdone"), "spindone");
}

TEST(CleanStream, AlternateScreenIsDropped) {
  EXPECT_EQ(clean_stream("before\n\x1b[?1049h\x1b[2J\x1b[Hframe 1\x1b[Hframe 2\x1b[?1049lafter\n"), "before\nafter\n");
  EXPECT_EQ(clean_stream("a\x1b[?1049hone\x1b[?1049lb\x1b[?47htwo\x1b[?47lc"), "abc");
  EXPECT_EQ(clean_stream("kept\n\x1b[?1049hnever left"), "kept\n");
  // Other private modes are ordinary escapes.
  EXPECT_EQ(clean_stream("\x1b[?25lhidden cursor\x1b[?25h"), "hidden cursor");
}

// --- cap_traceback -----------------------------------------------------------------------

TEST(CapTraceback, CutsLongLinesKeepsFramesAndTheExceptionLine) {
  const std::string long_code = "    x = compute(" + std::string(300, 'a') + ")";
  const std::string file_line = "  File \"/srv/" + std::string(250, 'p') + "/mod.py\", line 12, in f";
  const std::string cell_line = "Cell In[3], line 4, in g(" + std::string(200, 'b') + ")";
  const std::string carets = "    " + std::string(200, '^');
  const std::string exc = "ValueError: " + std::string(1000, 'v');
  std::vector<std::string> tb = {"Traceback (most recent call last):\n" + file_line + "\n" + long_code + "\n" + carets +
                                     "\n    ~~~^~~~\n",
                                 cell_line, exc};
  const std::string expected = "Traceback (most recent call last):\n" + file_line + "\n" + long_code.substr(0, 180) +
                               "…\n    ~~~^~~~\n\n" + cell_line + "\n" + exc;
  EXPECT_EQ(cap_traceback(tb, 180), expected);
  // No cap: joined as is.
  EXPECT_EQ(cap_traceback(tb, 0), tb[0] + "\n" + tb[1] + "\n" + tb[2]);
  EXPECT_EQ(cap_traceback({}, 180), "");
}

TEST(CapTraceback, CountsCharactersNotBytes) {
  std::string cyr;
  for (int i = 0; i < 200; ++i) cyr += "ж";  // 2 bytes each
  const std::string out = cap_traceback({cyr, "E: x"}, 180);
  const std::string first = out.substr(0, out.find('\n'));
  EXPECT_EQ(utf8_chars(first), 181u);
  EXPECT_TRUE(first.ends_with("…"));
  // Exactly at the cap: kept.
  std::string at_cap;
  for (int i = 0; i < 180; ++i) at_cap += "ж";
  EXPECT_EQ(cap_traceback({at_cap, "E"}, 180), at_cap + "\nE");
}

TEST(CapTraceback, RealIpykernelTraceback) {
  const json content = load_json("ipykernel_traceback.json");
  const auto out = output_from_iopub("error", content);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->traceback.size(), 5u);
  const std::string text = cap_traceback(out->traceback, 180);
  EXPECT_EQ(text.find('\x1b'), std::string::npos);

  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  EXPECT_EQ(lines.front(), std::string(75, '-'));
  EXPECT_TRUE(lines[1].starts_with("ValueError") && lines[1].ends_with("Traceback (most recent call last)"));
  EXPECT_EQ(lines[2], "Cell In[7], line 3");
  EXPECT_EQ(lines[3], "      1 import pandas as pd");
  // The long source line of the cell is cut; the long File line of the library frame is whole.
  EXPECT_TRUE(lines[5].starts_with("----> 3 summary = frame.groupby(["));
  EXPECT_TRUE(lines[5].ends_with("…"));
  EXPECT_EQ(utf8_chars(lines[5]), 181u);
  EXPECT_EQ(lines[6], "");
  EXPECT_TRUE(lines[7].starts_with("File /home/analyst/projects/"));
  EXPECT_TRUE(lines[7].ends_with("in DataFrame.groupby(self, by, axis, level, as_index, sort, group_keys, observed, dropna)"));
  EXPECT_GT(lines[7].size(), 180u);
  // The exception line: whole, as the kernel sent it.
  const std::string evalue = content["evalue"];
  EXPECT_GT(evalue.size(), 700u);
  EXPECT_EQ(lines.back(), "ValueError: " + evalue);
  EXPECT_TRUE(text.ends_with("ValueError: " + evalue));
}

// --- render_text -------------------------------------------------------------------------

TEST(RenderText, OneOutputIsBare) {
  EXPECT_EQ(render_text({result({{"text/plain", "2"}})}), "2");
  EXPECT_EQ(render_text({stream("stdout", "hello\n")}), "hello");
  EXPECT_EQ(render_text({stream("stdout", "a"), stream("stdout", "b\n")}), "ab");
  EXPECT_EQ(render_text(std::vector<CellOutput>{}), "");
  // Empty outputs do not count: an image-only display has no text.
  EXPECT_EQ(render_text({display({{"image/png", "iVBO"}}), stream("stdout", ""), result({{"text/plain", "7"}})}), "7");
}

TEST(RenderText, SeveralOutputsAreTaggedInTheOrderTheKernelSentThem) {
  const std::vector<CellOutput> outs = {stream("stdout", "a\n"), stream("stderr", "careful\n"), stream("stdout", "b\n"),
                                        result({{"text/plain", "3"}})};
  EXPECT_EQ(render_text(outs),
            "<stdout>\na\n</stdout>\n<stderr>\ncareful\n</stderr>\n<stdout>\nb\n</stdout>\n<execute_result>\n3\n</execute_result>");
  const std::vector<CellOutput> mixed = {stream("stderr", "w"),
                                         error_out("ZeroDivisionError", "division by zero", {"ZeroDivisionError: division by zero"}),
                                         stream("stdout", "o"), display({{"text/plain", "<Figure>"}})};
  EXPECT_EQ(render_text(mixed),
            "<stderr>\nw\n</stderr>\n<error>\nZeroDivisionError: division by zero\n</error>\n<stdout>\no\n</stdout>\n"
            "<display_data>\n<Figure>\n</display_data>");
  // print, stderr, display, print: each where it came.
  EXPECT_EQ(render_text({stream("stdout", "one\n"), stream("stderr", "two\n"), display({{"text/plain", "'three'"}}),
                         stream("stdout", "four\n")}),
            "<stdout>\none\n</stdout>\n<stderr>\ntwo\n</stderr>\n<display_data>\n'three'\n</display_data>\n"
            "<stdout>\nfour\n</stdout>");
}

TEST(RenderText, ConsecutiveMessagesOfAStreamAreOneText) {
  // A run of one stream is cleaned as one text: a progress bar's '\r' spans its messages.
  EXPECT_EQ(render_text({stream("stdout", "10%"), stream("stdout", "\r50%"), stream("stdout", "\r100%\n"),
                         stream("stderr", "done\n")}),
            "<stdout>\n100%\n</stdout>\n<stderr>\ndone\n</stderr>");
  // An output between two runs keeps them apart, even when it shows no text.
  EXPECT_EQ(render_text({stream("stdout", "a"), display({{"image/png", "iVBO"}}), stream("stdout", "b")}),
            "<stdout>\na\n</stdout>\n<stdout>\nb\n</stdout>");
}

TEST(RenderText, StderrIsNeverBare) {
  EXPECT_EQ(render_text({stream("stderr", "UserWarning: careful\n")}), "<stderr>\nUserWarning: careful\n</stderr>");
  EXPECT_EQ(render_text({stream("stdout", "out\n")}), "out");
  EXPECT_EQ(render_text({error_out("E", "x", {})}), "E: x");
}

TEST(RenderText, MimePreference) {
  // text/plain when it says something: a DataFrame shows its text table.
  const json df = {{"text/html", "<table><tr><td>1</td></tr></table>"}, {"text/plain", "   a\n0  1"}};
  EXPECT_EQ(render_text({result(df)}), "   a\n0  1");
  EXPECT_EQ(render_text({result({{"text/html", "<b>h</b>"}, {"text/markdown", "**m**"}, {"text/plain", "p"}})}), "p");
  EXPECT_EQ(render_text({result({{"text/latex", "$x^2$"}, {"text/plain", "x**2"}})}), "x**2");
  // Only the default repr (display(HTML(...)), Markdown(...)): markdown as is, HTML as text.
  EXPECT_EQ(render_text({display({{"text/plain", "<IPython.core.display.HTML object>"}, {"text/html", "<b>x</b>"}})}), "x");
  EXPECT_EQ(render_text({display({{"text/plain", "<IPython.core.display.Markdown object>"}, {"text/markdown", "# T\n*i*"}})}),
            "# T\n*i*");
  EXPECT_EQ(render_text({result({{"text/plain", "<x.Y object at 0x7f3a2c1d>"}, {"text/html", "<i>h</i>"},
                                 {"text/markdown", "**m**"}})}),
            "**m**");
  EXPECT_EQ(render_text({stream("stdout", "x"), display({{"text/plain", "<IPython.core.display.HTML object>"},
                                                          {"text/html", "<p>a &amp; b</p>"}})}),
            "<stdout>\nx\n</stdout>\n<display_data mime=\"text/html\">\na & b\n</display_data>");
  // A blank text/plain says nothing either.
  EXPECT_EQ(render_text({result({{"text/plain", "  \n"}, {"text/html", "<b>h</b>"}})}), "h");
  // Without text/plain: markdown, html, latex, then javascript.
  EXPECT_EQ(render_text({result({{"application/javascript", "alert(1)"}, {"text/latex", "$x$"}})}), "$x$");
  EXPECT_EQ(render_text({result({{"application/javascript", "alert(1)"}})}), "alert(1)");
  // The default repr and nothing else: it is all there is; beside an image it says nothing.
  EXPECT_EQ(render_text({display({{"text/plain", "<object object at 0x7f00aa>"}})}), "<object object at 0x7f00aa>");
  EXPECT_EQ(render_text({display({{"text/plain", "<IPython.core.display.Image object>"}, {"image/png", "iVBO"}})}), "");
  // nbformat's list-of-lines form, and ANSI in a repr.
  EXPECT_EQ(render_text({display({{"text/plain", json::array({"line 1\n", "\x1b[1mline 2\x1b[0m"})}})}), "line 1\nline 2");
  // A bundle with none of the text mimes shows nothing.
  EXPECT_EQ(render_text({result({{"application/json", {{"a", 1}}}})}), "");
}

TEST(RenderText, DefaultRepr) {
  for (const char* yes : {"<IPython.core.display.HTML object>", "<object object at 0x7f5e3c2b1a90>", "<a_b.C object>\n",
                          " <mod.Klass object at 0xDEADbeef> "})
    EXPECT_TRUE(is_default_repr(yes)) << yes;
  for (const char* no : {"<Figure size 640x480 with 1 Axes>", "<PIL.Image.Image image mode=RGB size=4x4>", "'hello'",
                         "<object object at 0x7f> and more", "<function f at 0x7f00>", "", "<1x object>"})
    EXPECT_FALSE(is_default_repr(no)) << no;
}

TEST(RenderText, ErrorsAreCapped) {
  const std::string long_line = std::string(400, 'x');
  const auto text = render_text({error_out("E", "boom", {long_line, "E: boom"})}, {.traceback_line = 50});
  EXPECT_EQ(text, long_line.substr(0, 50) + "…\nE: boom");
  // No traceback: the name and value.
  EXPECT_EQ(render_text({error_out("KeyboardInterrupt", "", {})}), "KeyboardInterrupt");
  EXPECT_EQ(render_text({error_out("KernelDied", "the kernel died", {})}), "KernelDied: the kernel died");
}

TEST(RenderText, CapKeepsHeadAndTailAndCountsTheCut) {
  // One long line of distinct digits: no line end to snap to, so the numbers are exact.
  std::string text;
  for (int i = 0; text.size() < 50000; ++i) text += std::to_string(i % 10);
  RenderOptions opts;
  opts.max_text = 10000;
  const std::string out = render_text({stream("stdout", text)}, opts);
  // budget = 10000 - 200 reserved for the note; a fifth of it from the head, the rest the tail.
  const std::string expected = text.substr(0, 1960) +
                               "\n[… 40200 chars cut here: above are the first 1960 and below the last 7840 of 50000 chars …]\n" +
                               text.substr(50000 - 7840);
  EXPECT_EQ(out, expected);
  EXPECT_LE(utf8_chars(out), opts.max_text);
  // At the cap exactly: untouched.
  opts.max_text = 50000;
  EXPECT_EQ(render_text({stream("stdout", text)}, opts), text);
}

TEST(RenderText, CapSharesTheBudgetLargestFirst) {
  // Three texts over the cap: the short ones are whole, the long one is cut in its middle, and
  // the whole (tags included) is within the cap.
  std::string big;
  for (int i = 0; big.size() < 30000; ++i) big += std::to_string(i % 10);
  std::string mid(3000, 'm');
  RenderOptions opts;
  opts.max_text = 10000;
  const std::string out = render_text({stream("stdout", "short\n"), stream("stderr", big), display({{"text/plain", mid}})}, opts);
  EXPECT_LE(utf8_chars(out), opts.max_text);
  EXPECT_TRUE(out.starts_with("<stdout>\nshort\n</stdout>\n<stderr>\n" + big.substr(0, 1000))) << out.substr(0, 200);
  EXPECT_NE(out.find(" chars cut here: "), std::string::npos);
  EXPECT_TRUE(out.ends_with("</stderr>\n<display_data>\n" + mid + "\n</display_data>"));
  EXPECT_GT(utf8_chars(out), opts.max_text - 300);  // the budget is used, not wasted
  // Two long texts get about half each.
  const std::string two = render_text({stream("stdout", big), stream("stderr", big)}, opts);
  EXPECT_LE(utf8_chars(two), opts.max_text);
  const auto err = two.find("<stderr>");
  ASSERT_NE(err, std::string::npos);
  EXPECT_NEAR(double(err), double(two.size() - err), 200.0);  // the second gets what the first left
}

TEST(RenderText, CapSnapsToLinesAndCountsCharacters) {
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "строка " + std::to_string(i) + " ééé\n";  // multibyte
  const std::size_t total = utf8_chars(text) - 1;  // the trailing newline is trimmed
  RenderOptions opts;
  opts.max_text = 8000;
  const std::string out = render_text({stream("stdout", text)}, opts);
  EXPECT_LE(utf8_chars(out), opts.max_text);
  const auto open = out.find("[… ");
  ASSERT_NE(open, std::string::npos);
  const std::string head = out.substr(0, open);
  EXPECT_TRUE(head.ends_with("\n"));  // cut at a line end
  EXPECT_EQ(text.substr(0, head.size()), head);
  const auto close = out.find(" …]\n", open);
  ASSERT_NE(close, std::string::npos);
  const std::string tail = out.substr(close + std::string(" …]\n").size());
  EXPECT_TRUE(text.substr(0, text.size() - 1).ends_with(tail));
  EXPECT_TRUE(tail.starts_with("строка "));  // starts at a line start
  std::size_t cut = 0, first = 0, last = 0, of = 0;
  ASSERT_EQ(std::sscanf(out.c_str() + open + std::string("[… ").size(),
                        "%zu chars cut here: above are the first %zu and below the last %zu of %zu", &cut, &first, &last, &of),
            4);
  EXPECT_EQ(of, total);
  EXPECT_EQ(first, utf8_chars(head));
  EXPECT_EQ(last, utf8_chars(tail));
  EXPECT_EQ(cut + first + last, total);
}

// --- render_content ----------------------------------------------------------------------

TEST(RenderContent, TextOnly) {
  const std::vector<CellOutput> outs = {stream("stdout", "hi\n"), result({{"text/plain", "1"}})};
  const json content = render_content(outs);
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0], json({{"type", "text"}, {"text", render_text(outs)}}));
}

TEST(RenderContent, LargePngIsResizedUnderTheCap) {
  const std::string png = make_png(2000, 1500);
  const std::vector<CellOutput> outs = {
      display({{"image/png", base64_encode(png)}, {"text/plain", "<Figure size 2000x1500 with 1 Axes>"}})};
  const json content = render_content(outs);
  ASSERT_EQ(content.size(), 3u);
  const std::string sent_b64 = content[1]["data"];
  const auto sent = base64_decode(sent_b64);
  ASSERT_TRUE(sent);
  EXPECT_EQ(content[0]["type"], "text");
  EXPECT_EQ(content[0]["text"], "<media id=\"" + sha256_hex8(*sent) + "\" type=\"output\" mime=\"image/png\">");
  EXPECT_EQ(content[1]["type"], "image");
  EXPECT_EQ(content[1]["mimeType"], "image/png");
  EXPECT_EQ(content[2], json({{"type", "text"}, {"text", "<Figure size 2000x1500 with 1 Axes>"}}));

  EXPECT_TRUE(sent->starts_with("\x89PNG\r\n\x1a\n"));
  const Decoded d = decode(*sent);
  ASSERT_TRUE(d.ok);
  EXPECT_LE(std::size_t(d.w) * std::size_t(d.h), std::size_t(768 * 768));
  EXPECT_GE(std::size_t(d.w) * std::size_t(d.h), std::size_t(768 * 768 * 99 / 100));  // not needlessly small
  EXPECT_EQ(d.channels, 3);
  EXPECT_LE(std::abs(d.w * 1500 - d.h * 2000), 2000);  // 4:3 within a pixel
  EXPECT_EQ(d.w, 886);
  EXPECT_EQ(d.h, 665);
}

TEST(RenderContent, RgbaPngKeepsItsAlpha) {
  const FittedImage f = fit_image(base64_encode(make_png(1200, 1200, 4)), "image/png", 768 * 768);
  ASSERT_TRUE(f.ok) << f.error;
  EXPECT_EQ(f.width, 768);
  EXPECT_EQ(f.height, 768);
  const Decoded d = decode(*base64_decode(f.base64));
  EXPECT_EQ(d.channels, 4);
  EXPECT_EQ(d.w, 768);
}

TEST(RenderContent, SmallImagePassesThroughByteIdentical) {
  const std::string png = make_png(64, 48);
  const std::string b64 = base64_encode(png);
  json content = render_content({display({{"image/png", b64}})});
  ASSERT_EQ(content.size(), 2u);  // no empty text block after the image
  EXPECT_EQ(content[1]["data"], b64);
  // Line-wrapped base64 comes back unwrapped, the same bytes.
  content = render_content({display({{"image/png", wrapped(b64)}})});
  EXPECT_EQ(content[1]["data"], b64);
  const FittedImage f = fit_image(wrapped(b64), "image/png", 768 * 768);
  ASSERT_TRUE(f.ok);
  EXPECT_EQ(*base64_decode(f.base64), png);
  EXPECT_EQ(f.width, 64);
  EXPECT_EQ(f.height, 48);
}

TEST(RenderContent, JpegIsResizedAsJpegAndPreferred) {
  const std::string jpeg = make_jpeg(1600, 1200);
  // A bundle with both: the JPEG is the one sent (PIL publishes both).
  const json content = render_content(
      {display({{"image/png", base64_encode(make_png(1600, 1200))}, {"image/jpeg", base64_encode(jpeg)}, {"text/plain", "<PIL.Image>"}})});
  const auto imgs = images_of(content);
  ASSERT_EQ(imgs.size(), 1u);
  EXPECT_EQ(imgs[0]["mimeType"], "image/jpeg");
  const auto sent = base64_decode(imgs[0]["data"].get<std::string>());
  ASSERT_TRUE(sent);
  EXPECT_TRUE(sent->starts_with("\xff\xd8\xff"));
  const Decoded d = decode(*sent);
  ASSERT_TRUE(d.ok);
  EXPECT_LE(std::size_t(d.w) * std::size_t(d.h), std::size_t(768 * 768));
  EXPECT_LE(std::abs(d.w * 1200 - d.h * 1600), 1600);
  EXPECT_NE(content[0]["text"].get<std::string>().find("mime=\"image/jpeg\""), std::string::npos);
  EXPECT_EQ(content.back()["text"], "<PIL.Image>");

  // A small JPEG passes through.
  const std::string small = make_jpeg(320, 240);
  const FittedImage f = fit_image(base64_encode(small), "image/jpeg", 768 * 768);
  ASSERT_TRUE(f.ok);
  EXPECT_EQ(f.mime, "image/jpeg");
  EXPECT_EQ(*base64_decode(f.base64), small);
}

TEST(RenderContent, MimeFollowsTheBytes) {
  const FittedImage f = fit_image(base64_encode(make_jpeg(100, 80)), "image/png", 768 * 768);
  ASSERT_TRUE(f.ok);
  EXPECT_EQ(f.mime, "image/jpeg");
}

TEST(RenderContent, BrokenImagesBecomeNotes) {
  const std::string png = make_png(300, 200);
  const std::vector<CellOutput> outs = {
      stream("stdout", "plotting\n"),
      display({{"image/png", "!!! this is not base64 !!!"}, {"text/plain", "<Figure 1>"}}),
      display({{"image/png", base64_encode("hello, not an image at all")}}),
      display({{"image/jpeg", base64_encode(png.substr(0, png.size() / 3))}}),  // truncated
      display({{"image/webp", base64_encode(std::string("RIFF\x10\0\0\0WEBPVP8 ", 16))}}),
  };
  json content;
  ASSERT_NO_THROW(content = render_content(outs));
  EXPECT_TRUE(images_of(content).empty());
  ASSERT_EQ(content.size(), 1u);
  const std::string text = content[0]["text"];
  // Each note in the place of its image.
  EXPECT_TRUE(text.starts_with("<stdout>\nplotting\n</stdout>\n<media-unavailable mime=\"image/png\": the image data is "
                               "not valid base64>\n<display_data>\n<Figure 1>\n</display_data>\n<media-unavailable"))
      << text;
  EXPECT_NE(text.find("<media-unavailable mime=\"image/png\": the image data is not valid base64>"), std::string::npos) << text;
  EXPECT_NE(text.find("<media-unavailable mime=\"image/png\": the data is not a readable image ("), std::string::npos) << text;
  EXPECT_NE(text.find("<media-unavailable mime=\"image/jpeg\": "), std::string::npos) << text;
  EXPECT_NE(text.find("<media-unavailable mime=\"image/webp\": WebP images are not supported"), std::string::npos) << text;
  // One good image beside a broken one still comes through.
  const json mixed = render_content({display({{"image/png", "%%%"}}), display({{"image/png", base64_encode(png)}})});
  EXPECT_EQ(images_of(mixed).size(), 1u);
  EXPECT_TRUE(mixed.front()["text"].get<std::string>().starts_with("<media-unavailable mime=\"image/png\""));
  EXPECT_EQ(mixed.back()["type"], "image");
}

TEST(RenderContent, HugeDimensionsAreRefusedBeforeDecoding) {
  // A 1x1 PNG whose header claims 10000 x 10000 (stb does not check the header's CRC).
  std::string png = make_png(1, 1);
  const std::string dim("\x00\x00\x27\x10", 4);  // 10000
  png.replace(16, 4, dim);
  png.replace(20, 4, dim);
  const FittedImage f = fit_image(base64_encode(png), "image/png", 768 * 768);
  EXPECT_FALSE(f.ok);
  EXPECT_EQ(f.error, "the image is too large to decode (10000x10000)");
}

TEST(RenderContent, ImageCountIsCapped) {
  std::vector<CellOutput> outs;
  for (int i = 0; i < 5; ++i) outs.push_back(display({{"image/png", base64_encode(make_png(16 + i, 16))}}));
  RenderOptions opts;
  opts.max_images = 3;
  const json content = render_content(outs, opts);
  EXPECT_EQ(images_of(content).size(), 3u);
  EXPECT_EQ(content.back()["text"],
            "<media-unavailable mime=\"image/png\": over the limit of 3 images in one reply>\n"
            "<media-unavailable mime=\"image/png\": over the limit of 3 images in one reply>");
}

TEST(RenderContent, ImagesComeInPlaceAmongTheText) {
  const std::string a = base64_encode(make_png(40, 30)), b = base64_encode(make_png(30, 40));
  const json content = render_content({stream("stdout", "before\n"), display({{"image/png", a}, {"text/plain", "<Figure A>"}}),
                                       stream("stderr", "between\n"), display({{"image/png", b}}), stream("stdout", "after\n")});
  ASSERT_EQ(content.size(), 5u) << content.dump();
  const std::string tag_a = "<media id=\"" + sha256_hex8(*base64_decode(a)) + "\" type=\"output\" mime=\"image/png\">";
  const std::string tag_b = "<media id=\"" + sha256_hex8(*base64_decode(b)) + "\" type=\"output\" mime=\"image/png\">";
  EXPECT_EQ(content[0], json({{"type", "text"}, {"text", "<stdout>\nbefore\n</stdout>\n" + tag_a}}));
  EXPECT_EQ(content[1]["data"], a);
  EXPECT_EQ(content[2], json({{"type", "text"},
                              {"text", "<display_data>\n<Figure A>\n</display_data>\n<stderr>\nbetween\n</stderr>\n" + tag_b}}));
  EXPECT_EQ(content[3]["data"], b);
  EXPECT_EQ(content[4], json({{"type", "text"}, {"text", "<stdout>\nafter\n</stdout>"}}));
}

TEST(RenderContent, NoTextBlockIsEmpty) {
  const std::string png = base64_encode(make_png(20, 20));
  auto no_empty = [](const json& content) {
    for (const auto& b : content) {
      if (b["type"] == "text") {
        EXPECT_FALSE(b["text"].get<std::string>().empty()) << content.dump();
      }
    }
  };
  // An image and nothing after it: the image is the last block.
  json content = render_content({stream("stdout", "plot:\n"), display({{"image/png", png}, {"text/plain", "<IPython.core.display.Image object>"}})});
  no_empty(content);
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content.back()["type"], "image");
  EXPECT_EQ(render_content({display({{"image/png", png}}), stream("stdout", "\n \n")}).size(), 2u);
  // No output at all: no block.
  EXPECT_TRUE(render_content({}).empty());
  EXPECT_TRUE(render_content({stream("stdout", ""), display({{"application/json", {{"a", 1}}}})}).empty());
  // Several images back to back: each with its tag, nothing empty between them.
  content = render_content({display({{"image/png", png}}), display({{"image/png", base64_encode(make_png(21, 20))}})});
  no_empty(content);
  EXPECT_EQ(content.size(), 4u);
}

TEST(RenderContent, TheSameImageTwiceIsSentOnce) {
  // A figure as the cell's last expression: its execute_result, then the inline backend's
  // display_data of the same PNG (here wrapped differently).
  const std::string png = base64_encode(make_png(50, 40));
  const json content = render_content({result({{"image/png", png}, {"text/plain", "<Figure size 200x200 with 1 Axes>"}}),
                                       display({{"image/png", wrapped(png)}, {"text/plain", "<Figure size 200x200 with 1 Axes>"}})});
  ASSERT_EQ(images_of(content).size(), 1u);
  ASSERT_EQ(content.size(), 3u);
  EXPECT_EQ(content[2]["text"], "<Figure size 200x200 with 1 Axes>");
  // The same image under another text: the image once, both texts.
  const json two = render_content({display({{"image/png", png}, {"text/plain", "first"}}), stream("stdout", "x\n"),
                                   display({{"image/png", png}, {"text/plain", "second"}})});
  EXPECT_EQ(images_of(two).size(), 1u);
  EXPECT_EQ(two.back()["text"],
            "<display_data>\nfirst\n</display_data>\n<stdout>\nx\n</stdout>\n<display_data>\nsecond\n</display_data>");
  // The copy does not count against max_images.
  RenderOptions opts;
  opts.max_images = 1;
  EXPECT_EQ(images_of(render_content({display({{"image/png", png}}), display({{"image/png", png}})}, opts)).size(), 1u);
  EXPECT_EQ(render_content({display({{"image/png", png}}), display({{"image/png", png}})}, opts).size(), 2u);
}

// --- HTML as text ------------------------------------------------------------------------

TEST(HtmlToText, LibXmlIsOpenedAtRunTimeAndAMissingOneIsSaid) {
  EXPECT_EQ(libxml_error(), "");
  const std::string e = libxml_error("libkgate-no-such-library.so.0");
  EXPECT_NE(e.find("libkgate-no-such-library.so.0"), std::string::npos) << e;
  EXPECT_NE(libxml_error("libc.so.6").find("has no xmlInitParser"), std::string::npos);
}

TEST(HtmlToText, ReadableText) {
  EXPECT_EQ(html_to_text("<b>x</b>"), "x");
  EXPECT_EQ(html_to_text("&lt;tag&gt; &amp; caf&eacute; &#x2713; &#39;q&#39;"), "<tag> & café ✓ 'q'");
  EXPECT_EQ(html_to_text("<p>one</p><p>two <i>words</i></p>"), "one\n\ntwo words");
  EXPECT_EQ(html_to_text("a\n   b\t\tc<br>d<br/>e"), "a b c\nd\ne");
  EXPECT_EQ(html_to_text("<h2>Title</h2>text<div>block</div>after"), "Title\n\ntext\nblock\nafter");
  EXPECT_EQ(html_to_text("<ul><li>a</li><li>b<ol><li>c</li><li>d</li></ol></li></ul>"), "- a\n- b\n  1. c\n  2. d");
  EXPECT_EQ(html_to_text("<table><thead><tr><th>col</th><th>n</th></tr></thead>"
                         "<tbody><tr><td>a</td><td>1</td></tr><tr><td>b</td><td>2</td></tr></tbody></table>"),
            "col | n\na | 1\nb | 2");
  EXPECT_EQ(html_to_text("<pre>  keep\n    this</pre>"), "  keep\n    this");
  EXPECT_EQ(html_to_text("<style>p{color:red}</style><script>alert(1)</script><!-- c -->shown"), "shown");
  EXPECT_EQ(html_to_text("<img src=x.png alt=\"a plot\"> <img src=y.png>"), "[a plot]");
  EXPECT_EQ(html_to_text("<html><head><title>t</title></head><body><p>body</p></body></html>"), "body");
  EXPECT_EQ(html_to_text(""), "");
  EXPECT_EQ(html_to_text("   "), "");
  // Broken HTML is recovered from.
  EXPECT_EQ(html_to_text("<div><b>unclosed <i>tags</div> end"), "unclosed tags\nend");
  EXPECT_EQ(html_to_text("a < b > c"), "a < b > c");
}

TEST(HtmlToText, AlwaysValidUtf8) {
  // Invalid bytes, and a document claiming another charset: the text stays UTF-8.
  const std::string bad = html_to_text("<p>caf\xe9 \xff\xfe ok</p>");
  EXPECT_TRUE(is_valid_utf8(bad));
  EXPECT_NE(bad.find("ok"), std::string::npos);
  const std::string latin = html_to_text("<meta charset=\"iso-8859-1\"><p>café</p>");
  EXPECT_TRUE(is_valid_utf8(latin));
  EXPECT_NE(latin.find("caf"), std::string::npos);
  // Huge HTML: the head is read and the rest said.
  std::string huge;
  while (huge.size() < (std::size_t(3) << 20)) huge += "<p>row é</p>";
  const std::string text = html_to_text(huge);
  EXPECT_TRUE(text.starts_with("row é\n\nrow é"));
  EXPECT_NE(text.find(" more bytes of HTML not shown …]"), std::string::npos);
  EXPECT_TRUE(is_valid_utf8(text));
}

// --- UTF-8 -------------------------------------------------------------------------------

TEST(Utf8, EscapeBeforeAMultiByteCharacter) {
  // ESC directly before a multi-byte character: the character is kept whole.
  EXPECT_EQ(clean_stream("\x1b\u00e9 bad"), "\u00e9 bad");
  EXPECT_EQ(render_text({error_out("ValueError", "\x1b\u00e9 bad", {"\x1b[31mValueError\x1b[0m: \x1b\u00e9 bad"})}),
            "ValueError: \u00e9 bad");
  EXPECT_EQ(clean_stream("\x1b(\xc3"), "\xEF\xBF\xBD");  // and a truncated one is U+FFFD
}

// Every text the renderer emits is valid UTF-8, whatever bytes the kernel sent: random bytes,
// escape sequences and truncated multi-byte characters in every field it reads.
TEST(Utf8, PropertyEveryTextEmittedIsValid) {
  std::srand(16);
  const std::vector<std::string> parts = {"\x1b", "\x1b[", "\x1b[31m", "\x1b]0;t", "\x1b(", "\x1b[?1049h", "\x1b[?1049l",
                                          "é", "\xc3", "\xe2\x82", "\xf0\x9f\x98", "\xff", "\x80", "\r", "\b", "\n", "a",
                                          "<b>", "</b>", "&amp;", "&#xD800;", "\xed\xa0\x80", "\xc0\x80", "ж", "😀"};
  auto random_text = [&] {
    std::string s;
    const int n = std::rand() % 24;
    for (int i = 0; i < n; ++i) {
      if (std::rand() % 3 == 0) s.push_back(static_cast<char>(std::rand() % 256));
      else s += parts[std::size_t(std::rand()) % parts.size()];
    }
    return s;
  };
  auto valid = [](const std::string& s) { return is_valid_utf8(s); };
  for (int round = 0; round < 400; ++round) {
    std::vector<CellOutput> outs;
    const int n = 1 + std::rand() % 5;
    for (int i = 0; i < n; ++i) {
      switch (std::rand() % 5) {
        case 0: {
          const int which = std::rand() % 3;
          outs.push_back(stream(which == 0 ? "stdout" : which == 1 ? "stderr" : random_text(), random_text()));
          break;
        }
        case 1: outs.push_back(result({{"text/plain", random_text()}})); break;
        case 2: outs.push_back(display({{"text/plain", "<IPython.core.display.HTML object>"}, {"text/html", random_text()}})); break;
        case 3: outs.push_back(display({{"text/markdown", random_text()}})); break;
        default: outs.push_back(error_out(random_text(), random_text(), {random_text(), random_text()})); break;
      }
    }
    RenderOptions opts;
    opts.max_text = std::rand() % 2 ? 40000 : 60 + std::size_t(std::rand() % 200);
    opts.traceback_line = 5;
    const std::string text = render_text(outs, opts);
    ASSERT_TRUE(valid(text)) << round;
    const json content = render_content(outs, opts);
    ASSERT_NO_THROW((void)content.dump()) << round;  // strict: throws on invalid UTF-8
    for (const auto& o : outs) {
      ASSERT_TRUE(valid(clean_stream(o.text))) << round;
      ASSERT_TRUE(valid(cap_traceback(o.traceback, 5))) << round;
    }
  }
}

// --- base64 ------------------------------------------------------------------------------

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},  {"foob", "Zm9vYg=="},  {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(plain), encoded);
    EXPECT_EQ(base64_decode(encoded), std::optional<std::string>(plain));
  }
}

TEST(Base64, RoundTripsAllBytes) {
  std::string bytes;
  for (int i = 0; i < 256 * 3 + 1; ++i) bytes.push_back(static_cast<char>(i * 7 % 256));
  EXPECT_EQ(base64_decode(base64_encode(bytes)), bytes);
  EXPECT_EQ(base64_decode(wrapped(base64_encode(bytes))), bytes);
}

TEST(Base64, WhitespaceAndPadding) {
  EXPECT_EQ(base64_decode("Zm9v\nYmFy\r\n"), "foobar");
  EXPECT_EQ(base64_decode("  Zm 9v\tYg = =\n"), "foob");
  EXPECT_EQ(base64_decode("Zm9vYg"), "foob");  // unpadded
  EXPECT_EQ(base64_decode("Zm9vYmE"), "fooba");
}

TEST(Base64, RejectsWhatIsNotBase64) {
  for (const char* bad : {"Zm9v!", "Zg==Zg==", "Z", "Zm9vY", "Zm9-", "Zg===", "Zm8==", "=Zm8", "data:image/png;base64,Zm9v"})
    EXPECT_EQ(base64_decode(bad), std::nullopt) << bad;
}

// --- outputs from iopub and from job records ---------------------------------------------

TEST(Outputs, FromIopub) {
  auto s = output_from_iopub("stream", {{"name", "stderr"}, {"text", "warn\n"}});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, CellOutput::Kind::stream);
  EXPECT_EQ(s->name, "stderr");
  EXPECT_EQ(s->text, "warn\n");
  auto r = output_from_iopub("execute_result",
                             {{"data", {{"text/plain", "2"}}}, {"metadata", json::object()}, {"execution_count", 1}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->kind, CellOutput::Kind::execute_result);
  EXPECT_EQ(r->data, json({{"text/plain", "2"}}));
  auto d = output_from_iopub("display_data", {{"data", {{"image/png", "iVBO"}}}, {"transient", {{"display_id", "x"}}}});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->kind, CellOutput::Kind::display_data);
  auto e = output_from_iopub("error", {{"ename", "NameError"}, {"evalue", "name 'x' is not defined"},
                                       {"traceback", {"a", 3, "NameError: name 'x' is not defined"}}});
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, CellOutput::Kind::error);
  EXPECT_EQ(e->ename, "NameError");
  EXPECT_EQ(e->traceback, (std::vector<std::string>{"a", "NameError: name 'x' is not defined"}));
  for (const char* other : {"status", "execute_input", "clear_output", "update_display_data", "comm_msg", ""})
    EXPECT_FALSE(output_from_iopub(other, {{"execution_state", "idle"}})) << other;
  // Wrong types are emptied, not thrown.
  auto odd = output_from_iopub("stream", {{"name", 3}, {"text", json::array()}});
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->text, "");
  EXPECT_TRUE(output_from_iopub("display_data", json("not an object")));
}

TEST(Outputs, FromRealJobRecords) {
  // Records as kgate serves them: job_json over a Job, through JSON text.
  const auto now = std::chrono::steady_clock::now();
  Job ok;
  ok.n = 3;
  ok.kernel = "k1";
  ok.status = JobStatus::ok;
  ok.output = TailText(1024);
  ok.result = TailText(1024);
  ok.output.append("step 1\r");
  ok.output.append("step 2\n");
  ok.result.append("42");
  json rec = json::parse(job_json(ok, true, now).dump());
  auto outs = outputs_from_record(rec);
  ASSERT_EQ(outs.size(), 2u);
  // The record keeps stdout and stderr as one text: it is not called stdout.
  EXPECT_EQ(render_text(outs), "<output>\nstep 2\n</output>\n<execute_result>\n42\n</execute_result>");

  Job bad;
  bad.n = 4;
  bad.status = JobStatus::error;
  bad.output = TailText(16);
  bad.output.append("0123456789abcdefghijklmnop\n");  // 27 bytes: the first 11 cut
  bad.ename = "ZeroDivisionError";
  bad.evalue = "division by zero";
  bad.traceback = {std::string(75, '-'), "Cell In[2], line 1\n----> 1 1/0\n", "ZeroDivisionError: division by zero"};
  rec = json::parse(job_json(bad, true, now).dump());
  ASSERT_EQ(rec["output_cut"], 11);
  outs = outputs_from_record(rec);
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[1].kind, CellOutput::Kind::error);
  EXPECT_EQ(outs[0].cut, 11u);
  EXPECT_EQ(render_text(outs), "<output>\n[11 earlier bytes of output were cut]\nbcdefghijklmnop\n</output>\n<error>\n" +
                                   std::string(75, '-') + "\nCell In[2], line 1\n----> 1 1/0\n\nZeroDivisionError: division by zero\n</error>");

  Job lost;
  lost.n = 5;
  lost.status = JobStatus::kernel_lost;
  lost.note = "The kernel stopped before this job finished (it died).";
  rec = json::parse(job_json(lost, true, now).dump());
  outs = outputs_from_record(rec);
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].name, "note");
  EXPECT_EQ(render_text(outs), "The kernel stopped before this job finished (it died).");

  // A summary (no output fields) or garbage gives nothing.
  EXPECT_TRUE(outputs_from_record(json::parse(job_json(ok, false, now).dump())).empty());
  EXPECT_TRUE(outputs_from_record(json::array()).empty());
}
