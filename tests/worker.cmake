# worker/ (libtide) tests: unit tests of the runtime pieces (mailbox, step agreement,
# bubble decisions), of the control client against a fake tided (test_worker_ctl.c) and of
# the offline runner (test_worker_child.c), an MPI integration test that resizes a toy job
# through the real tided, and one of the failures around communicators.
tide_add_unit_test(test_worker SOURCES test_worker.c LIBS tide_worker tide_proto TIMEOUT 60)
tide_add_unit_test(test_worker_ctl SOURCES test_worker_ctl.c LIBS tide_worker tide_proto
                   PkgConfig::ZMQ TIMEOUT 60)
tide_add_unit_test(test_worker_child SOURCES test_worker_child.c LIBS tide_worker tide_proto
                   PkgConfig::ZMQ TIMEOUT 60)
# An offline command's memory and process limits (tests/test_offline_limits.c): the rlimits
# and cgroup files the keeper sets, and attempts allocating or forking past their limit.
tide_add_unit_test(test_offline_limits SOURCES test_offline_limits.c LIBS tide_worker
                   TIMEOUT 60)
# The same limits end to end (test_offline_limits_job.sh): commands allocating and forking
# past them on the spare rank of a real train_mlp --tide job; what tidectl shows, the
# retries, nothing left running, and the training job untouched.
if(TARGET tided AND TARGET tidectl AND TARGET train_mlp AND TARGET mlp_state_diff)
  add_test(NAME test_offline_limits_job
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_offline_limits_job.sh
                   ${PROJECT_BINARY_DIR} ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_offline_limits_job "mpi" 180)
endif()
# The layout switch's phases one by one (tests/test_worker_switch.c): a runtime put
# together by hand on 2 ranks, a recording port instead of tided, failures injected
# between every two phases; no tided needed.
tide_add_mpi_test(test_worker_switch NP 2 SOURCES test_worker_switch.c
                  LIBS tide_worker tide_proto tide_ckpt TIMEOUT 120)
set_tests_properties(test_worker_switch PROPERTIES
                     PASS_REGULAR_EXPRESSION "test_worker_switch: passed"
                     FAIL_REGULAR_EXPRESSION "FAILED|ERROR: (Address|Leak)Sanitizer|runtime error:")

if(TARGET tided)
  add_executable(test_worker_mpi test_worker_mpi.c)
  target_link_libraries(test_worker_mpi PRIVATE tide_worker tide_proto PkgConfig::ZMQ MPI::MPI_C
                                                tide_test_support tide_core)
  target_include_directories(test_worker_mpi PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  add_dependencies(test_worker_mpi tided)
  tide_add_scenarios(TABLE ${CMAKE_CURRENT_SOURCE_DIR}/scenarios/test_worker_mpi.h
                     PREFIX test_worker_mpi TARGET test_worker_mpi ARGS $<TARGET_FILE:tided>)

  # Failures around communicators (tests/test_worker_faults.c): a member dying while
  # tide_join builds the first layout's communicators, one dying while a switch builds
  # the new layout's, collectives failing with every peer alive, a member dying while the
  # communicators of an announced layout are built ahead (prepdie), an announced
  # generation aborted after they were (prepabort), and the order of a leaving rank's done
  # and its pool's trim (trim). A rank dies in some: --enable-recovery keeps mpirun from tearing the job down, async_mpi_finalize
  # keeps MPI_Finalize from waiting for it (see collectives.cmake).
  add_executable(test_worker_faults test_worker_faults.c)
  target_link_libraries(test_worker_faults PRIVATE tide_worker tide_proto PkgConfig::ZMQ
                                                   MPI::MPI_C tide_test_support tide_core)
  target_include_directories(test_worker_faults PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  add_dependencies(test_worker_faults tided)
  tide_add_scenarios(TABLE ${CMAKE_CURRENT_SOURCE_DIR}/scenarios/test_worker_faults.h
                     PREFIX test_worker_faults TARGET test_worker_faults
                     ARGS $<TARGET_FILE:tided> SCENARIO
                     PASS "test_worker_faults: passed"
                     FAIL "FAILED|ERROR: (Address|Leak)Sanitizer|runtime error:")
endif()

# Host heartbeats with the real tided (tests/test_worker_hostbeat.c): four ranks send one
# message per period through their leader (and one each with TIDE_HEARTBEAT_AGGREGATE=0);
# a non-leader or the leader killed is the only worker tided fails. A rank dies in the last
# two: --enable-recovery keeps mpirun from tearing the job down.
if(TARGET tided)
  add_executable(test_worker_hostbeat test_worker_hostbeat.c)
  target_link_libraries(test_worker_hostbeat PRIVATE tide_worker tide_proto PkgConfig::ZMQ
                                                     MPI::MPI_C tide_test_support tide_core)
  target_include_directories(test_worker_hostbeat PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  add_dependencies(test_worker_hostbeat tided)
  tide_add_scenarios(TABLE ${CMAKE_CURRENT_SOURCE_DIR}/scenarios/test_worker_hostbeat.h
                     PREFIX test_worker_hostbeat TARGET test_worker_hostbeat
                     ARGS $<TARGET_FILE:tided> SCENARIO
                     PASS "test_worker_hostbeat: passed"
                     FAIL "FAILED|ERROR: (Address|Leak)Sanitizer|runtime error:")
endif()
# worker/sched: a launch's Slurm allocation from its environment, and its leave signal.
tide_add_unit_test(test_sched SOURCES test_sched.c LIBS tide_worker TIMEOUT 30)
