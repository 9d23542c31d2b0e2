# Coordinator tests: policy/state/store in-process (unit), and tided itself
# started on a free loopback port with temporary state files (unit, a few s).
if(TARGET tide_coord)
  # one executable of three sources: policy (test_coordinator.c), state and store
  # (test_coord_state.c, test_coord_store.c; not test_coordinator_*.c, the names of
  # executables of their own below)
  tide_add_unit_test(test_coordinator SOURCES test_coordinator.c test_coord_state.c
                     test_coord_store.c LIBS tide_coord PkgConfig::SQLITE3 TIMEOUT 30)
  # state files an older tided wrote (tests/data/README.md)
  target_compile_definitions(test_coordinator PRIVATE
                             TIDE_TEST_DATA="${CMAKE_CURRENT_SOURCE_DIR}/data")
  tide_add_unit_test(test_coordinator_policy SOURCES test_coordinator_policy.c LIBS tide_coord
                     TIMEOUT 30)
endif()
if(TARGET tided)
  # tided's parts, one process (and one tided per test) each; tests/tided_fixture.h
  foreach(part server:180 offline:120 workers:120 hosts:120 ckpt:60 auth:60 metrics:60
               elastic:120)
    string(REPLACE ":" ";" part "${part}")
    list(GET part 0 name)
    list(GET part 1 timeout)
    tide_add_unit_test(test_coordinator_${name} SOURCES test_coordinator_${name}.c
                       LIBS tide_proto PkgConfig::ZMQ TIMEOUT ${timeout})
    target_compile_definitions(test_coordinator_${name} PRIVATE
                               TIDED_PATH="$<TARGET_FILE:tided>"
                               TIDECTL_PATH="$<TARGET_FILE:tidectl>")
    add_dependencies(test_coordinator_${name} tided tidectl)
  endforeach()
endif()
if(TARGET tided)
  tide_add_unit_test(test_reliability SOURCES test_reliability.c
                     LIBS tide_proto PkgConfig::ZMQ Threads::Threads TIMEOUT 120)
  target_compile_definitions(test_reliability PRIVATE TIDED_PATH="$<TARGET_FILE:tided>")
  add_dependencies(test_reliability tided)
  # tided on a small tmpfs that fills: degraded, recovering, persisted again (needs root)
  tide_add_unit_test(test_state_disk SOURCES test_state_disk.c
                     LIBS tide_proto PkgConfig::ZMQ TIMEOUT 90)
  target_compile_definitions(test_state_disk PRIVATE TIDED_PATH="$<TARGET_FILE:tided>"
                                                     TIDECTL_PATH="$<TARGET_FILE:tidectl>")
  add_dependencies(test_state_disk tided tidectl)
endif()
# A real training job under a hostile flood (test_flood_job.sh): no healthy worker failed.
if(TIDE_BUILD_BENCHMARKS AND TARGET tided AND TARGET tidectl AND TARGET train_mlp
   AND TARGET mlp_state_diff) # hostile_bench: benchmarks/, added after tests/
  add_test(NAME test_flood_job
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_flood_job.sh ${PROJECT_BINARY_DIR}
                   ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_flood_job "mpi" 240)
endif()
# What `tidectl jobs` shows as a job's speed, and a checkpoint request scheduled from it
if(TARGET tided AND TARGET tidectl AND TARGET train_mlp)
  add_test(NAME test_job_speed
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_job_speed.sh ${PROJECT_BINARY_DIR}
                   ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_job_speed "mpi" 180)
  # Checkpoint requests held by an idle rank, then a resize that makes it a member
  add_test(NAME test_ckpt_idle
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt_idle.sh ${PROJECT_BINARY_DIR}
                   ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_ckpt_idle "mpi" 180)
endif()
# The product's files call each other one way only, never in a cycle, within a folder or
# across folders (scripts/call_cycles.py, which must also see the two-file cycle made up here).
find_program(TIDE_PYTHON3 python3)
if(TIDE_PYTHON3)
  set(tide_cycles "${TIDE_PYTHON3} ${PROJECT_SOURCE_DIR}/scripts/call_cycles.py")
  add_test(NAME coordinator_call_cycles
           COMMAND bash -c "cd ${PROJECT_SOURCE_DIR} && ${tide_cycles} core ckpt reshard collectives proto worker coordinator || exit 1; \
d=$(mktemp -d) && trap 'rm -rf $d' EXIT && \
printf 'void a(void)\\n{\\n    b();\\n}\\n' > $d/a.c && \
printf 'void b(void)\\n{\\n    a();\\n}\\n' > $d/b.c && \
! ${tide_cycles} $d > /dev/null")
  set_tests_properties(coordinator_call_cycles PROPERTIES LABELS unit TIMEOUT 60)
endif()
# The elastic policy: scenarios and randomised properties (coordinator/elastic).
if(TARGET tide_coord)
  tide_add_unit_test(test_elastic SOURCES test_elastic.c LIBS tide_coord TIMEOUT 60)
endif()
# tidectl timeline and the event queries on a real resized job with backfill
# (test_timeline.sh; the picture read back by timeline_check.py).
if(TIDE_PYTHON3 AND TARGET tided AND TARGET tidectl AND TARGET train_mlp
   AND TARGET tide_task_matmul)
  add_test(NAME test_timeline
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_timeline.sh ${PROJECT_BINARY_DIR}
                   ${TIDE_PYTHON3} ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_timeline "mpi" 420)
endif()
# tided's live cluster page in headless chromium against a real job resized with tidectl
# (test_page.sh; skips where chromium is absent, CI installs it).
if(TIDE_PYTHON3 AND TARGET tided AND TARGET tidectl AND TARGET train_mlp)
  add_test(NAME test_page
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_page.sh ${PROJECT_BINARY_DIR}
                   ${TIDE_PYTHON3} ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_page "mpi" 240)
endif()
# coordinator/child: the commands tided runs beside its loop (the Slurm provider's).
if(TARGET tide_coord)
  tide_add_unit_test(test_child SOURCES test_child.c LIBS tide_coord TIMEOUT 60)
endif()
# coordinator/slurm: the Slurm provider against fake Slurm commands.
if(TARGET tide_coord)
  tide_add_unit_test(test_slurm_provider SOURCES test_slurm_provider.c LIBS tide_coord TIMEOUT 60)
endif()
# coordinator/allocs: the pools' scheduler allocations, in memory and in the state file.
if(TARGET tide_coord)
  tide_add_unit_test(test_allocs SOURCES test_allocs.c LIBS tide_coord PkgConfig::SQLITE3 TIMEOUT 30)
endif()
