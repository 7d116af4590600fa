// Replaces Beast's UTF-8 validator for websocket text frames with one that accepts anything.
//
// Why: the Jupyter legacy websocket protocol sends binary messages (with buffers) whose frames
// a stock jupyter_server relay forwards with a *text* opcode (tornado's write_message(bytes)
// defaults to binary=False).  Beast 1.74 always fails such frames with bad_frame_payload and
// has no option to turn the check off.  kgate decides per message what the payload is (JSON
// text, or legacy binary, by its first byte) and validates the JSON it parses, so the frame
// level check buys nothing.  This header must come before any Beast websocket header, in every
// translation unit of a binary: cmake/Beast.cmake forces it first into all of them (-include),
// and tests/check_build.py fails the suite if one is compiled without it.
#pragma once

#ifdef BOOST_BEAST_WEBSOCKET_DETAIL_UTF8_CHECKER_HPP
#error "include gateway/http/net.hpp before any Boost.Beast websocket header"
#endif
#define BOOST_BEAST_WEBSOCKET_DETAIL_UTF8_CHECKER_HPP

#include <cstddef>
#include <cstdint>

namespace boost::beast::websocket::detail {

class utf8_checker {
 public:
  void reset() {}
  bool finish() { return true; }
  bool write(std::uint8_t const*, std::size_t) { return true; }
  template <class ConstBufferSequence>
  bool write(ConstBufferSequence const&) {
    return true;
  }
};

// Used for close-frame reasons only.
inline bool check_utf8(char const*, std::size_t) { return true; }

}  // namespace boost::beast::websocket::detail
