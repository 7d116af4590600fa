# kgate_warnings: an INTERFACE target carrying the warning flags every kgate target uses.
add_library(kgate_warnings INTERFACE)
target_compile_options(kgate_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Woverloaded-virtual
  -Wimplicit-fallthrough)
if(KGATE_WARNINGS_AS_ERRORS)
  target_compile_options(kgate_warnings INTERFACE -Werror)
endif()
