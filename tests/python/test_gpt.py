"""examples/train_gpt.py (a byte-level transformer on tide.torch) resized live under tided
through five layouts that change dp, tp, pp and the micro-batches, then a rank killed,
against the never-resized run of the same seed: every step's loss within 1e-4 (relative),
the final parameters and AdamW state within a relative L2 of 1e-4, and the loss visibly
falling. A driver: plain pytest launching the jobs under mpirun (4 ranks, a small model)."""
from __future__ import annotations

import glob
import os
import re

import pytest

import jobs

jobs.needs_torch_mpi()
import tide.torch as tt  # noqa: E402
import train_gpt  # noqa: E402

STEPS = 36
MODEL = ["--layers", "4", "--hidden", "32", "--heads", "4", "--seq", "16", "--global-batch",
         "8", "--steps", str(STEPS)]
EX = jobs.example("train_gpt.py")
FIRST = ["--dp", "2", "--tp", "1", "--pp", "2", "--micro-batches", "2"]
# (dp, tp, pp, micro-batches) after each resize: every degree changes at least once
RESIZES = [(1, 2, 2, 2), (2, 2, 1, 1), (1, 1, 4, 4), (4, 1, 1, 2)]


def collection():
    model, opt, plan = train_gpt.build(train_gpt.parse_args(MODEL))
    return tt.collection(model, opt, plan)


@pytest.fixture
def cluster(build, mpirun, tmp_path):
    c = jobs.Cluster(build, mpirun, str(tmp_path), miss_limit=15)
    yield c
    c.close()


def first_step_of(job: jobs.Job, gen: int, layout) -> int:
    dp, tp, pp, mb = layout
    m = job.wait_for(r"generation %d \(dp %d, tp %d, pp %d, micro %d\) from step (\d+)"
                     % (gen, dp, tp, pp, mb), 180)
    return int(m.group(1))


def test_resized_through_five_layouts_and_a_kill(cluster, tmp_path):
    w = str(tmp_path)
    os.mkdir(w + "/ref")
    os.mkdir(w + "/el")
    cluster.run("ref", 4, jobs.py_program(EX, *MODEL, *FIRST, "--job", "ref", "--loss-out",
                                          w + "/ref.loss", "--state-out", w + "/ref"))
    job = cluster.launch("el", 4, jobs.py_program(
        EX, *MODEL, *FIRST, "--job", "el", "--step-ms", "120", "--loss-out", w + "/el.loss",
        "--state-out", w + "/el", "--kill-rank", "3", "--kill-file", w + "/kill"),
        mpi_flags=["--enable-recovery", "--mca", "async_mpi_finalize", "1"])
    job.wait_for(r"^train_gpt: step 0 ", 180)
    firsts = []
    for gen, (dp, tp, pp, mb) in enumerate(RESIZES, start=2):
        cluster.ctl("resize", "el", "--dp", str(dp), "--tp", str(tp), "--pp", str(pp),
                    "--micro-batches", str(mb))
        firsts.append(first_step_of(job, gen, (dp, tp, pp, mb)))
        jobs.wait_step(w + "/el.loss", firsts[-1] + 1, job)  # a step of its own in this layout
    open(w + "/kill", "w").close()  # pool rank 3 dies at its next step; dp 4 holds replicas
    died = int(job.wait_for(r"rank 3 \(worker \d+\) dies at step (\d+)", 120).group(1))
    m = job.wait_for(r"generation 6 \(dp (\d+), tp 1, pp 1, micro (\d+)\) from step (\d+)", 180)
    for r in range(3):
        job.wait_for(r"rank %d done" % r, 240)
    job.kill()
    assert "rank 3 done" not in job.text(), "the killed rank finished"
    assert firsts == sorted(firsts) and firsts[-1] < died < STEPS, (firsts, died)
    assert int(m.group(3)) <= died, "the recovery resumed after the step that failed"
    got, ref = jobs.losses(w + "/el.loss"), jobs.losses(w + "/ref.loss")
    worst = jobs.compare_losses(got, ref, range(STEPS), 1e-4)
    assert ref[STEPS - 1] < ref[0] - 1.0, "the loss did not fall: %r -> %r" % (ref[0], ref[STEPS - 1])
    coll = collection()
    a, lay = jobs.gather(coll, sorted(glob.glob(w + "/el/final.*.pt")))
    b, _ = jobs.gather(coll, sorted(glob.glob(w + "/ref/final.*.pt")))
    same, l2 = jobs.compare_states(coll, a, b, 1e-4)
    print("train_gpt: layouts %s then a kill at step %d (recovered to dp %s, micro %s); worst "
          "loss difference %.3g, %d of %d tensors bit-identical, worst relative L2 %.3g"
          % ([tuple(int(x) for x in FIRST[1::2])] + RESIZES, died, m.group(1), m.group(2), worst, same, len(coll),
             l2))
