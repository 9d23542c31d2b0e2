/*
 * The scenario of tests/test_collectives_recovery.c (ctest entry test_collectives_recovery;
 * scripts/gpu-check.sh runs it with --backend nccl): rank 3 of 4 dies while the others wait
 * on it inside an allreduce.
 */
// clang-format off
/*  name ranks time labels mpi         first resizes kill        ckpt gen status */
ROW("",  4,    60,  "",    "recovery", "",   "",     "now at r3", 0,   0,  TIDE_OK)
// clang-format on
