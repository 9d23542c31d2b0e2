/*
 * Scenarios of tests/test_worker_hostbeat.c: host heartbeats with the real tided, four
 * ranks on this host, no job (one ctest entry per row, test_worker_hostbeat_<name>). No
 * kill: the messages per period are counted, aggregated and not; "now at rN": rank N dies
 * once every rank heartbeats (rank 0 leads the host's heartbeats). The last rank runs
 * tided and the checks, and is never killed.
 */
// clang-format off
/*  name      ranks time labels mpi         first resizes kill        ckpt gen status */
ROW("count",  4,    120, "",    "",         "",   "",     "",         0,   0,  TIDE_OK)
ROW("member", 4,    120, "",    "recovery", "",   "",     "now at r1", 0,  0,  TIDE_OK)
ROW("leader", 4,    120, "",    "recovery", "",   "",     "now at r0", 0,  0,  TIDE_OK)
// clang-format on
