/*
 * Scenarios of tests/test_examples_tide.c: train_mlp's elastic loop resized live through
 * the real tided and tidectl (one ctest entry per row: test_examples_tide_<name>). The
 * columns after status are the driver's (struct tide_row there):
 *   layers   the model's layers
 *   zero1    Adam moments DP-sharded (ZeRO-1)
 *   cap      staging cap in bytes (0: 64 KiB)
 *   convert  at every switch, tide-ckpt convert of a checkpoint of the old layout equals
 *            the live state after the reshard (the test's 4th argument is tide-ckpt)
 *   refuse   before the first resize, a micro-batch count the fit rules forbid is refused
 *   reshape  some shard must shrink in place and some grow spill an old shard to host
 * A row labelled external is run by tests/test_multihost_resize.sh across two hosts.
 */
// clang-format off
/*  name           ranks time labels      mpi first     resizes                              kill ckpt gen status   layers zero1 cap      convert refuse reshape */
ROW("dp",          8,    90,  "",         "", "2x1x1", "4x1x1 1x1x1",                        "",  0,   3,  TIDE_OK, 4,     0,    0,       0,      0,     0)
ROW("tp",          8,    90,  "",         "", "1x1x1", "1x2x1 1x4x1 1x2x1",                  "",  0,   4,  TIDE_OK, 4,     0,    0,       0,      0,     1)
ROW("pp",          8,    90,  "",         "", "1x1x1", "1x1x2:0-3,4-5 1x1x4:0-0,1-2,3-4,5-5", "",  0,   3,  TIDE_OK, 6,     0,    0,       0,      0,     0)
ROW("mixed",       8,    90,  "",         "", "2x2x2", "1x4x2 4x1x1 1x2x2:0-2,3-3",          "",  0,   4,  TIDE_OK, 4,     0,    0,       1,      0,     1)
ROW("mixed-zero1", 8,    90,  "",         "", "2x2x2", "1x4x2 4x1x1 1x2x2:0-2,3-3",          "",  0,   4,  TIDE_OK, 4,     1,    0,       1,      0,     1)
ROW("micro",       8,    90,  "",         "", "2x2x2", "2x2x2/2 1x2x2/8 2x2x2/4",            "",  0,   4,  TIDE_OK, 4,     0,    0,       0,      1,     0)
ROW("grow2",       8,    90,  "",         "", "1x4x2", "1x2x2 1x1x2",                        "",  0,   3,  TIDE_OK, 4,     0,    16384,   0,      0,     0)
ROW("hosts",       8,    90,  "external", "", "2x4x1", "1x4x2 2x4x1",                        "",  0,   3,  TIDE_OK, 4,     0,    0,       0,      0,     0)
// clang-format on
