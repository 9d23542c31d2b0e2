"""Checkpoints of a user's own program, from Python and from C: save while training, kill
the job, resume under another layout, and match the run that was never interrupted.

  Python: train_gpt saves through tide.torch (el.checkpoint) and through `tidectl
    checkpoint`; after the kill it resumes (Elastic(resume=...)) from each, under layouts
    that change dp, tp, pp and the micro-batches, and from the output of `tide-ckpt
    convert`: every loss after the checkpoint within 1e-4 (relative) of the never-
    interrupted run's, the final parameters and AdamW state within a relative L2 of 1e-4.
  C: test_checkpoint_c.py.
A driver."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import time

import pytest

import jobs

jobs.needs_torch_mpi()
import tide  # noqa: E402
import tide.torch as tt  # noqa: E402
import train_gpt  # noqa: E402

STEPS = 16
MODEL = ["--layers", "4", "--hidden", "32", "--heads", "4", "--seq", "16", "--global-batch",
         "8", "--steps", str(STEPS)]
FIRST = ["--dp", "2", "--pp", "2", "--micro-batches", "2"]
EX = jobs.example("train_gpt.py")


@pytest.fixture
def cluster(build, mpirun, tmp_path):
    c = jobs.Cluster(build, mpirun, str(tmp_path))
    yield c
    c.close()


def wait_complete(root: str, job: jobs.Job, timeout: float = 120) -> int:
    """The step of the first complete checkpoint under root (its MANIFEST published)."""
    end = time.time() + timeout
    while time.time() < end:
        if glob.glob(os.path.join(root, "step-*", "MANIFEST")):
            return tide.find_checkpoint(root)[1]
        assert job.proc.poll() is None, "%s ended before its checkpoint:\n%s" % (job.name, job.tail())
        time.sleep(0.1)
    raise AssertionError("no complete checkpoint under %s" % root)


def convert(build: str, src: str, out: str, dp: int, tp: int, pp: int) -> None:
    r = subprocess.run([os.path.join(build, "ckpt", "tide-ckpt"), "convert", src, out, "--dp",
                        str(dp), "--tp", str(tp), "--pp", str(pp)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_python_save_kill_resume(cluster, build, tmp_path):
    w = str(tmp_path)
    for d in ("ref", "a", "b", "c"):
        os.mkdir(os.path.join(w, d))
    cluster.run("ref", 4, jobs.py_program(EX, *MODEL, *FIRST, "--job", "ref", "--loss-out",
                                          w + "/ref.loss", "--state-out", w + "/ref"))
    job = cluster.launch("el", 4, jobs.py_program(
        EX, *MODEL, *FIRST, "--job", "el", "--step-ms", "250", "--ckpt", w + "/own",
        "--ckpt-at", "5"))
    own = wait_complete(w + "/own", job)
    cluster.ctl("checkpoint", "el", "--dir", w + "/ctl")  # a save tided schedules
    ctl = wait_complete(w + "/ctl", job)
    job.kill()
    assert job.proc.returncode != 0 and own == 6 and own < ctl < STEPS, (own, ctl)
    convert(build, w + "/own", w + "/conv", 2, 2, 1)
    ref = jobs.losses(w + "/ref.loss")
    coll = tt.collection(*train_gpt.build(train_gpt.parse_args(MODEL)))
    want, _ = jobs.gather(coll, sorted(glob.glob(w + "/ref/final.*.pt")))
    for name, root, step, layout in (
            ("a", w + "/own", own, ["--dp", "1", "--tp", "2", "--pp", "2", "--micro-batches", "2"]),
            ("b", w + "/ctl", ctl, ["--dp", "1", "--tp", "1", "--pp", "4", "--micro-batches", "4"]),
            ("c", w + "/conv", own, ["--dp", "4", "--tp", "1", "--pp", "1", "--micro-batches", "2"])):
        out = cluster.run("resume-" + name, 4, jobs.py_program(
            EX, *MODEL, *layout, "--job", "resume-" + name, "--resume", root, "--loss-out",
            "%s/%s.loss" % (w, name), "--state-out", "%s/%s" % (w, name)))
        assert re.search(r"from step %d on" % step, out.text()), out.tail()
        jobs.compare_losses(jobs.losses("%s/%s.loss" % (w, name)), ref, range(step, STEPS), 1e-4)
        got, _ = jobs.gather(coll, sorted(glob.glob("%s/%s/final.*.pt" % (w, name))))
        jobs.compare_states(coll, got, want, 1e-4)
