// Boost.Asio's and Boost.Beast's compiled parts, once for the whole build.
//
// cmake/Beast.cmake defines BOOST_ASIO_SEPARATE_COMPILATION and BOOST_BEAST_SEPARATE_COMPILATION
// for every target, so the non-template functions of both libraries are compiled here instead
// of in every unit that includes them (docs/dev/build-and-test.md, "Compile time").  Asio's src.hpp files are
// included whole.  Beast's src.hpp is not: it would also compile its test stream, and its
// websocket utf8_checker.ipp, whose class include/kgate/beast_config.hpp (forced first into
// every unit, this one too) replaces.  The list below is the rest of Beast 1.74's src.hpp.
#define BOOST_BEAST_SOURCE  // what Beast's src.hpp defines: its .ipp files then instantiate basic_parser
#include <boost/asio/impl/src.hpp>
#include <boost/asio/ssl/impl/src.hpp>

#include <boost/beast/core/detail/config.hpp>
#if defined(BOOST_BEAST_HEADER_ONLY)
#error "Beast's sources cannot be compiled with BOOST_BEAST_HEADER_ONLY"
#endif

#if !defined(BOOST_BEAST_SEPARATE_COMPILATION) || !defined(BOOST_ASIO_SEPARATE_COMPILATION)
#error "src/beast/boost_impl.cpp is for builds with Beast's and Asio's separate compilation (cmake/Beast.cmake)"
#endif

#include <boost/beast/core/detail/base64.ipp>
#include <boost/beast/core/detail/sha1.ipp>
#include <boost/beast/core/detail/impl/temporary_buffer.ipp>
#include <boost/beast/core/impl/error.ipp>
#include <boost/beast/core/impl/file_posix.ipp>
#include <boost/beast/core/impl/file_stdio.ipp>
#include <boost/beast/core/impl/flat_static_buffer.ipp>
#include <boost/beast/core/impl/saved_handler.ipp>
#include <boost/beast/core/impl/static_buffer.ipp>
#include <boost/beast/core/impl/string.ipp>
#include <boost/beast/http/detail/basic_parser.ipp>
#include <boost/beast/http/detail/rfc7230.ipp>
#include <boost/beast/http/impl/basic_parser.ipp>
#include <boost/beast/http/impl/error.ipp>
#include <boost/beast/http/impl/field.ipp>
#include <boost/beast/http/impl/fields.ipp>
#include <boost/beast/http/impl/rfc7230.ipp>
#include <boost/beast/http/impl/status.ipp>
#include <boost/beast/http/impl/verb.ipp>
#include <boost/beast/websocket/detail/hybi13.ipp>
#include <boost/beast/websocket/detail/mask.ipp>
#include <boost/beast/websocket/detail/pmd_extension.ipp>
#include <boost/beast/websocket/detail/prng.ipp>
#include <boost/beast/websocket/detail/service.ipp>
#include <boost/beast/websocket/impl/error.ipp>
#include <boost/beast/zlib/detail/deflate_stream.ipp>
#include <boost/beast/zlib/detail/inflate_stream.ipp>
#include <boost/beast/zlib/impl/error.ipp>
