# The systemd units the install carries, made from config/kgate.service: the same template
# `kgate install-service` fills in at run time (gateway/cli/service.cpp), so the two cannot
# drift.  install-service writes a unit for one user with that user's paths; these name the
# installed kgate and leave the rest to systemd's specifiers:
#   kgate.service (user unit):    `systemctl --user enable --now kgate`
#   kgate@.service (system):      `sudo systemctl enable --now kgate@alice` runs it as alice
# ExecStart names the prefix of the install itself (`cmake --install --prefix`, or the package's
# /usr), not the one configured: the template is filled in here with every field but that path,
# and the path at install time (the install(CODE) below).
set(KGATE_BIN "@KGATE_INSTALLED_BIN@")
set(KGATE_SERVE_ARGS "")
set(KGATE_DOCUMENTATION "Documentation=man:kgate(1) man:kgate.toml(5)\n")  # as gateway/cli/service.cpp
set(units ${CMAKE_BINARY_DIR}/systemd)

# The user unit: %h is the user's home in a user manager.
set(KGATE_ENV_FILE "%h/.config/kgate/kgate.env")
set(KGATE_SYSTEM_LINES "")
set(KGATE_WANTED_BY "default.target")
configure_file(${PROJECT_SOURCE_DIR}/config/kgate.service ${units}/kgate.service.in @ONLY)

# The system template: User=%i.  %h would be root's home here (the system manager's, whatever
# User= says), so the environment file is /etc/kgate/<user>.env.
set(KGATE_ENV_FILE "/etc/kgate/%i.env")
# The lines install-service adds for --system (config/kgate.service.system), with User=%i.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/config/kgate.service.system)
file(READ ${PROJECT_SOURCE_DIR}/config/kgate.service.system KGATE_SYSTEM_LINES)
string(REPLACE "@KGATE_USER@" "%i" KGATE_SYSTEM_LINES "${KGATE_SYSTEM_LINES}")
set(KGATE_WANTED_BY "multi-user.target")
configure_file(${PROJECT_SOURCE_DIR}/config/kgate.service ${units}/kgate@.service.in @ONLY)

install(CODE "
  set(KGATE_INSTALLED_BIN \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/kgate\")
  configure_file(\"${units}/kgate.service.in\" \"${units}/user/kgate.service\" @ONLY)
  configure_file(\"${units}/kgate@.service.in\" \"${units}/system/kgate@.service\" @ONLY)")
install(FILES ${units}/user/kgate.service DESTINATION lib/systemd/user)
install(FILES ${units}/system/kgate@.service DESTINATION lib/systemd/system)
