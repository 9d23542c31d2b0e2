# Test helpers. Every test is registered with ctest and a label:
#   unit  Criterion unit tests, seconds in all        tide_add_unit_test()
#   mpi   integration tests run under mpirun          tide_add_mpi_test(), or one entry
#         per row of a scenario table                 tide_add_scenarios()
#   gpu   tests that need a CUDA device; they exit 77 tide_add_gpu_test()
#         (skipped) with a message when none is present
#   slow  added to any of the above by passing SLOW
# `ctest -L unit` is the quick loop; the README's test command runs every label.

set(TIDE_TEST_TIMEOUT 120 CACHE STRING "Default per-test timeout (s)")
# A test's timeout finds a hang; it is not a speed target. Each is written for a plain build
# on a quiet machine and multiplied by this: 2 (a loaded machine, load 8 on 2 cores), 4 under
# the sanitizers (2-3 times slower again). CI's loaded sanitizer run timed out a 30 s test
# at its 60 s.
if(TIDE_SANITIZE)
  set(_tide_timeout_scale 4)
else()
  set(_tide_timeout_scale 2)
endif()
set(TIDE_TEST_TIMEOUT_SCALE ${_tide_timeout_scale} CACHE STRING
    "Every test's timeout is multiplied by this")
set(TIDE_SKIP_RC 77)

# mpirun as root needs explicit permission; oversubscribe lets 8 ranks run on 2 cores.
set(TIDE_MPIEXEC_FLAGS --oversubscribe --bind-to none)
execute_process(COMMAND id -u OUTPUT_VARIABLE _tide_uid OUTPUT_STRIP_TRAILING_WHITESPACE)
if(_tide_uid STREQUAL "0")
  list(APPEND TIDE_MPIEXEC_FLAGS --allow-run-as-root)
endif()
set(TIDE_MPIEXEC ${MPIEXEC_EXECUTABLE} CACHE STRING "mpirun used by tests")

# Environment for every test: sanitizer options (Open MPI and libzmq keep some
# allocations for the life of the process; see tests/lsan.supp). OpenBLAS starts its
# thread pool when it is loaded, before main; ranks are processes and run BLAS on one
# thread, so the pool is turned off (a program that exits at once, like a driver's
# --list, otherwise races LeakSanitizer's exit check against a thread still starting).
set(TIDE_TEST_ENV
    "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1"
    "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
    "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0"
    "OMPI_MCA_btl=self,vader,tcp" "OMPI_MCA_btl_vader_single_copy_mechanism=none"
    "OMPI_MCA_rmaps_base_oversubscribe=1" "OMPI_MCA_mpi_yield_when_idle=1"
    "OPENBLAS_NUM_THREADS=1" "TIDE_TEST_SKIP_RC=${TIDE_SKIP_RC}")

function(_tide_test_props name labels timeout)
  math(EXPR timeout "${timeout} * ${TIDE_TEST_TIMEOUT_SCALE}")
  # Criterion ignores LeakSanitizer's exit code in its test children, so a
  # sanitizer report fails the test by its text.
  set_tests_properties(${name} PROPERTIES LABELS "${labels}" TIMEOUT ${timeout}
                       ENVIRONMENT "${TIDE_TEST_ENV}" SKIP_RETURN_CODE ${TIDE_SKIP_RC}
                       FAIL_REGULAR_EXPRESSION "ERROR: (Address|Leak)Sanitizer|runtime error:")
endfunction()

# tide_add_unit_test(NAME SOURCES a.c... LIBS x... [TIMEOUT s] [SLOW])
function(tide_add_unit_test name)
  cmake_parse_arguments(T "SLOW" "TIMEOUT" "SOURCES;LIBS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT ${TIDE_TEST_TIMEOUT})
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} PkgConfig::CRITERION tide_core)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name} --jobs=2)
  set(labels unit)
  if(T_SLOW)
    list(APPEND labels slow)
  endif()
  _tide_test_props(${name} "${labels}" ${T_TIMEOUT})
endfunction()

