# collectives/: the conformance suite (one source, every backend), the kill-one-rank
# recovery test, and the unit tests of the backend-independent pieces.
#
# mpi: the same executable under mpirun -np 2, 4 and 8 (oversubscribed on small
# machines; sizes are small so each run stays well under a minute).
# One program in four sources (conf_fixture.h: what they share; main() in the first).
set(tide_conformance_sources test_collectives_conformance.c test_conf_direct.c
    test_conf_executor.c test_conf_exec_wrapped.c)
add_executable(test_collectives_conformance ${tide_conformance_sources})
target_link_libraries(test_collectives_conformance PRIVATE tide_collectives tide_core MPI::MPI_C)
target_include_directories(test_collectives_conformance PRIVATE ${PROJECT_SOURCE_DIR}/tests)
if(TARGET tide_reshard)
  target_compile_definitions(test_collectives_conformance PRIVATE TIDE_TEST_HAVE_RESHARD=1)
endif()
foreach(np 2 4 8)
  tide_add_mpi_test(test_collectives_conformance_np${np} NP ${np}
                    TARGET test_collectives_conformance ARGS --backend mpi TIMEOUT 90)
endforeach()

# A rank is killed while the others wait on it; they get an error, build a
# communicator without it and complete an allreduce. Needs --enable-recovery so that
# mpirun does not tear the whole job down when the rank dies, and with
# async_mpi_finalize=1: Open MPI 4.1's MPI_Finalize otherwise ends with a PMIx fence
# over every process of the job, which sometimes (about 1 run in 3 here) waits forever
# for the dead one.
add_executable(test_collectives_recovery test_collectives_recovery.c)
target_link_libraries(test_collectives_recovery PRIVATE tide_collectives MPI::MPI_C
                                                        tide_test_support tide_core)
target_include_directories(test_collectives_recovery PRIVATE ${PROJECT_SOURCE_DIR}/tests)
tide_add_scenarios(TABLE ${CMAKE_CURRENT_SOURCE_DIR}/scenarios/test_collectives_recovery.h
                   PREFIX test_collectives_recovery TARGET test_collectives_recovery
                   PASS "recovery: passed" FAIL "FAILED")

# nccl: the same conformance source on one GPU (one-rank communicators, self
# send/recv, the executor on device buffers); exits 77 (skipped) without a GPU.
if(TIDE_HAVE_NCCL)
  tide_add_gpu_test(test_collectives_conformance_nccl SOURCES ${tide_conformance_sources}
                    LIBS tide_collectives MPI::MPI_C ARGS --backend nccl TIMEOUT 120)
  if(TARGET test_collectives_conformance_nccl AND TARGET tide_reshard)
    target_compile_definitions(test_collectives_conformance_nccl PRIVATE
                               TIDE_TEST_HAVE_RESHARD=1)
  endif()
endif()

tide_add_unit_test(test_collectives SOURCES test_collectives.c LIBS tide_collectives)

# The creation handshake makes its payload (the nccl backend's unique id, whose NCCL
# thread lives until every member joins) only once every member arrived, never when one
# does not; a failure to make it reaches every member.
tide_add_mpi_test(test_coll_handshake NP 3 SOURCES test_coll_handshake.c LIBS tide_collectives
                  TIMEOUT 60)

# The nccl backend's stream rules (an offline task's stream at the device's least priority;
# libtide's own work on a non-blocking stream of its thread, never the default one) and
# its NCCL version check, on a CUDA stand-in defined in the test: no GPU needed.
if(TIDE_HAVE_NCCL)
  tide_add_unit_test(test_nccl_streams SOURCES test_nccl_streams.c LIBS tide_collectives)
endif()

# NCCL's bootstrap root thread (started by ncclGetUniqueId on rank 0) does not outlive a
# creation that failed: a member that never came, one that took the id and never joined.
if(TIDE_HAVE_NCCL)
  add_executable(test_nccl_bootstrap test_nccl_bootstrap.c)
  target_link_libraries(test_nccl_bootstrap PRIVATE tide_collectives CUDA::cudart MPI::MPI_C
                                                    tide_core)
  target_include_directories(test_nccl_bootstrap PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  add_test(NAME test_nccl_bootstrap
           COMMAND ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS} -np 2 $<TARGET_FILE:test_nccl_bootstrap>)
  _tide_test_props(test_nccl_bootstrap "gpu" 120)
endif()

# The gate of every GPU test (tests/gpu_test.h): skip only where no NVIDIA device exists,
# fail where one is present but CUDA cannot use it (a fake device node in a private
# mount namespace). Runs everywhere CUDA is built, GPU or not (label unit).
if(TIDE_HAVE_CUDA)
  add_executable(test_gpu_skip test_gpu_skip.c)
  target_link_libraries(test_gpu_skip PRIVATE CUDA::cudart)
  target_include_directories(test_gpu_skip PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  add_test(NAME test_gpu_skip
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_gpu_skip.sh $<TARGET_FILE:test_gpu_skip>)
  _tide_test_props(test_gpu_skip "unit" 60)
  set_tests_properties(test_gpu_skip PROPERTIES PASS_REGULAR_EXPRESSION "test_gpu_skip: passed")
endif()
