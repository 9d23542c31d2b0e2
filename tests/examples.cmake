# examples/: the train_mlp model. Unit tests (kernels, pieces and the whole model against
# finite differences), MPI integration tests (losses of every layout match the
# single-process run; convergence; moves across layouts keep the state), and a GPU test
# (CUDA path matches the CPU path; skips without a device). With tided built: the live
# resize tests (train_mlp's elastic loop on libtide, resized through the real tided and
# tidectl; one executable, one mode per test).
if(TARGET tide_mlp)
  tide_add_unit_test(test_examples SOURCES test_examples.c LIBS tide_mlp TIMEOUT 60)

  add_executable(test_examples_mpi test_examples_mpi.c)
  target_link_libraries(test_examples_mpi PRIVATE tide_mlp MPI::MPI_C tide_test_support tide_core)
  target_include_directories(test_examples_mpi PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  tide_add_scenarios(TABLE ${CMAKE_CURRENT_SOURCE_DIR}/scenarios/test_examples_mpi.h
                     PREFIX test_examples_mpi TARGET test_examples_mpi ARGS SCENARIO)
  # Distributed checkpoints: save under one layout, load under another.
  add_executable(test_examples_ckpt test_examples_ckpt.c)
  target_link_libraries(test_examples_ckpt PRIVATE tide_mlp MPI::MPI_C tide_test_support tide_core)
  target_include_directories(test_examples_ckpt PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  tide_add_scenarios(TABLE ${CMAKE_CURRENT_SOURCE_DIR}/scenarios/test_examples_ckpt.h
                     PREFIX test_examples_ckpt TARGET test_examples_ckpt)
  # The program itself: flags, layout, loss printed identically on all ranks.
  tide_add_mpi_test(test_train_mlp_np8 NP 8 TARGET train_mlp
                    ARGS --dp 2 --tp 2 --pp 2 --steps 3 --print-every 1 TIMEOUT 60)
  # Flags it refuses, with a message that says what to do instead.
  tide_add_mpi_test(test_train_mlp_tide_stages NP 1 TARGET train_mlp
                    ARGS --tide --pp 2 --stages 0-2,3-3 TIMEOUT 30)
  set_tests_properties(test_train_mlp_tide_stages PROPERTIES
                       PASS_REGULAR_EXPRESSION "tidectl resize --stages")
  tide_add_mpi_test(test_train_mlp_ckpt_missing NP 1 TARGET train_mlp
                    ARGS --steps 1 --ckpt-load /nonexistent/tide-ckpt TIMEOUT 30)
  set_tests_properties(test_train_mlp_ckpt_missing PROPERTIES
                       PASS_REGULAR_EXPRESSION "cannot open checkpoint root /nonexistent/tide-ckpt")

  if(TARGET tided AND TARGET tidectl AND TARGET tide_mlp_tide)
    add_executable(test_examples_tide test_examples_tide.c)
    target_link_libraries(test_examples_tide PRIVATE tide_mlp_tide tide_proto PkgConfig::ZMQ
                                                     MPI::MPI_C tide_test_support tide_core)
    target_include_directories(test_examples_tide PRIVATE ${PROJECT_SOURCE_DIR}/tests)
    add_dependencies(test_examples_tide tided tidectl tide-ckpt)
    # one entry per row of the table (mixed*: at every switch tide-ckpt converts a
    # checkpoint of the old layout into the new one, which must equal the live state after
    # the reshard)
    tide_add_scenarios(TABLE ${CMAKE_CURRENT_SOURCE_DIR}/scenarios/test_examples_tide.h
                       PREFIX test_examples_tide TARGET test_examples_tide
                       ARGS $<TARGET_FILE:tided> $<TARGET_FILE:tidectl> SCENARIO
                            $<TARGET_FILE:tide-ckpt>)

    # A member of the running job is killed (SIGKILL); tided detects it by heartbeats and
    # recovers the job over the survivors (replica: dp 1 on 8 ranks; midstep: the same, the
    # victim dying between its backward pass and its gradient allreduce; lastreduce: dying
    # inside the step's last reductions, so some survivors finish the step alone; spare: a 9th, idle
    # rank takes its place; zero1: the lost ZeRO-1 moments have no replica, so tided must
    # stall the job and say why; stopped: the victim is SIGSTOPped instead, resumed once the
    # job recovered without it, and must be fenced and leave; layout: dp 4 whose batch dp 3
    # cannot split recovers to dp 2 and refuses `tidectl resize --dp 3`; ckpt-zero1 and
    # ckpt-dp1: state that no survivor holds, ZeRO-1 moments on 8 ranks or a tp shard of dp 1
    # on 2, so tided rolls the job back to its last periodic checkpoint; ckpt-corrupt: as
    # ckpt-zero1, but the victim damages a shard of that checkpoint before it dies, so its load
    # fails on every member, tided refuses it and rolls back to the one before; ckpt-request:
    # 2 ranks, nobody dies: `tidectl checkpoint` while the job trains, and the checkpoint saved
    # at the step tided chose holds exactly the state after it). --enable-recovery
    # keeps mpirun from tearing the job down when
    # the rank dies, async_mpi_finalize keeps MPI_Finalize from waiting for it (see
    # collectives.cmake); the pass line is printed after every check on every survivor.
    # one executable of five sources: the driver (test_examples_tide_recover.c; the table
    # and main), the training hooks, what tided and tidectl report, the checkpoint scenarios
    # and the resizes (tide_recover_*.c, sharing tide_recover_int.h; not
    # test_examples_tide_*.c, which reads as an executable's name)
    add_executable(test_examples_tide_recover test_examples_tide_recover.c tide_recover_hooks.c
                                              tide_recover_tided.c tide_recover_ckpt.c
                                              tide_recover_resize.c)
    target_link_libraries(test_examples_tide_recover PRIVATE tide_mlp_tide tide_proto
                                                             PkgConfig::ZMQ MPI::MPI_C
                                                             tide_test_support tide_core)
    target_include_directories(test_examples_tide_recover PRIVATE ${PROJECT_SOURCE_DIR}/tests)
    add_dependencies(test_examples_tide_recover tided tidectl)
    # one entry per row of the table (ranks, timeouts: stopped waits for the recovery; the
    # ckpt rows' victim waits for its checkpoint to be reported and every member loads
    # from disk; ckpt-request runs 24 slow steps)
    tide_add_scenarios(TABLE ${CMAKE_CURRENT_SOURCE_DIR}/scenarios/test_examples_tide_recover.h
                       PREFIX test_examples_tide_recover TARGET test_examples_tide_recover
                       ARGS $<TARGET_FILE:tided> $<TARGET_FILE:tidectl> SCENARIO
                       PASS "test_examples_tide_recover: passed"
                       FAIL "FAILED|ERROR: (Address|Leak)Sanitizer|runtime error:")
  endif()

  tide_add_gpu_test(test_examples_gpu SOURCES test_examples_gpu.c LIBS tide_mlp TIMEOUT 120)
endif()

# Bubble filling: offline plugin steps inside a two-stage pipeline's bubbles, with the
# real tided and tidectl; the training losses must not change.
if(TARGET tide_mlp AND TARGET tided AND TARGET tidectl AND TARGET tide_mlp_tide
   AND TARGET tide_task_matmul)
  add_executable(test_examples_bubbles test_examples_bubbles.c)
  target_link_libraries(test_examples_bubbles PRIVATE tide_mlp_tide tide_proto PkgConfig::ZMQ
                                                      MPI::MPI_C tide_test_support tide_core
                                                      ${CMAKE_DL_LIBS})
  target_include_directories(test_examples_bubbles PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  # task_probe: a test plugin that writes the tide_task_env it was given (device, ...)
  add_library(tide_task_probe MODULE task_probe.c)
  target_include_directories(tide_task_probe PRIVATE ${PROJECT_SOURCE_DIR}/include)
  add_dependencies(test_examples_bubbles tided tidectl tide_task_matmul tide_task_probe)
  tide_add_scenarios(TABLE ${CMAKE_CURRENT_SOURCE_DIR}/scenarios/test_examples_bubbles.h
                     PREFIX test_examples_bubbles TARGET test_examples_bubbles
                     ARGS $<TARGET_FILE:tided> $<TARGET_FILE:tidectl>
                          $<TARGET_FILE:tide_task_matmul> $<TARGET_FILE:tide_task_probe>)
endif()
