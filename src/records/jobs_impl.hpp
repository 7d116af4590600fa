// The records' private helpers, shared by src/records/*.cpp (defined in jobs.cpp).
#pragma once

#include <string>
#include <string_view>

#include "kgate/records/jobs.hpp"

namespace kgate {
namespace record_text {

std::size_t utf8_head(std::string_view s, std::size_t cap);
void append_valid(TailText& t, std::string_view s);
json parse_part(const std::string& text);
std::string str_value(const json& j, const char* key);
std::string seconds_text(double s);

}  // namespace record_text
using namespace record_text;
}  // namespace kgate
