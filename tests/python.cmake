# The Python package (python/tide, tide.torch) under pytest (Debian's python3-pytest) with
# the real tided: SPMD files run under mpirun (every rank a pytest session, meeting in
# tide's collectives), driver files as one process that launches the training programs
# under mpirun (tests/python/conftest.py). A file whose every test skipped (torch or
# mpi4py missing for /usr/bin/python3, no GPU) exits 77: skip. Under the sanitizers only
# the drivers that load no libtide into python3 (not built with them, so an ASan libtide
# cannot load there): they run the sanitized programs and fail on a report in their logs.
if(TARGET tide AND TARGET tided AND TARGET tidectl)
  set(_py ${TIDE_PYTHON})
  if(NOT _py)
    set(_py /usr/bin/python3)
  endif()
  string(REPLACE ";" " " _mpirun "${TIDE_MPIEXEC};${TIDE_MPIEXEC_FLAGS}")
  # the build and mpirun reach conftest.py through the environment (its options' defaults)
  set(_pytest -m pytest -q -rs -p no:cacheprovider --color=no)
  set(_pydir ${CMAKE_CURRENT_SOURCE_DIR}/python)
  # tide_add_pytest(NAME FILE [NP n] [TIMEOUT s] [LABELS ...]): NP: run under mpirun -np n
  function(tide_add_pytest name file)
    cmake_parse_arguments(P "" "NP;TIMEOUT" "LABELS" ${ARGN})
    if(NOT P_TIMEOUT)
      set(P_TIMEOUT 300)
    endif()
    if(P_NP)
      set(cmd ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS} -np ${P_NP} ${_py} ${_pytest}
              --rootdir=${_pydir} ${_pydir}/${file})
    else()
      set(cmd ${_py} ${_pytest} --rootdir=${_pydir} ${_pydir}/${file})
    endif()
    add_test(NAME ${name} COMMAND ${cmd})
    _tide_test_props(${name} "python;${P_LABELS}" ${P_TIMEOUT})
    set_property(TEST ${name} APPEND PROPERTY ENVIRONMENT "TIDE_BUILD_DIR=${PROJECT_BINARY_DIR}"
                 "TIDE_TEST_MPIRUN=${_mpirun}")
  endfunction()
  # the quickstart (C) saves, is killed and resumes under other dps, from tide-ckpt convert's
  # output too
  if(TARGET quickstart AND TARGET tide-ckpt)
    tide_add_pytest(test_checkpoint_c test_checkpoint_c.py LABELS mpi)
  endif()
endif()

if(TARGET tide AND TARGET tided AND TARGET tidectl AND NOT TIDE_SANITIZE)
  # every public call of the binding fed bad input; struct mirrors checked
  tide_add_pytest(test_python_api test_api.py NP 2 LABELS mpi)
  # tide.torch's plan, optimizer probe and layers, one process, no tided
  tide_add_pytest(test_python_torch_unit test_torch_unit.py LABELS unit)
  # train_torch.py resized live, a rank killed: states and losses vs never-resized runs
  tide_add_pytest(test_python_train_torch test_train_torch.py LABELS mpi TIMEOUT 400)
  # train_gpt.py on tide.torch: dp, tp, pp and micro-batches resized live, a rank killed
  tide_add_pytest(test_python_gpt test_gpt.py LABELS mpi TIMEOUT 600)
  # a stack of torch.nn.TransformerEncoderLayer made elastic in a few lines
  tide_add_pytest(test_python_encoder test_encoder.py LABELS mpi)
  # train_gpt: save (its own and tidectl's), kill, resume into other layouts; tide-ckpt convert
  tide_add_pytest(test_python_checkpoint test_checkpoint.py LABELS mpi TIMEOUT 400)
  # the GPU path: rt.device, CUDA tensors of another device or index refused, collectives
  # and a reshard on device tensors; then train_torch --device cuda resized live. Skips
  # where no NVIDIA device, CUDA PyTorch or nccl backend is
  tide_add_pytest(test_python_gpu test_device.py NP 2 LABELS "mpi;gpu")
  tide_add_pytest(test_python_gpu_train test_train_torch.py::test_device_resize
                  LABELS "mpi;gpu")
  foreach(t test_python_gpu test_python_gpu_train)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT
                 "TIDE_TEST_DEVICE=cuda" "TIDE_TEST_HAVE_NCCL=${TIDE_HAVE_NCCL}")
  endforeach()
  # `cmake --install` of tide and its Python package into a clean prefix, imported with the
  # docs/pytorch.md's line, found without TIDE_LIB
  add_test(NAME test_python_install
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_python_install.sh ${PROJECT_SOURCE_DIR}
                   ${PROJECT_BINARY_DIR} ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_python_install "mpi;python;install" 300)
endif()
