"""What the driver tests share: a tided of their own, training programs launched under
mpirun and resized with tidectl, and the checks of what the programs wrote (loss curves,
the full state gathered from every rank's shards)."""
from __future__ import annotations

import glob
import math
import os
import re
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from conftest import SRC, start_tided

PY = os.environ.get("TIDE_PYTHON", "/usr/bin/python3")


class Cluster:
    """A tided for one test, and the jobs it launched (killed at close)."""

    def __init__(self, build: str, mpirun: List[str], work: str, miss_limit: int = 50) -> None:
        self.build, self.mpirun, self.work = build, mpirun, work
        self.tided = start_tided(build, work, miss_limit)
        self.endpoint = open(os.path.join(work, "endpoint")).read().strip()
        self.jobs: List["Job"] = []

    def env(self, **extra: str) -> Dict[str, str]:
        e = dict(os.environ, TIDE_ENDPOINT=self.endpoint, OMP_NUM_THREADS="1")
        e.update(extra)
        return e

    def launch(self, name: str, np: int, argv: Sequence[str], mpi_flags: Sequence[str] = (),
               **env: str) -> "Job":
        """mpirun -np np argv in the background; output in work/<name>.log."""
        log = os.path.join(self.work, name + ".log")
        cmd = self.mpirun + list(mpi_flags) + ["-np", str(np)] + list(argv)
        p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             env=self.env(**env), start_new_session=True)
        job = Job(name, p, log)
        self.jobs.append(job)
        return job

    def run(self, name: str, np: int, argv: Sequence[str], timeout: float = 240, **kw: str) -> "Job":
        """launch and wait; the test fails when it exits non-zero."""
        job = self.launch(name, np, argv, **kw)
        job.wait(timeout)
        return job

    def ctl(self, *args: str) -> str:
        r = subprocess.run([os.path.join(self.build, "coordinator", "tidectl")] + list(args),
                           capture_output=True, text=True, timeout=60, env=self.env())
        assert r.returncode == 0, "tidectl %s: %s%s" % (" ".join(args), r.stdout, r.stderr)
        return r.stdout

    def close(self) -> None:
        for j in self.jobs:
            j.kill()
        self.tided.terminate()
        try:
            self.tided.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.tided.kill()


class Job:
    def __init__(self, name: str, proc: subprocess.Popen, log: str) -> None:
        self.name, self.proc, self.log = name, proc, log

    def text(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.text().splitlines()[-n:])

    def wait_for(self, pattern: str, timeout: float = 120) -> re.Match:
        """The first line matching pattern (a regex), waiting for it."""
        rx = re.compile(pattern, re.M)
        end = time.time() + timeout
        while True:
            m = rx.search(self.text())
            if m:
                return m
            if self.proc.poll() is not None or time.time() > end:
                m = rx.search(self.text())
                if m:
                    return m
                raise AssertionError("%s: no line matching %r (exit %s):\n%s" % (
                    self.name, pattern, self.proc.poll(), self.tail()))
            time.sleep(0.1)

    def wait(self, timeout: float = 240, ok: bool = True) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("%s: still running after %ds:\n%s" % (self.name, timeout, self.tail()))
        if ok:
            assert rc == 0, "%s exited %d:\n%s" % (self.name, rc, self.tail())
        return rc

    def kill(self) -> None:
        """The whole job: mpirun is asked first (it takes its ranks down), then killed."""
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
            if self.proc.poll() is not None:
                return
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass


# ---- what the programs wrote -------------------------------------------------------------

def losses(path: str) -> Dict[int, float]:
    """{step: loss} of a --loss-out file; a step written twice keeps its last value."""
    out: Dict[int, float] = {}
    with open(path) as f:
        for line in f:
            s, v = line.split()
            out[int(s)] = float(v)
    return out


def compare_losses(got: Dict[int, float], ref: Dict[int, float], steps: Sequence[int],
                   rtol: float) -> float:
    """Every step of steps in both curves, within rtol (relative); the worst difference."""
    assert sorted(got) == sorted(steps), "steps run: %s" % sorted(got)
    worst = 0.0
    for s in steps:
        r = abs(got[s] - ref[s]) / abs(ref[s])
        assert r <= rtol, "step %d: loss %r, never-resized %r (relative %.3g > %g)" % (
            s, got[s], ref[s], r, rtol)
        worst = max(worst, r)
    return worst


def gather(coll, files: Sequence[str]) -> Tuple[Dict[str, torch.Tensor], tuple]:
    """The full state from the shard files of one layout (Elastic.local_state or
    train_torch's save_shards): a coordinate whose rank died is taken from a dp replica."""
    import tide
    assert files, "no shard files"
    shards, lay = {}, None
    for f in files:
        d = torch.load(f)
        assert lay is None or tuple(d["layout"]) == tuple(lay), "%s: another layout" % f
        lay = tuple(d["layout"])
        shards[tuple(d["coord"])] = d["state"]
    dp, tp, pp, nl, mb, st = lay
    for p in range(pp):
        for dd in range(dp):
            for t in range(tp):
                if (p, dd, t) not in shards:
                    alt = [shards[(p, e, t)] for e in range(dp) if (p, e, t) in shards]
                    assert alt, "no replica for coordinate %r" % ((p, dd, t),)
                    shards[(p, dd, t)] = alt[0]
    return coll.assemble(tide.Layout(dp, tp, pp, nl, mb, st), shards), lay


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (||a - b|| where b is all zero)."""
    a, b = a.double(), b.double()
    den, num = float(b.norm()), float((a - b).norm())
    return num / den if den > 0 else num


def compare_states(coll, a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor],
                   rtol: float) -> Tuple[int, float]:
    """Integer tensors equal, float ones bit-identical (rtol 0) or within a relative L2 of
    rtol; (tensors bit-identical, worst relative L2)."""
    same, worst = 0, 0.0
    for n in coll.names():
        x, y = a[n], b[n]
        if torch.equal(x, y):
            same += 1
            continue
        assert x.is_floating_point(), "%s: integers differ" % n
        assert rtol > 0, "%s: not bit-identical" % n
        r = rel_l2(x, y)
        assert math.isfinite(r) and r <= rtol, "%s differs by a relative L2 of %.3g (limit %g)" % (
            n, r, rtol)
        worst = max(worst, r)
    return same, worst


def example(name: str) -> str:
    return os.path.join(SRC, "examples", name)


def py_program(path: str, *args: str) -> List[str]:
    return [PY, path] + list(args)


def needs_torch_mpi() -> None:
    """Skips the module where the test Python lacks torch or mpi4py (as before: exit 77)."""
    import pytest
    r = subprocess.run([PY, "-c", "import torch, mpi4py"], capture_output=True)
    if r.returncode != 0:
        pytest.skip("torch/mpi4py missing for %s" % PY, allow_module_level=True)


def wait_step(loss_file: str, n: int, job: Job, timeout: float = 120) -> None:
    """Until the loss file has step n (or the job ended)."""
    end = time.time() + timeout
    while time.time() < end and job.proc.poll() is None:
        if os.path.exists(loss_file) and any(s >= n for s in losses(loss_file)):
            return
        time.sleep(0.1)
    assert os.path.exists(loss_file) and any(s >= n for s in losses(loss_file)), (
        "%s did not reach step %d" % (job.name, n))


def _examples_importable() -> None:
    """The examples import mpi4py's MPI at the top; a driver must not become an MPI
    singleton (its mpirun children would inherit it), so MPI is never initialised here."""
    try:
        import mpi4py
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
    except ImportError:
        pass
    sys.path.insert(0, os.path.join(SRC, "examples"))


_examples_importable()
