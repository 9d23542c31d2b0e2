# resize_bench: downtime of a live layout change (libtide) versus checkpoint-restart
# (per-rank files, mpirun relaunch, reload) for train_mlp's >= 1 GiB state, in one run.
if(TARGET tided AND TARGET train_mlp)
  add_executable(resize_bench resize_bench.c)
  target_link_libraries(resize_bench PRIVATE tide_proto tide_core PkgConfig::ZMQ m)
  target_include_directories(resize_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(resize_bench PRIVATE TIDED_PATH="$<TARGET_FILE:tided>"
                             TRAIN_MLP_PATH="$<TARGET_FILE:train_mlp>"
                             MPIRUN_PATH="${MPIEXEC_EXECUTABLE}")
  add_dependencies(resize_bench tided train_mlp)
endif()
