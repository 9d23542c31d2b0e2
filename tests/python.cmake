# The Python binding (python/tide) through examples/train_torch.py and the real tided,
# under mpirun, and installed with pip against an installed tide; skipped (77) when
# /usr/bin/python3 lacks torch or mpi4py. Not under the
# sanitizers: python3 itself is not built with them, so an ASan libtide cannot load.
if(TARGET tide AND TARGET tided AND TARGET tidectl AND NOT TIDE_SANITIZE)
  foreach(mode api resize recover)
    add_test(NAME test_python_${mode}
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_python.sh ${mode} ${PROJECT_SOURCE_DIR}
                     ${PROJECT_BINARY_DIR} ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
    _tide_test_props(test_python_${mode} "mpi;python" 300)
  endforeach()
  # the GPU path (train_torch --device cuda, CUDA tensors through the collectives and
  # reshard); skips where no NVIDIA device, CUDA PyTorch or nccl backend is
  add_test(NAME test_python_gpu
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_python.sh device ${PROJECT_SOURCE_DIR}
                   ${PROJECT_BINARY_DIR} ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_python_gpu "mpi;python;gpu" 300)
  set_property(TEST test_python_gpu APPEND PROPERTY ENVIRONMENT
               "TIDE_TEST_DEVICE=cuda" "TIDE_TEST_HAVE_NCCL=${TIDE_HAVE_NCCL}")
  # pip install of ./python against a `cmake --install` prefix, found without TIDE_LIB
  add_test(NAME test_python_install
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_python_install.sh ${PROJECT_SOURCE_DIR}
                   ${PROJECT_BINARY_DIR} ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_python_install "mpi;python;install" 300)
endif()
