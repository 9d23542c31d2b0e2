# hostile_bench: a job heartbeating while hostile clients flood tided at full speed;
# reports healthy workers declared failed (must be 0) and tided's peak RSS.
if(TARGET tided)
  add_executable(hostile_bench hostile_bench.c)
  target_link_libraries(hostile_bench PRIVATE tide_proto tide_core PkgConfig::ZMQ Threads::Threads)
  target_include_directories(hostile_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(hostile_bench PRIVATE TIDED_PATH="$<TARGET_FILE:tided>")
  add_dependencies(hostile_bench tided)
endif()
