# kgate_beast: the one Boost.Beast and Boost.Asio configuration of the whole build, a library
# every kgate target links (through kgate_jupyter):
#   - beast::string_view is std::string_view, so Beast strings mix with the rest of the code;
#   - include/kgate/beast_config.hpp is forced first into every translation unit: it replaces
#     Beast's websocket UTF-8 checker with one that accepts any text frame (why: DEV.md,
#     "Websocket text frames").  Forcing it everywhere is what keeps one definition of Beast's
#     websocket stream per binary; tests/check_build.py fails the suite if any translation unit in
#     compile_commands.json is compiled without it;
#   - Asio's and Beast's separate compilation: their non-template functions are compiled once,
#     in src/beast/boost_impl.cpp, not in every unit that includes them (docs/dev/build-and-test.md, "Compile time").
add_library(kgate_beast STATIC ${PROJECT_SOURCE_DIR}/src/beast/boost_impl.cpp)
target_compile_definitions(kgate_beast PUBLIC
  BOOST_BEAST_USE_STD_STRING_VIEW BOOST_ASIO_SEPARATE_COMPILATION BOOST_BEAST_SEPARATE_COMPILATION)
target_compile_options(kgate_beast PUBLIC
  "SHELL:-include ${PROJECT_SOURCE_DIR}/include/kgate/beast_config.hpp")
target_link_libraries(kgate_beast PUBLIC Boost::system OpenSSL::SSL OpenSSL::Crypto Threads::Threads kgate_sanitizers)
