# ckpt/: the checkpoint format, loading into any layout, crash safety, the saver
# (test_ckpt).
if(TARGET tide_ckpt)
  tide_add_unit_test(test_ckpt SOURCES test_ckpt.c LIBS tide_ckpt TIMEOUT 120)
endif()
# train_mlp --resume / --ckpt-every, a crash injected mid-save, tide-ckpt verify/convert.
if(TARGET tide-ckpt AND TARGET train_mlp AND TARGET tided)
  add_test(NAME test_ckpt_resume
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_ckpt_resume.sh
                   $<TARGET_FILE:train_mlp> $<TARGET_FILE:tide-ckpt> $<TARGET_FILE:tided>
                   ${TIDE_MPIEXEC}
                   ${TIDE_MPIEXEC_FLAGS})
  _tide_test_props(test_ckpt_resume "mpi" 400)
endif()

# The saver's staging from the memory it is given (libtide: the nccl backend's pinned
# memory), made once and reused across saves (test_ckpt_staging).
if(TARGET tide_ckpt)
  tide_add_unit_test(test_ckpt_staging SOURCES test_ckpt_staging.c LIBS tide_ckpt)
endif()
