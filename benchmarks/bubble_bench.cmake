# bubble_bench: the share of a pipeline's bubble time that offline plugin steps fill,
# and the online job's slowdown, train_mlp --tide with and without a --bubbles job.
if(TARGET tided AND TARGET train_mlp AND TARGET tide_task_matmul)
  add_executable(bubble_bench bubble_bench.c)
  target_link_libraries(bubble_bench PRIVATE tide_proto tide_core PkgConfig::ZMQ m)
  target_include_directories(bubble_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(bubble_bench PRIVATE TIDED_PATH="$<TARGET_FILE:tided>"
                             TRAIN_MLP_PATH="$<TARGET_FILE:train_mlp>"
                             MPIRUN_PATH="${MPIEXEC_EXECUTABLE}"
                             PLUGIN_DIR="$<TARGET_FILE_DIR:tide_task_matmul>")
  add_dependencies(bubble_bench tided train_mlp tide_task_matmul)
endif()
