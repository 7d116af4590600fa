// kgate's version: project(VERSION) in CMakeLists.txt, plus KGATE_VERSION_SUFFIX when a build
// sets one (scripts/package.sh --version-suffix).  Defined in one generated file
// (cmake/version.cpp.in), so a build with another version compiles that file and relinks.
#pragma once

#include <string_view>

namespace kgate {

// "0.1.0", or "0.1.0+next" with a suffix.
std::string_view version();
// The Server header of every response: "kgate/<version>".
std::string_view server_header();

}  // namespace kgate
