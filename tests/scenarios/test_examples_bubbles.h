/*
 * The scenario of tests/test_examples_bubbles.c (ctest entry test_examples_bubbles): offline
 * plugin steps fill the bubbles of a two-stage pipeline under the real tided and tidectl.
 */
// clang-format off
/*  name ranks time labels mpi first    resizes kill ckpt gen status */
ROW("",  2,    120, "",    "",  "1x1x2", "",     "",  0,   1,  TIDE_OK)
// clang-format on
