# Test helpers. Every test is registered with ctest and a label:
#   unit  Criterion unit tests, seconds in all        tide_add_unit_test()
#   mpi   integration tests run under mpirun          tide_add_mpi_test()
#   gpu   tests that need a CUDA device; they exit 77 tide_add_gpu_test()
#         (skipped) with a message when none is present
#   slow  added to any of the above by passing SLOW
# `ctest -L unit` is the quick loop; the README's test command runs every label.

set(TIDE_TEST_TIMEOUT 120 CACHE STRING "Default per-test timeout (s)")
set(TIDE_SKIP_RC 77)

# mpirun as root needs explicit permission; oversubscribe lets 8 ranks run on 2 cores.
set(TIDE_MPIEXEC_FLAGS --oversubscribe --bind-to none)
execute_process(COMMAND id -u OUTPUT_VARIABLE _tide_uid OUTPUT_STRIP_TRAILING_WHITESPACE)
if(_tide_uid STREQUAL "0")
  list(APPEND TIDE_MPIEXEC_FLAGS --allow-run-as-root)
endif()
set(TIDE_MPIEXEC ${MPIEXEC_EXECUTABLE} CACHE STRING "mpirun used by tests")

# Environment for every test: sanitizer options (Open MPI and libzmq keep some
# allocations for the life of the process; see tests/lsan.supp).
set(TIDE_TEST_ENV
    "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1"
    "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
    "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0"
    "OMPI_MCA_btl=self,vader,tcp" "OMPI_MCA_btl_vader_single_copy_mechanism=none"
    "OMPI_MCA_rmaps_base_oversubscribe=1" "OMPI_MCA_mpi_yield_when_idle=1"
    "TIDE_TEST_SKIP_RC=${TIDE_SKIP_RC}")

function(_tide_test_props name labels timeout)
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
