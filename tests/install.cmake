# The installed package (find_package, pkg-config, run path) and the out-of-tree
# quickstart resized live through the installed tided and tidectl.
if(TARGET tide AND TARGET tided AND TARGET tidectl)
  set(_tide_install_cflags "")
  if(TIDE_SANITIZE)
    set(_tide_install_cflags "-fsanitize=address,undefined -fno-omit-frame-pointer")
  endif()
  add_test(NAME test_install
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_install.sh ${PROJECT_BINARY_DIR}
                   ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_install "mpi;install" 300)
  set_property(TEST test_install APPEND PROPERTY ENVIRONMENT
               "EXTRA_CFLAGS=${_tide_install_cflags}")
endif()

# The conventions of a system package: --version, man pages, tided's systemd unit and
# state directory, tide.pc through pkg-config (tests/test_dist.sh).
if(TARGET tided AND TARGET tidectl AND TARGET tide-ckpt)
  add_test(NAME test_dist
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_dist.sh ${PROJECT_BINARY_DIR}
                   ${PROJECT_SOURCE_DIR} ${PROJECT_VERSION} ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_dist "install" 120)
endif()

# The README's quickstart run as written (tests/test_readme_quickstart.sh): its install block
# names /opt/tide, this build is installed there in its stead, and its run block (tided, the
# quickstart built with pkg-config, two live resizes, status, jobs, events) runs line by
# line in namespaces of its own; what its comments say must be in what it printed.
if(TARGET tide AND TARGET tided AND TARGET tidectl AND NOT TIDE_SANITIZE)
  add_test(NAME test_readme_quickstart
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_readme_quickstart.sh
                   ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  _tide_test_props(test_readme_quickstart "mpi;install" 180)
  set_property(TEST test_readme_quickstart APPEND PROPERTY PASS_REGULAR_EXPRESSION
               "test_readme_quickstart: passed")
endif()
