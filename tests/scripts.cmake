# scripts/: the shell entry points. Every script must parse (bash -n) and pass
# shellcheck at warning level (label unit); scripts/gpu-check.sh runs every one of its
# steps on the cpu with the mpi backend and small sizes (--cpu-dry, label mpi, ~40 s):
# the same functions, command lines, rank wrapper, tided/tidectl driving, loss
# comparisons, benchmarks, budget and summary a GPU machine runs, on this build
# (SKIP_BUILD=1), so that the GPU check cannot rot where no GPU is.
find_program(TIDE_SHELLCHECK shellcheck)
file(GLOB tide_scripts ${PROJECT_SOURCE_DIR}/scripts/*.sh)
string(REPLACE ";" " " tide_scripts "${tide_scripts}")
set(tide_lint "for s in ${tide_scripts}; do bash -n \"$s\" || exit 1; done")
if(TIDE_SHELLCHECK)
  string(APPEND tide_lint "; ${TIDE_SHELLCHECK} -S warning ${tide_scripts}")
endif()
add_test(NAME scripts_lint COMMAND bash -c "${tide_lint}")
set_tests_properties(scripts_lint PROPERTIES LABELS unit TIMEOUT 60)

# resize_bench is defined later (benchmarks/ comes after tests/)
# Not in the sanitizer build: the script launches its programs without the tests' LSan
# suppressions (Open MPI keeps allocations for the life of a process).
if(TARGET tided AND TARGET tidectl AND TARGET train_mlp AND TIDE_BUILD_BENCHMARKS AND NOT TIDE_SANITIZE)
  add_test(NAME gpu_check_cpu_dry
           COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/gpu-check.sh --cpu-dry)
  set_tests_properties(gpu_check_cpu_dry PROPERTIES
                       LABELS mpi TIMEOUT 400 RUN_SERIAL TRUE
                       ENVIRONMENT "SKIP_BUILD=1;BUILD_DIR=${PROJECT_BINARY_DIR};TIDE_PYTHON=/usr/bin/python3"
                       PASS_REGULAR_EXPRESSION "gpu-check: all passed"
                       FAIL_REGULAR_EXPRESSION "gpu-check: FAILED")
endif()

# gpu-check.sh's decisions that need no GPU (tests/test_gpu_check.sh): gpu-info with device
# nodes but no nvidia-smi asks the CUDA driver (faked), a broken or missing driver fails,
# no node means no GPU; a failed train-ref leaves train-elastic NOT-RUN in the summary; a
# step the budget cuts is TIMEOUT(budget) (about 25 s of the test, which took 60-120 s alone
# on 2 loaded cores).
if(TARGET tided AND TARGET tidectl AND TARGET train_mlp AND NOT TIDE_SANITIZE)
  add_test(NAME gpu_check_paths
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_gpu_check.sh ${PROJECT_BINARY_DIR})
  set_tests_properties(gpu_check_paths PROPERTIES
                       LABELS mpi TIMEOUT 300
                       PASS_REGULAR_EXPRESSION "test_gpu_check: passed"
                       FAIL_REGULAR_EXPRESSION "FAILED: ")
endif()

# scripts/gpu-bundle.sh and gpu-check.sh --bundle (tests/test_gpu_bundle.sh). gpu_bundle_make
# (a fixture, run beside other tests) makes a fresh bundle from its own Release build tree
# (gpu-bundle/build here, reused between runs): under 48 MiB, no NCCL, CUDA runtime or
# cuBLAS in it. gpu_bundle runs every --cpu-dry step from it inside a mount namespace where
# the system's Open MPI, ZeroMQ, msgpack-c, SQLite, Criterion, pkg-config and every library
# it carries are hidden; a python3 without torch leaves python-gpu skipped with the
# reason; a missing NCCL fails the bundle step naming where it was looked for, and NCCL
# laid out as its wheel is found.
if(TIDE_HAVE_NCCL AND TARGET tided AND TARGET train_mlp AND TIDE_BUILD_BENCHMARKS
   AND NOT TIDE_SANITIZE)
  add_test(NAME gpu_bundle_make
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_gpu_bundle.sh make
                   ${PROJECT_BINARY_DIR}/gpu-bundle)
  set_tests_properties(gpu_bundle_make PROPERTIES
                       LABELS mpi TIMEOUT 900 FIXTURES_SETUP gpu_bundle
                       PASS_REGULAR_EXPRESSION "test_gpu_bundle\\(make\\): passed"
                       FAIL_REGULAR_EXPRESSION "FAILED: ")
  add_test(NAME gpu_bundle
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_gpu_bundle.sh check
                   ${PROJECT_BINARY_DIR}/gpu-bundle)
  set_tests_properties(gpu_bundle PROPERTIES
                       LABELS mpi TIMEOUT 600 RUN_SERIAL TRUE SKIP_RETURN_CODE 77
                       FIXTURES_REQUIRED gpu_bundle
                       PASS_REGULAR_EXPRESSION "test_gpu_bundle\\(check\\): passed"
                       FAIL_REGULAR_EXPRESSION "FAILED: ")
endif()

# benchmarks/report over canned results (tests/data/bench): the HTML page, its four
# gnuplot plots and the numbers in them (tests/test_bench_report.sh; skipped without
# gnuplot).
add_test(NAME test_bench_report
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_bench_report.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(test_bench_report PROPERTIES LABELS unit TIMEOUT 60 SKIP_RETURN_CODE 77)

# Every tidectl and tided command the README and the operator's pages show, and every
# flag docs/operator.md names, exists in the built programs' --help
# (tests/test_docs_commands.py; no tided is started).
if(TARGET tided AND TARGET tidectl)
  add_test(NAME test_docs_commands
           COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/test_docs_commands.py
                   ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  # the tests' environment: under the sanitizers, train_mlp --help starts Open MPI, whose
  # lifetime allocations tests/lsan.supp names
  set_tests_properties(test_docs_commands PROPERTIES LABELS unit TIMEOUT 60
                       ENVIRONMENT "${TIDE_TEST_ENV}"
                       PASS_REGULAR_EXPRESSION "test_docs_commands: passed")
endif()
