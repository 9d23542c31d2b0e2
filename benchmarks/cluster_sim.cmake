# cluster_sim: a week of a 10,000-GPU cluster shared by online jobs of four priorities and
# offline work, decided by tided's elastic policy, recovery and planner, against
# checkpoint-restart elasticity and static allocation.
if(TARGET tide_coord)
  add_executable(cluster_sim cluster_sim.c)
  target_link_libraries(cluster_sim PRIVATE tide_coord tide_reshard tide_core m)
  target_include_directories(cluster_sim PRIVATE ${PROJECT_SOURCE_DIR})
  # A day at 2,400 GPUs (seconds): the three ways run, the policy never refuses its own
  # inputs, and tide's goodput is above both others' on that trace.
  add_test(NAME cluster_sim_day
           COMMAND cluster_sim --hosts 300 --days 1 --pretrain-jobs 1 --expect-ahead
                   --out ${PROJECT_BINARY_DIR}/bench-out/cluster_sim_day.json)
  set_tests_properties(cluster_sim_day PROPERTIES LABELS unit TIMEOUT 240
                                                  ENVIRONMENT "${TIDE_TEST_ENV}")
endif()
