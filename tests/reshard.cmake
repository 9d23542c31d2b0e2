# reshard/: collections, layouts, geometry, plans (test_reshard) and placement (test_place).
if(TARGET tide_reshard)
  # One executable in four sources (tests/reshard_fixture.h: what they share).
  tide_add_unit_test(test_reshard
                     SOURCES test_reshard.c test_reshard_hand.c test_reshard_layout.c
                             test_reshard_alloc.c
                     LIBS tide_reshard tide_test_support TIMEOUT 120)
  if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/test_place.c)
    tide_add_unit_test(test_place SOURCES test_place.c LIBS tide_reshard TIMEOUT 120)
  endif()
endif()
