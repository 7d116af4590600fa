// Unit tests for UTF-8 validation (simdjson), repair, display width and the table printer.
#include "kgate/jupyter/utf8.hpp"

#include <gtest/gtest.h>

namespace kgate {
namespace {

TEST(Utf8Valid, Cases) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("caf\xc3\xa9 \xe2\x98\x83 \xf0\x9f\x94\x91 \xf4\x8f\xbf\xbf"));
  EXPECT_TRUE(is_valid_utf8(std::string_view("a\0b", 3)));
  EXPECT_FALSE(is_valid_utf8("\xff"));
  EXPECT_FALSE(is_valid_utf8("\x80"));              // a continuation byte first
  EXPECT_FALSE(is_valid_utf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(is_valid_utf8("\xe0\x80\xaf"));      // overlong, 3 bytes
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xe2\x98"));          // cut short
  EXPECT_FALSE(is_valid_utf8("\xc3("));             // a bad continuation
  // Long inputs take the SIMD path: a bad byte anywhere in them is found.
  std::string long_text(10000, 'x');
  EXPECT_TRUE(is_valid_utf8(long_text));
  for (std::size_t at : {0u, 31u, 64u, 4097u, 9999u}) {
    std::string t = long_text;
    t[at] = '\xff';
    EXPECT_FALSE(is_valid_utf8(t)) << at;
  }
}

TEST(Utf8Repair, EachMaximalSubpartBecomesOneReplacement) {
  EXPECT_EQ(valid_utf8("ok \xc3\xa9"), "ok \xc3\xa9");
  EXPECT_EQ(valid_utf8("a\xffz"), "a\xef\xbf\xbdz");
  EXPECT_EQ(valid_utf8("\xe2\x98z"), "\xef\xbf\xbdz");  // one subpart, one U+FFFD
  std::string s = "x\x80y";
  make_valid_utf8(s);
  EXPECT_EQ(s, "x\xef\xbf\xbdy");
}

TEST(DisplayWidth, CountsTerminalColumns) {
  EXPECT_EQ(display_width(""), 0u);
  EXPECT_EQ(display_width("python3"), 7u);
  EXPECT_EQ(display_width("caf\xc3\xa9"), 4u);          // é: one column, two bytes
  EXPECT_EQ(display_width("cafe\xcc\x81"), 4u);         // e + a combining acute: no column of its own
  EXPECT_EQ(display_width("\xe6\x97\xa5\xe6\x9c\xac"), 4u);  // 日本: two wide characters
  EXPECT_EQ(display_width("a\xffz"), 3u);               // an ill-formed byte shows as one character
}

TEST(FormatTable, PadsByDisplayWidthAndLeavesNoTrailingSpace) {
  const std::string t = format_table({{"NAME", "LANGUAGE", "NOTE"},
                                      {"\xe6\x97\xa5\xe6\x9c\xac", "python", ""},
                                      {"r", "R", "ok"}},
                                     "  ");
  EXPECT_EQ(t,
            "  NAME  LANGUAGE  NOTE\n"
            "  \xe6\x97\xa5\xe6\x9c\xac  python\n"
            "  r     R         ok\n");
  EXPECT_EQ(format_table({}), "");
}

}  // namespace
}  // namespace kgate
