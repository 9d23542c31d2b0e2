/*
 * Scenarios of tests/test_examples_tide_recover.c: a member of train_mlp's elastic job
 * under the real tided dies (or is stopped), and the job recovers; one ctest entry per
 * row, test_examples_tide_recover_<name>. Kills: "after K at pPdDtT" (SIGKILL once K
 * steps of the generation it dies in are done), "grads K" (inside step K, after its
 * backward pass, before its gradient allreduce), "loss K" (inside step K, after the loss
 * reduction over dp, before those over pp and tp), "stop K" (SIGSTOP where grads kills;
 * resumed once the job recovered without it, it must find itself fenced and leave). The
 * victim dies in the generation after the last resize. Status: what the survivors'
 * training returns (TIDE_ERR_NO_HOLDER: tided cannot recover and halts them). The
 * columns after status are the driver's (struct recover_row there):
 *   recover  the layout the recovery must produce ("": none)
 *   zero1    Adam moments DP-sharded (ZeRO-1)
 *   batch    the global batch
 *   steps    the job ends when this many steps are done
 *   fit      `tidectl resize --dp 3` is refused by the model's fit rules while training,
 *            and the recovery's event says why it chose its dp
 *   corrupt  the victim damages a shard of the checkpoint the job would roll back to
 *   request  nobody dies: `tidectl checkpoint` while training, checked against the state
 * See the file's opening comment for what each row checks.
 */
// clang-format off
/*  name              ranks time labels mpi         first    resizes  kill                 ckpt gen status              recover  zero1 batch steps fit corrupt request */
ROW("replica",        8,    90,  "",    "recovery", "2x2x2", "",      "after 5 at p1d1t1", 0,   2,  TIDE_OK,            "1x2x2", 0,    32,   14,   0,  0,      0)
ROW("midstep",        8,    90,  "",    "recovery", "2x2x2", "",      "grads 5 at p1d1t1", 0,   2,  TIDE_OK,            "1x2x2", 0,    32,   14,   0,  0,      0)
ROW("lastreduce",     8,    90,  "",    "recovery", "2x2x2", "",      "loss 5 at p1d1t1",  0,   2,  TIDE_OK,            "1x2x2", 0,    32,   14,   0,  0,      0)
ROW("spare",          9,    90,  "",    "recovery", "2x2x2", "",      "after 5 at p1d1t1", 0,   2,  TIDE_OK,            "2x2x2", 0,    32,   14,   0,  0,      0)
ROW("zero1",          8,    90,  "",    "recovery", "2x2x2", "",      "after 5 at p1d1t1", 0,   1,  TIDE_ERR_NO_HOLDER, "",      1,    32,   14,   0,  0,      0)
ROW("stopped",        8,    120, "",    "recovery", "2x2x2", "",      "stop 5 at p1d1t1",  0,   2,  TIDE_OK,            "1x2x2", 0,    32,   14,   0,  0,      0)
ROW("layout",         4,    90,  "",    "recovery", "4x1x1", "",      "after 5 at p0d3t0", 0,   2,  TIDE_OK,            "2x1x1", 0,    16,   14,   1,  0,      0)
ROW("ckpt-zero1",     8,    120, "",    "recovery", "2x2x2", "",      "after 5 at p1d1t1", 2,   2,  TIDE_OK,            "1x2x2", 1,    32,   14,   0,  0,      0)
ROW("ckpt-dp1",       2,    120, "",    "recovery", "1x2x1", "",      "after 5 at p0d0t1", 2,   2,  TIDE_OK,            "1x1x1", 0,    32,   14,   0,  0,      0)
ROW("ckpt-corrupt",   8,    120, "",    "recovery", "2x2x2", "",      "after 5 at p1d1t1", 2,   3,  TIDE_OK,            "1x2x2", 1,    32,   14,   0,  1,      0)
ROW("ckpt-request",   2,    120, "",    "recovery", "2x1x1", "",      "",                  0,   1,  TIDE_OK,            "",      1,    32,   24,   0,  0,      1)
ROW("resize-spare",   8,    150, "",    "recovery", "2x2x2", "2x1x2", "after 4 at p1d1t0", 0,   3,  TIDE_OK,            "2x1x2", 0,    32,   24,   0,  0,      0)
// clang-format on
