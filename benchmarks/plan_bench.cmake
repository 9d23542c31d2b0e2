# plan_bench: reshard planner scale (175B GPT over ~1,000 workers) and placement.
# Run: ./plan_bench [--reps N] [--out bench-out/plan_bench.json]
if(TARGET tide_reshard)
  add_executable(plan_bench ${CMAKE_CURRENT_LIST_DIR}/plan_bench.c)
  target_link_libraries(plan_bench PRIVATE tide_reshard tide_core)
endif()
