# kgate_sanitizers: an INTERFACE target that adds ASan+UBSan when KGATE_ENABLE_SANITIZERS is ON.
add_library(kgate_sanitizers INTERFACE)
if(KGATE_ENABLE_SANITIZERS)
  target_compile_options(kgate_sanitizers INTERFACE
    -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  target_link_options(kgate_sanitizers INTERFACE -fsanitize=address,undefined)
endif()
