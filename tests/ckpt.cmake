# ckpt/: the checkpoint format, loading into any layout, crash safety, the saver
# (test_ckpt), and what a root may hold (test_ckpt_root).
if(TARGET tide_ckpt)
  tide_add_unit_test(test_ckpt SOURCES test_ckpt.c LIBS tide_ckpt tide_proto xxhash
                     tide_test_faults TIMEOUT 120)
  # checkpoints an earlier tide wrote (tests/data/README.md)
  target_compile_definitions(test_ckpt PRIVATE TIDE_TEST_DATA="${CMAKE_CURRENT_SOURCE_DIR}/data")
  # what a checkpoint root may hold: links, special files, other users (test_ckpt_root)
  tide_add_unit_test(test_ckpt_root SOURCES test_ckpt_root.c LIBS tide_ckpt tide_proto xxhash
                     TIMEOUT 120)
endif()
# train_mlp --resume / --ckpt-every, a crash injected mid-save, tide-ckpt verify/convert
# (resume: train_mlp_faults, the program with the tests' fault hook, tests/support/faults.c);
# planted links, a renamed step directory and FIFOs in a checkpoint root (links); a
# checkpoint disk that fills while a job trains and loses a rank (full: root, mount
# namespaces, tmpfs).
if(TARGET tide-ckpt AND TARGET train_mlp AND TARGET train_mlp_faults AND TARGET tided
   AND TARGET tidectl)
  foreach(part resume links full)
    set(train train_mlp)
    if(part STREQUAL "resume")
      set(name test_ckpt_resume)
      set(train train_mlp_faults)
    elseif(part STREQUAL "links")
      set(name test_ckpt_links)
    else()
      set(name test_ckpt_full_disk)
    endif()
    add_test(NAME ${name}
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt_resume.sh ${part}
                     $<TARGET_FILE:${train}> $<TARGET_FILE:tide-ckpt> $<TARGET_FILE:tided>
                     $<TARGET_FILE:tidectl> ${TIDE_MPIEXEC} ${TIDE_MPIEXEC_FLAGS})
  endforeach()
  _tide_test_props(test_ckpt_resume "mpi" 400)
  _tide_test_props(test_ckpt_links "mpi" 300)
  _tide_test_props(test_ckpt_full_disk "mpi" 300)
endif()

# The saver's staging from the memory it is given (libtide: the nccl backend's pinned
# memory), made once and reused across saves (test_ckpt_staging).
if(TARGET tide_ckpt)
  tide_add_unit_test(test_ckpt_staging SOURCES test_ckpt_staging.c LIBS tide_ckpt)
endif()

# tide-ckpt verify / convert: a progress line on a terminal (script(1)), nothing more into
# files (test_ckpt_progress).
if(TARGET tide-ckpt AND TARGET train_mlp)
  add_test(NAME test_ckpt_progress
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt_progress.sh
                   $<TARGET_FILE:train_mlp> $<TARGET_FILE:tide-ckpt> ${TIDE_MPIEXEC}
                   ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_ckpt_progress "mpi" 120)
endif()
