/*
 * The scenario of tests/test_examples_ckpt.c (ctest entry test_examples_ckpt): 8 ranks save
 * train_mlp's state under (dp 2, tp 2, pp 2) and load it under other layouts (listed in the
 * driver, with ZeRO-1 and without).
 */
// clang-format off
/*  name ranks time labels mpi first    resizes kill ckpt gen status */
ROW("",  8,    240, "",    "",  "2x2x2", "",     "",  0,   0,  TIDE_OK)
// clang-format on
