# Slurm tests (labels mpi, multihost, slurm): a Slurm cluster (scripts/slurm.sh: slurmctld,
# a slurmd per namespace host, munge) on a namespace cluster of scripts/cluster.sh, and the
# real tided, tidectl and train_mlp launched by sbatch one pool per node
# (scripts/tide-slurm-pools.sh). They need root and Slurm's packages; elsewhere they skip
# (exit 77) with the reason, unless TIDE_REQUIRE_NETNS=1 makes that a failure.
if(TARGET tided AND TARGET tidectl AND TARGET train_mlp)
  function(tide_add_slurm_test name)
    cmake_parse_arguments(T "" "TIMEOUT" "ARGS" ${ARGN})
    add_test(NAME ${name}
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/${name}.sh ${PROJECT_BINARY_DIR}
                     ${PROJECT_SOURCE_DIR} ${T_ARGS})
    _tide_test_props(${name} "mpi;multihost;slurm" ${T_TIMEOUT})
  endfunction()
  tide_add_slurm_test(test_slurm_cluster TIMEOUT 120)
  tide_add_slurm_test(test_slurm_grow TIMEOUT 360)
  tide_add_slurm_test(test_slurm_preempt TIMEOUT 360)
endif()
