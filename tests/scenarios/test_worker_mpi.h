/*
 * The scenario of tests/test_worker_mpi.c: a toy job resized through the real tided,
 * every switch checked bit for bit (ctest entry test_worker_mpi). The column after status
 * is the driver's: give, the generation after whose switch the runtime owns every rank's
 * buffers (the later switches rebuild them in place).
 */
// clang-format off
/*  name ranks time labels mpi first    resizes                         kill ckpt gen status   give */
ROW("",  6,    120, "",    "", "2x1x2", "1x2x3 2x1x1 1x2x2 3x2x1",      "",  0,   5,  TIDE_OK, 3)
// clang-format on
