/*
 * Scenarios of tests/test_examples_mpi.c: train_mlp's model over plain MPI (one ctest entry
 * per row, test_examples_mpi_<name>). No job, no tided: the columns after status are the
 * driver's, the run and its steps.
 */
// clang-format off
/*  name           ranks time labels mpi first resizes kill ckpt gen status   run            steps */
ROW("layouts_np2", 2,    60,  "",    "",  "",   "",     "",  0,   0,  TIDE_OK, run_layouts,   5)
ROW("layouts_np8", 8,    60,  "",    "",  "",   "",     "",  0,   0,  TIDE_OK, run_layouts,   5)
ROW("converge",    8,    60,  "",    "",  "",   "",     "",  0,   0,  TIDE_OK, run_converge,  30)
ROW("relayout",    8,    60,  "",    "",  "",   "",     "",  0,   0,  TIDE_OK, run_relayout,  2)
// clang-format on
