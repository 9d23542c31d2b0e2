/*
 * Scenarios of tests/test_worker_faults.c: libtide's failure paths around communicators,
 * with the real tided and a fault-injecting wrapper of the mpi backend; one ctest entry per
 * row, test_worker_faults_<name>. Kills name the backend call the victim dies at:
 * "create" (the first layout's communicators), "split" (the switch's groups, right after
 * the new all was split off), "prepare" (a build ahead of the switch, on libtide's
 * preparation thread). Status: what tide_step_begin gives up with (deadcomm, whose
 * collectives fail with every peer alive), TIDE_OK for the rest. The column after status
 * is the driver's: the fault its wrapper injects and the checks that follow (see the
 * file's opening comment).
 */
// clang-format off
/*  name        ranks time labels mpi         first    resizes        kill              ckpt gen status            fault */
ROW("join",      3,   150, "",    "recovery", "3x1x1", "",            "create at r2",   0,   2,  TIDE_OK,          FAULT_JOIN)
ROW("build",     3,   150, "",    "recovery", "3x1x1", "1x3x1",       "split at r2",    0,   3,  TIDE_OK,          FAULT_BUILD)
ROW("deadcomm",  2,   150, "",    "recovery", "2x1x1", "",            "",               0,   1,  TIDE_ERR_TIMEOUT, FAULT_DEADCOMM)
ROW("nofinish",  3,   150, "",    "recovery", "2x1x1", "",            "",               0,   1,  TIDE_OK,          FAULT_NOFINISH)
ROW("prepdie",   3,   150, "",    "recovery", "3x1x1", "1x3x1",       "prepare at r2",  0,   3,  TIDE_OK,          FAULT_PREPDIE)
ROW("prepabort", 3,   150, "",    "recovery", "3x1x1", "1x3x1 1x3x1", "",               0,   3,  TIDE_OK,          FAULT_PREPABORT)
ROW("trim",      3,   150, "",    "recovery", "3x1x1", "2x1x1",       "",               0,   2,  TIDE_OK,          FAULT_TRIM)
// clang-format on
