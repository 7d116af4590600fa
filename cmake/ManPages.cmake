# The man pages, made at build time from the programs' own --help (help2man) and the sample
# config (cmake/make_man.cmake), and installed in share/man: kgate.1, kgate-mcp.1, kgate.toml.5.
# Each is compressed with gzip -9n, as Debian installs them (-n: no name or time inside, so
# the same page is the same bytes).
# Made in plain builds only: the sanitizer and fuzz builds would have to run instrumented
# programs at build time, and install nothing.
if(KGATE_ENABLE_SANITIZERS OR KGATE_FUZZ OR KGATE_ENABLE_TSAN)
  return()
endif()
find_program(KGATE_HELP2MAN help2man)
if(NOT KGATE_HELP2MAN)
  message(WARNING "help2man not found (scripts/bootstrap.sh installs it): no man pages")
  return()
endif()
set(man_dir ${CMAKE_BINARY_DIR}/man)
set(make_man ${PROJECT_SOURCE_DIR}/cmake/make_man.cmake)
add_custom_command(OUTPUT ${man_dir}/kgate.1.gz
  COMMAND ${CMAKE_COMMAND} -DWHAT=program -DBIN=$<TARGET_FILE:kgate> -DOUT=${man_dir}/kgate.1
    -DVERSION=${KGATE_VERSION} "-DNAME=the resident Jupyter kernel gateway"
    "-DSEE_ALSO=\\fBkgate-mcp\\fR(1), \\fBkgate.toml\\fR(5)" -P ${make_man}
  COMMAND gzip -9nf ${man_dir}/kgate.1
  DEPENDS kgate ${make_man} VERBATIM)
add_custom_command(OUTPUT ${man_dir}/kgate-mcp.1.gz
  COMMAND ${CMAKE_COMMAND} -DWHAT=program -DBIN=$<TARGET_FILE:kgate-mcp> -DOUT=${man_dir}/kgate-mcp.1
    -DVERSION=${KGATE_VERSION} "-DNAME=an MCP server (stdio) for the kernels of a kgate gateway"
    "-DSEE_ALSO=\\fBkgate\\fR(1), \\fBkgate.toml\\fR(5)" -P ${make_man}
  COMMAND gzip -9nf ${man_dir}/kgate-mcp.1
  DEPENDS kgate-mcp ${make_man} VERBATIM)
add_custom_command(OUTPUT ${man_dir}/kgate.toml.5.gz
  COMMAND ${CMAKE_COMMAND} -DWHAT=config -DSRC=${PROJECT_SOURCE_DIR}/config/kgate.toml -DOUT=${man_dir}/kgate.toml.5
    -DVERSION=${KGATE_VERSION} "-DNAME=the configuration of kgate serve" -P ${make_man}
  COMMAND gzip -9nf ${man_dir}/kgate.toml.5
  DEPENDS ${PROJECT_SOURCE_DIR}/config/kgate.toml ${make_man} VERBATIM)
add_custom_target(man_pages ALL DEPENDS ${man_dir}/kgate.1.gz ${man_dir}/kgate-mcp.1.gz ${man_dir}/kgate.toml.5.gz)
install(FILES ${man_dir}/kgate.1.gz ${man_dir}/kgate-mcp.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${man_dir}/kgate.toml.5.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man5)
