"""Checkpoints of a user's own C program: the quickstart saves with tide_checkpoint_every,
the job is killed, and it resumes with tide_checkpoint_find and tide_checkpoint_load under
another dp, directly and from `tide-ckpt convert`'s output: its state's fingerprint equals
the never-interrupted run's (its sums are exact). A resume from a root without a complete
checkpoint fails naming it. A driver that loads no libtide itself (the checkpoints are
read with tide-ckpt), so it runs against a sanitizer build too: a sanitizer report in any
program's log fails it."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import time

import pytest

import jobs

QS_ARGS = ["--steps", "40", "--batch", "8", "--n", "1024"]
SANITIZER = re.compile(r"ERROR: (Address|Leak)Sanitizer|runtime error:")


@pytest.fixture
def cluster(build, mpirun, tmp_path):
    c = jobs.Cluster(build, mpirun, str(tmp_path))
    yield c
    c.close()
    with open(os.path.join(str(tmp_path), "tided.log"), errors="replace") as f:
        log = f.read()
    assert SANITIZER.search(log) is None, "tided: sanitizer report:\n" + log[-4000:]


def tide_ckpt(build: str, *args: str) -> str:
    r = subprocess.run([os.path.join(build, "ckpt", "tide-ckpt")] + list(args),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "tide-ckpt %s: %s%s" % (" ".join(args), r.stdout, r.stderr)
    return r.stdout


def newest(build: str, root: str) -> int:
    """The step of the newest complete checkpoint under root (its manifest's), -1 when none."""
    if not glob.glob(root + "/step-*/MANIFEST"):
        return -1
    return int(re.search(r"format version \d+, step (\d+)", tide_ckpt(build, "info", root)).group(1))


def fingerprint(job: jobs.Job) -> str:
    return job.wait_for(r"quickstart: step 40 fingerprint ([0-9a-f]{16})", 10).group(1)


def clean(job: jobs.Job) -> jobs.Job:
    m = SANITIZER.search(job.text())
    assert m is None, "%s: sanitizer report:\n%s" % (job.name, job.tail(60))
    return job


def test_c_save_kill_resume(cluster, build, tmp_path):
    w = str(tmp_path)
    qs = os.path.join(build, "examples", "quickstart")
    ref = fingerprint(clean(cluster.run("ref", 2, [qs, "--job", "ref", "--dp", "2"] + QS_ARGS)))
    job = cluster.launch("el", 2, [qs, "--job", "el", "--dp", "2", "--step-ms", "100", "--ckpt",
                                   w + "/ck", "--ckpt-every", "5"] + QS_ARGS)
    end = time.time() + 120
    while newest(build, w + "/ck") < 10:
        assert time.time() < end and job.proc.poll() is None, job.tail()
        time.sleep(0.2)
    job.kill()
    assert "fingerprint" not in job.text(), "the job finished before it was killed"
    step = newest(build, w + "/ck")
    tide_ckpt(build, "convert", w + "/ck", w + "/conv", "--dp", "4", "--tp", "1", "--pp", "1")
    for name, np, dp, root in (("dp1", 1, 1, w + "/ck"), ("conv-dp4", 4, 4, w + "/conv")):
        out = clean(cluster.run(name, np, [qs, "--job", name, "--dp", str(dp), "--resume", root]
                                + QS_ARGS))
        assert "resumed at step %d" % step in out.text(), out.tail()
        assert fingerprint(out) == ref, "%s: state differs from the never-interrupted run" % name
    os.mkdir(w + "/empty")
    bad = cluster.launch("none", 1, [qs, "--job", "none", "--dp", "1", "--resume", w + "/empty"]
                         + QS_ARGS)
    assert bad.wait(120, ok=False) != 0, "a resume from an empty root succeeded"
    assert re.search(r"--resume.*%s" % re.escape(w + "/empty"), bad.text()), bad.tail()
    clean(bad)
