# kgate_embed(<header> <input> <symbol>): makes <header> define
# `inline constexpr std::string_view <symbol>` with the bytes of <input>, so web pages ship
# inside the binary with no build step of their own.  The header is regenerated (CMake
# reconfigures) whenever <input> changes.
function(kgate_embed header input symbol)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${input})
  file(READ ${input} KGATE_EMBED_CONTENT)
  string(FIND "${KGATE_EMBED_CONTENT}" ")kgate_embed\"" found)
  if(NOT found EQUAL -1)
    message(FATAL_ERROR "${input} contains the raw-string delimiter )kgate_embed\"")
  endif()
  set(KGATE_EMBED_SYMBOL ${symbol})
  configure_file(${CMAKE_SOURCE_DIR}/cmake/embed.hpp.in ${header} @ONLY)
endfunction()
