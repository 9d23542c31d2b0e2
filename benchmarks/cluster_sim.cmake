# cluster_sim: days of a GPU cluster whose capacity changes, every decision made by
# tided's policy code and reshard's planner, against stop-checkpoint-restart.
if(TARGET tide_coord)
  add_executable(cluster_sim cluster_sim.c)
  target_link_libraries(cluster_sim PRIVATE tide_coord tide_reshard tide_core m)
  target_include_directories(cluster_sim PRIVATE ${PROJECT_SOURCE_DIR})
endif()
