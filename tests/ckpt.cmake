# ckpt/: the checkpoint format, loading into any layout, crash safety, the saver
# (test_ckpt), and the tide-ckpt tool on a checkpoint the unit test leaves behind.
if(TARGET tide_ckpt)
  tide_add_unit_test(test_ckpt SOURCES test_ckpt.c LIBS tide_ckpt TIMEOUT 120)
endif()
