# The Debian package, with CPack (scripts/package.sh runs it; docs/service.md, "Install"):
# kgate_<version>_<arch>.deb, the installed layout of CMakeLists.txt under /usr, plus
#   share/doc/kgate/copyright       config/debian/copyright
#   share/doc/kgate/changelog.gz    config/debian/changelog, with an entry for a version suffix
# The version is KGATE_VERSION: project(VERSION) and KGATE_VERSION_SUFFIX.  A native package
# (no Debian revision): the upstream is this repository.
#
# Depends: dpkg-shlibdeps, from the libraries the programs link.  python3-ipykernel is a
# Recommends, not a Depends: kgate runs kernels from whichever Python environment has ipykernel
# (kernelspecs, venvs, conda; docs/kernels.md), so a user whose kernels live in their own
# environments needs no system ipykernel.  apt installs Recommends by default, so
# `apt install ./kgate_*.deb` brings it; without any ipykernel, kgate serves and says so.
# Made in plain builds only, like the man pages the package carries.
if(KGATE_ENABLE_SANITIZERS OR KGATE_FUZZ OR KGATE_ENABLE_TSAN)
  return()
endif()

set(debian ${CMAKE_BINARY_DIR}/debian)
file(READ ${PROJECT_SOURCE_DIR}/config/debian/changelog changelog)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/config/debian/changelog)
string(REGEX MATCH "^kgate \\(([^)]+)\\)" _ "${changelog}")
if(NOT CMAKE_MATCH_1 STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "config/debian/changelog's latest entry is ${CMAKE_MATCH_1}, project(VERSION) is ${PROJECT_VERSION}: add an entry")
endif()
if(KGATE_VERSION_SUFFIX)
  string(TIMESTAMP now "%a, %d %b %Y %H:%M:%S +0000" UTC)
  string(REGEX MATCH "\n -- ([^>]+>)" _ "${changelog}")
  set(changelog "kgate (${KGATE_VERSION}) unstable; urgency=medium\n\n  * The tree of ${PROJECT_VERSION}, built with the version suffix ${KGATE_VERSION_SUFFIX}.\n\n -- ${CMAKE_MATCH_1}  ${now}\n\n${changelog}")
endif()
file(WRITE ${debian}/changelog "${changelog}")
add_custom_command(OUTPUT ${debian}/changelog.gz
  COMMAND gzip -9nkf ${debian}/changelog
  DEPENDS ${debian}/changelog VERBATIM)
add_custom_target(debian_changelog ALL DEPENDS ${debian}/changelog.gz)
install(FILES ${PROJECT_SOURCE_DIR}/config/debian/copyright ${debian}/changelog.gz DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kgate)
set(CPACK_PACKAGE_VERSION ${KGATE_VERSION})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # kgate_<version>_<arch>.deb
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/package)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
string(REGEX MATCH "\n -- ([^>]+>)" _ "${changelog}")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${CMAKE_MATCH_1}")
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# dlopen'd by kgate-mcp and kgate's /mcp at the first HTML output (translator/mcp/render.cpp),
# so dpkg-shlibdeps does not see it.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libxml2 (>= 2.9)")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3-ipykernel")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "python3-jupyter-client, jupyter-console")
set(CPACK_STRIP_FILES ON)  # the symbol tables stay in the build folder's programs
set(CPACK_INSTALL_DEFAULT_DIRECTORY_PERMISSIONS
  OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "resident Jupyter kernel gateway, with an MCP server for agents
kgate launches and owns Jupyter kernels (ipykernel), keeps a record of
every cell run in them, and serves the Jupyter kernels HTTP and websocket
API, so any Jupyter client can use them.  Kernels outlive kgate: after a
restart or an upgrade, the next kgate adopts them again.
.
kgate-mcp is an MCP server (stdio) that gives an agent such as Claude Code
the kernels of a kgate gateway, and tells it which cells it did not run.
.
Installing the package enables no service: each user runs
`systemctl --user enable --now kgate`, or `kgate install-service`.")
include(CPack)
