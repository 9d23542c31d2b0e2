# examples/: the train_mlp model. Unit tests (kernels, pieces and the whole model against
# finite differences), MPI integration tests (losses of every layout match the
# single-process run; convergence; moves across layouts keep the state), and a GPU test
# (CUDA path matches the CPU path; skips without a device).
if(TARGET tide_mlp)
  tide_add_unit_test(test_examples SOURCES test_examples.c LIBS tide_mlp TIMEOUT 60)

  add_executable(test_examples_mpi test_examples_mpi.c)
  target_link_libraries(test_examples_mpi PRIVATE tide_mlp MPI::MPI_C tide_core)
  target_include_directories(test_examples_mpi PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  tide_add_mpi_test(test_examples_mpi_layouts_np2 NP 2 TARGET test_examples_mpi
                    ARGS layouts 5 TIMEOUT 60)
  tide_add_mpi_test(test_examples_mpi_layouts_np8 NP 8 TARGET test_examples_mpi
                    ARGS layouts 5 TIMEOUT 60)
  tide_add_mpi_test(test_examples_mpi_converge NP 8 TARGET test_examples_mpi
                    ARGS converge 30 TIMEOUT 60)
  tide_add_mpi_test(test_examples_mpi_relayout NP 8 TARGET test_examples_mpi
                    ARGS relayout 2 TIMEOUT 60)
  # The program itself: flags, layout, loss printed identically on all ranks.
  tide_add_mpi_test(test_train_mlp_np8 NP 8 TARGET train_mlp
                    ARGS --dp 2 --tp 2 --pp 2 --steps 3 --print-every 1 TIMEOUT 60)

  tide_add_gpu_test(test_examples_gpu SOURCES test_examples_gpu.c LIBS tide_mlp TIMEOUT 120)
endif()
