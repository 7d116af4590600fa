# kgate_sanitizers: an INTERFACE target every kgate target links (through kgate_jupyter).
#   KGATE_ENABLE_SANITIZERS  ASan + UBSan (LeakSanitizer comes with ASan on Linux); any UB aborts.
#   KGATE_ENABLE_TSAN        ThreadSanitizer instead (it cannot be combined with ASan).
#   KGATE_FUZZ               clang only: coverage for libFuzzer in every target, and the fuzz
#                            targets in tests/fuzz (scripts/sanitize.sh builds them with ASan+UBSan).
add_library(kgate_sanitizers INTERFACE)
if(KGATE_ENABLE_SANITIZERS AND KGATE_ENABLE_TSAN)
  message(FATAL_ERROR "KGATE_ENABLE_SANITIZERS (ASan) and KGATE_ENABLE_TSAN cannot be combined")
endif()
if(KGATE_ENABLE_SANITIZERS)
  target_compile_options(kgate_sanitizers INTERFACE
    -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  target_link_options(kgate_sanitizers INTERFACE -fsanitize=address,undefined)
endif()
if(KGATE_ENABLE_TSAN)
  target_compile_options(kgate_sanitizers INTERFACE -fsanitize=thread -fno-omit-frame-pointer)
  target_link_options(kgate_sanitizers INTERFACE -fsanitize=thread)
endif()
if(KGATE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "KGATE_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  target_compile_options(kgate_sanitizers INTERFACE -fsanitize=fuzzer-no-link)
endif()
