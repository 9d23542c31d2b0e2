# copy_bench: GB/s of each host copy the mpi backend can use between two processes
# (memcpy, kernel single copy contiguous / strided push / strided pull), and the
# reshard_bench ratio those allow when the cores are all busy.
#   build/benchmarks/copy_bench [--mib 64] [--reps 7]
if(TARGET tide_core)
  add_executable(copy_bench ${CMAKE_CURRENT_LIST_DIR}/copy_bench.c)
  target_link_libraries(copy_bench PRIVATE tide_core)
endif()
