# coord_bench: tided CPU and status latency under 1,000 / 10,000 / 100,000 heartbeating workers.
if(TARGET tided)
  add_executable(coord_bench coord_bench.c)
  target_link_libraries(coord_bench PRIVATE tide_proto tide_core PkgConfig::ZMQ m)
  target_include_directories(coord_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_definitions(coord_bench PRIVATE TIDED_PATH="$<TARGET_FILE:tided>")
  add_dependencies(coord_bench tided)
endif()