# tide_add_mpi_test(NAME NP n SOURCES a.c... LIBS x... [ARGS ...] [TIMEOUT s] [SLOW]
#                   [MPI_FLAGS ...] [TARGET existing_exe])
# Registers NAME as `mpirun -np n <exe> ARGS`; the executable uses tests/mpi_test.h.
function(tide_add_mpi_test name)
  cmake_parse_arguments(T "SLOW" "NP;TIMEOUT;TARGET" "SOURCES;LIBS;ARGS;MPI_FLAGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT ${TIDE_TEST_TIMEOUT})
  endif()
  if(T_TARGET)
    set(exe ${T_TARGET})
  else()
    set(exe ${name})
    add_executable(${exe} ${T_SOURCES})
    target_link_libraries(${exe} PRIVATE ${T_LIBS} MPI::MPI_C tide_core)
    target_include_directories(${exe} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  endif()
  add_test(NAME ${name}
           COMMAND ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS} ${T_MPI_FLAGS} -np ${T_NP}
                   $<TARGET_FILE:${exe}> ${T_ARGS})
  set(labels mpi)
  if(T_SLOW)
    list(APPEND labels slow)
  endif()
  _tide_test_props(${name} "${labels}" ${T_TIMEOUT})
endfunction()

# tide_add_gpu_test(NAME SOURCES a.c... LIBS x... [ARGS ...] [TIMEOUT s])
# Built only with CUDA; the program calls tide_test_require_gpu() (tests/gpu_test.h)
# which exits 77 with "SKIP: no CUDA device present" on machines without a GPU.
function(tide_add_gpu_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;ARGS" ${ARGN})
  if(NOT TIDE_HAVE_CUDA)
    return()
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT ${TIDE_TEST_TIMEOUT})
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} CUDA::cudart tide_core)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE TIDE_HAVE_CUDA=1)
  add_test(NAME ${name} COMMAND ${name} ${T_ARGS})
  _tide_test_props(${name} "gpu" ${T_TIMEOUT})
endfunction()

# tide_add_scenarios(TABLE file PREFIX name TARGET exe [ARGS ...] [PASS regex] [FAIL regex])
# One ctest entry per ROW(...) line of a scenario table (tests/scenarios/<test>.h, read by the
# driver exe too; see tests/support/scenario.h): PREFIX_<name> (PREFIX alone for a row
# named ""), run as `mpirun -np <ranks> exe ARGS` with every SCENARIO in ARGS replaced by
# the row's name, labels mpi and the row's, the row's timeout (a row labelled "external" is
# not registered: a script of its own runs it); a row whose mpi column is
# "recovery" runs under --enable-recovery --mca async_mpi_finalize 1 (a rank dies: mpirun
# must not tear the job down, nor MPI_Finalize wait for the dead). Also PREFIX_table
# (label unit): the driver's `exe --list` must read the table as CMake did.
set(TIDE_RECOVERY_MPI_FLAGS --enable-recovery --mca async_mpi_finalize 1)
function(tide_add_scenarios)
  cmake_parse_arguments(T "" "TABLE;PREFIX;TARGET;PASS;FAIL" "ARGS" ${ARGN})
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${T_TABLE})
  file(STRINGS ${T_TABLE} rows REGEX "^ROW\\(")
  set(listed "")
  foreach(row ${rows})
    string(REGEX MATCHALL "\"[^\"]*\"|[^ \t,()]+" f "${row}")
    list(GET f 1 name)
    list(GET f 2 np)
    list(GET f 3 timeout)
    list(GET f 4 labels)
    list(GET f 5 mpi)
    foreach(v name labels mpi)
      string(REGEX REPLACE "^\"(.*)\"$" "\\1" ${v} "${${v}}")
    endforeach()
    if(name STREQUAL "")
      set(test ${T_PREFIX})
      set(shown "-")
    else()
      set(test ${T_PREFIX}_${name})
      set(shown ${name})
    endif()
    set(flags "")
    if(mpi STREQUAL "recovery")
      set(flags ${TIDE_RECOVERY_MPI_FLAGS})
    elseif(NOT mpi STREQUAL "")
      message(FATAL_ERROR "${T_TABLE}: row ${name}: mpi column '${mpi}' is not \"recovery\" or \"\"")
    endif()
    string(REPLACE "SCENARIO" "${name}" args "${T_ARGS}")
    if(NOT " ${labels} " MATCHES " external ")
      add_test(NAME ${test}
               COMMAND ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS} ${flags} -np ${np}
                       $<TARGET_FILE:${T_TARGET}> ${args})
      set(all_labels mpi)
      if(NOT labels STREQUAL "")
        string(REPLACE " " ";" more "${labels}")
        list(APPEND all_labels ${more})
      endif()
      _tide_test_props(${test} "${all_labels}" ${timeout})
      if(T_PASS)
        set_tests_properties(${test} PROPERTIES PASS_REGULAR_EXPRESSION "${T_PASS}")
      endif()
      if(T_FAIL)
        set_tests_properties(${test} PROPERTIES FAIL_REGULAR_EXPRESSION "${T_FAIL}")
      endif()
    endif()
    foreach(v labels mpi)
      if("${${v}}" STREQUAL "")
        set(${v} "-")
      endif()
    endforeach()
    string(APPEND listed "${shown} ${np} ${timeout} ${labels} ${mpi}\n")
  endforeach()
  set(want ${CMAKE_CURRENT_BINARY_DIR}/scenarios/${T_PREFIX}.list)
  file(WRITE ${want} "${listed}")
  add_test(NAME ${T_PREFIX}_table
           COMMAND bash -c "\"$1\" --list | diff -u \"$2\" -" table
                   $<TARGET_FILE:${T_TARGET}> ${want})
  _tide_test_props(${T_PREFIX}_table "unit" 30)
endfunction()
