# ckpt_bench: training time a checkpoint costs (train_mlp, asynchronous vs synchronous
# saves), load-into-a-new-layout throughput vs the disk's sequential read, and a --tide
# job's step rate with a full checkpoint disk vs a working one, one run.
#   build/benchmarks/ckpt_bench [--reps 3] [--steps 100] [--every 5] [--ranks 1] [--disk-only]
if(TARGET tide_ckpt AND TARGET train_mlp AND TARGET tided)
  add_executable(ckpt_bench ckpt_bench.c)
  target_link_libraries(ckpt_bench PRIVATE tide_ckpt tide_proto tide_core PkgConfig::ZMQ
                        Threads::Threads)
  target_include_directories(ckpt_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(ckpt_bench PRIVATE TRAIN_MLP_PATH="$<TARGET_FILE:train_mlp>"
                             MPIRUN_PATH="${MPIEXEC_EXECUTABLE}" TIDED_PATH="$<TARGET_FILE:tided>")
  add_dependencies(ckpt_bench train_mlp tided)
endif()
