# ckpt_bench: training time a checkpoint costs (train_mlp, asynchronous vs synchronous
# saves) and load-into-a-new-layout throughput vs the disk's sequential read, one run.
#   build/benchmarks/ckpt_bench [--reps 3] [--steps 100] [--every 5] [--ranks 1]
if(TARGET tide_ckpt AND TARGET train_mlp)
  add_executable(ckpt_bench ckpt_bench.c)
  target_link_libraries(ckpt_bench PRIVATE tide_ckpt tide_core Threads::Threads)
  target_include_directories(ckpt_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(ckpt_bench PRIVATE TRAIN_MLP_PATH="$<TARGET_FILE:train_mlp>"
                             MPIRUN_PATH="${MPIEXEC_EXECUTABLE}")
  add_dependencies(ckpt_bench train_mlp)
endif()
