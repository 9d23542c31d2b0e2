# What a system package carries besides programs and libraries: man pages for tided,
# tidectl and tide-ckpt, and the systemd unit of tided.

# ---- man pages ------------------------------------------------------------------------
# Made from each program's --help by help2man (dist/man/gen-man.sh) when it is installed;
# otherwise the pages checked in under dist/man are installed (tests/test_dist.sh keeps
# them equal to what help2man makes of this build).
find_program(TIDE_HELP2MAN help2man)
set(_tide_man_tided "the tide coordinator daemon")
set(_tide_man_tidectl "query and control a tide cluster: workers, jobs, resizes, events")
set(_tide_man_tide-ckpt "inspect, verify and convert tide checkpoints offline")
set(_tide_man_pages "")
foreach(prog tided tidectl tide-ckpt)
  if(TIDE_HELP2MAN AND NOT CMAKE_CROSSCOMPILING)
    set(_page ${PROJECT_BINARY_DIR}/man/${prog}.1)
    add_custom_command(
      OUTPUT ${_page}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/man
      COMMAND bash ${PROJECT_SOURCE_DIR}/dist/man/gen-man.sh ${TIDE_HELP2MAN}
              $<TARGET_FILE:${prog}> ${prog} ${PROJECT_VERSION} "${_tide_man_${prog}}"
              ${PROJECT_SOURCE_DIR}/dist/man/${prog}.h2m ${_page}
      DEPENDS ${prog} ${PROJECT_SOURCE_DIR}/dist/man/${prog}.h2m
              ${PROJECT_SOURCE_DIR}/dist/man/gen-man.sh
      COMMENT "Writing the man page ${prog}.1" VERBATIM)
  else()
    set(_page ${PROJECT_SOURCE_DIR}/dist/man/${prog}.1)
  endif()
  list(APPEND _tide_man_pages ${_page})
endforeach()
if(TIDE_HELP2MAN AND NOT CMAKE_CROSSCOMPILING)
  add_custom_target(tide_man ALL DEPENDS ${_tide_man_pages})
else()
  message(STATUS "tide: help2man not found: installing the man pages of dist/man")
endif()
install(FILES ${_tide_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)

# ---- systemd ----------------------------------------------------------------------------
# PREFIX/lib/systemd/system/tided.service, written at install time so that its ExecStart
# names the tided of the prefix actually installed into (cmake --install --prefix P, and
# DESTDIR for packages).
if(IS_ABSOLUTE "${CMAKE_INSTALL_BINDIR}")
  set(_tide_bindir "${CMAKE_INSTALL_BINDIR}")
else()
  set(_tide_bindir "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}")
endif()
install(CODE "
  set(TIDED \"${_tide_bindir}/tided\")
  set(_unit \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/lib/systemd/system/tided.service\")
  message(STATUS \"Installing: \${_unit}\")
  configure_file(\"${PROJECT_SOURCE_DIR}/dist/tided.service.in\" \"\${_unit}\" @ONLY)
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\${_unit}\")
")
