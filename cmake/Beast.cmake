# kgate_beast: the one Boost.Beast configuration of the whole build, an INTERFACE target every
# kgate target links (through kgate_proto):
#   - beast::string_view is std::string_view, so Beast strings mix with the rest of the code;
#   - include/kgate/beast_config.hpp is forced first into every translation unit: it replaces
#     Beast's websocket UTF-8 checker with one that accepts any text frame (why: DEV.md,
#     "Websocket text frames").  Forcing it everywhere is what keeps one definition of Beast's
#     websocket stream per binary; tests/check_build.py fails the suite if any translation unit in
#     compile_commands.json is compiled without it.
add_library(kgate_beast INTERFACE)
target_compile_definitions(kgate_beast INTERFACE BOOST_BEAST_USE_STD_STRING_VIEW)
target_compile_options(kgate_beast INTERFACE
  "SHELL:-include ${PROJECT_SOURCE_DIR}/include/kgate/beast_config.hpp")
target_link_libraries(kgate_beast INTERFACE Boost::system)
