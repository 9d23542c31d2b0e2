# Multi-host tests (labels mpi, multihost): a cluster of network namespaces on this
# machine (scripts/cluster.sh), tided with CURVE keys on the bridge address, and the
# real programs launched across the hosts by mpirun. They need root; elsewhere they skip
# (exit 77) with the reason, unless TIDE_REQUIRE_NETNS=1 (.ci/run) makes that a failure.
# Each test makes its own uniquely named cluster and removes it on exit.
if(TARGET tided AND TARGET tidectl AND TARGET train_mlp AND TARGET test_examples_tide)
  # what a launch across the cluster's hosts looks like to MPI (test_multihost_cluster)
  add_executable(mh_probe mh_probe.c)
  target_link_libraries(mh_probe PRIVATE MPI::MPI_C tide_core)
  target_include_directories(mh_probe PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  function(tide_add_multihost_test name)
    cmake_parse_arguments(T "" "TIMEOUT" "ARGS" ${ARGN})
    add_test(NAME ${name}
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/${name}.sh ${PROJECT_BINARY_DIR}
                     ${PROJECT_SOURCE_DIR} ${T_ARGS})
    _tide_test_props(${name} "mpi;multihost" ${T_TIMEOUT})
  endfunction()
  tide_add_multihost_test(test_multihost_cluster TIMEOUT 120)
  tide_add_multihost_test(test_multihost_auth TIMEOUT 480)
  tide_add_multihost_test(test_multihost_resize TIMEOUT 120)
  tide_add_multihost_test(test_multihost_lost TIMEOUT 180)
  tide_add_multihost_test(test_multihost_grow TIMEOUT 420)
  tide_add_multihost_test(test_multihost_regrow TIMEOUT 420)
  tide_add_multihost_test(test_multihost_halt TIMEOUT 180)
  tide_add_multihost_test(test_multihost_rollback TIMEOUT 180)
  tide_add_multihost_test(test_multihost_partition TIMEOUT 300)
  tide_add_multihost_test(test_multihost_elastic TIMEOUT 420)
  tide_add_multihost_test(test_multihost_priority TIMEOUT 300)
  tide_add_multihost_test(test_multihost_elastic4 TIMEOUT 480)
endif()
