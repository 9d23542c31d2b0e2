# worker/ (libtide) tests: unit tests of the runtime pieces (mailbox, step agreement,
# control client against a fake tided, offline runner) and an MPI integration test that
# resizes a toy job through the real tided.
tide_add_unit_test(test_worker SOURCES test_worker.c LIBS tide_worker tide_proto
                   PkgConfig::ZMQ TIMEOUT 60)
if(TARGET tided)
  tide_add_mpi_test(test_worker_mpi NP 6 SOURCES test_worker_mpi.c
                    LIBS tide_worker tide_proto PkgConfig::ZMQ
                    ARGS $<TARGET_FILE:tided> TIMEOUT 120)
  add_dependencies(test_worker_mpi tided)
endif()
