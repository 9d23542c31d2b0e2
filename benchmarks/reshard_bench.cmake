# reshard_bench: reshard executor bandwidth vs plain MPI point-to-point (8 ranks), or
# with --backend nccl (built with NCCL) on device memory vs plain NCCL send/recv.
#   mpirun -np 8 build/benchmarks/reshard_bench --max-mib 1024
if(TARGET tide_collectives AND TARGET tide_reshard)
  add_executable(reshard_bench ${CMAKE_CURRENT_SOURCE_DIR}/reshard_bench.c)
  target_link_libraries(reshard_bench PRIVATE tide_collectives tide_reshard tide_core MPI::MPI_C m)
endif()
