"""A model the package has never seen (tests/python/encoder_job.py: a stack of
torch.nn.TransformerEncoderLayer, AdamW) is made elastic for dp and pp with at most 15
lines of tide code, and resized live under tided (dp 2, pp 2) -> (dp 4, pp 1) -> (dp 1,
pp 4) -> (dp 2, pp 1): every loss within 1e-4 (relative) of the never-resized run, the
final parameters and optimizer state within a relative L2 of 1e-4. A driver."""
from __future__ import annotations

import glob
import os
import re
import sys

import pytest

import jobs

jobs.needs_torch_mpi()
import tide.torch as tt  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "encoder_job.py")
STEPS = 24


def test_at_most_15_lines_of_tide_code():
    lines = [l for l in open(JOB) if l.rstrip().endswith("# tide")]
    assert 0 < len(lines) <= 15, "%d lines of tide code" % len(lines)
    # and none is hiding elsewhere: every line that calls the package is counted
    for l in open(JOB):
        if re.search(r"\btt\.|\bel\.|import tide", l):
            assert l.rstrip().endswith("# tide"), l


@pytest.fixture
def cluster(build, mpirun, tmp_path):
    c = jobs.Cluster(build, mpirun, str(tmp_path))
    yield c
    c.close()


def test_encoder_resized_live(cluster, tmp_path):
    w = str(tmp_path)
    os.mkdir(w + "/ref")
    os.mkdir(w + "/el")
    base = jobs.py_program(JOB, "--dp", "2", "--pp", "2", "--steps", str(STEPS))
    env = {"PYTHONPATH": os.path.join(jobs.SRC, "python")}
    cluster.run("ref", 4, base + ["--job", "ref", "--loss-out", w + "/ref.loss", "--state-out",
                                  w + "/ref"], **env)
    job = cluster.launch("el", 4, base + ["--job", "el", "--step-ms", "150", "--loss-out",
                                          w + "/el.loss", "--state-out", w + "/el"], **env)
    job.wait_for(r"^encoder: step 0 ", 180)
    for dp, pp in ((4, 1), (1, 4), (2, 1)):
        cluster.ctl("resize", "el", "--dp", str(dp), "--pp", str(pp))
        m = job.wait_for(r"^encoder: step (\d+) .*\(dp %d, pp %d\)" % (dp, pp), 180)
        jobs.wait_step(w + "/el.loss", int(m.group(1)) + 1, job)
    job.wait()
    got, ref = jobs.losses(w + "/el.loss"), jobs.losses(w + "/ref.loss")
    worst = jobs.compare_losses(got, ref, range(STEPS), 1e-4)
    sys.path.insert(0, os.path.dirname(JOB))
    import encoder_job
    import torch
    model = encoder_job.Encoder(layers=4)
    coll = tt.collection(model, torch.optim.AdamW(model.parameters(), lr=2e-3),
                         tt.Plan(pre="embed", blocks="layers", post="head"))
    a, _ = jobs.gather(coll, sorted(glob.glob(w + "/el/final.*.pt")))
    b, _ = jobs.gather(coll, sorted(glob.glob(w + "/ref/final.*.pt")))
    same, l2 = jobs.compare_states(coll, a, b, 1e-4)
    assert ref[STEPS - 1] < ref[0], "the loss did not fall"
    print("encoder: 4 layouts; worst loss difference %.3g, worst relative L2 %.3g" % (worst, l2))
