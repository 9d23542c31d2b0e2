# proto/: message round trips, every refusal class, the encoder and allocation-failure injection,
# records; one executable of four sources sharing tests/proto_fixture.h.
tide_add_unit_test(test_proto SOURCES test_proto.c test_proto_refuse.c test_proto_encode.c
                   test_proto_record.c LIBS tide_proto tide_test_support TIMEOUT 60)
# Criterion runs each test in a child whose LeakSanitizer exit code it ignores, so a
# leak report alone would pass: fail on the report text instead.
set_tests_properties(test_proto PROPERTIES FAIL_REGULAR_EXPRESSION
                     "ERROR: (Address|Leak)Sanitizer|runtime error:")
# proto_legacy.h: the texts of tided's state schema 1 read into records, the bad ones refused.
tide_add_unit_test(test_proto_legacy SOURCES test_proto_legacy.c LIBS tide_proto TIMEOUT 30)
set_tests_properties(test_proto_legacy PROPERTIES FAIL_REGULAR_EXPRESSION
                     "ERROR: (Address|Leak)Sanitizer|runtime error:")

# tidectl (coordinator/tidectl*.c, owned with proto): parsing, formatting and the whole CLI
# against a fake tided; tidectl.c is compiled in directly without its main(), the rest of
# tidectl comes from its library. One executable of three sources: the pure pieces
# (test_tidectl.c), the CLI against the fake (test_tidectl_cli.c), keys and CURVE
# (test_tidectl_keys.c), sharing tidectl_fixture.h.
if(TARGET tidectl_cli)
  tide_add_unit_test(test_tidectl SOURCES test_tidectl.c test_tidectl_cli.c test_tidectl_keys.c
                     ${PROJECT_SOURCE_DIR}/coordinator/tidectl.c
                     LIBS tidectl_cli Threads::Threads TIMEOUT 60)
  target_compile_definitions(test_tidectl PRIVATE TIDECTL_NO_MAIN=1)
  set_tests_properties(test_tidectl PROPERTIES FAIL_REGULAR_EXPRESSION
                       "ERROR: (Address|Leak)Sanitizer|runtime error:")
  # tidectl timeline's picture and trace (coordinator/timeline*.c) from a synthetic history
  tide_add_unit_test(test_timeline_draw SOURCES test_timeline.c LIBS tidectl_cli TIMEOUT 60)
  set_tests_properties(test_timeline_draw PROPERTIES FAIL_REGULAR_EXPRESSION
                       "ERROR: (Address|Leak)Sanitizer|runtime error:")
endif()
