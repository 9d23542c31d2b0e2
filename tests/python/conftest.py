"""pytest set-up shared by the Python tests (tests/python.cmake registers them with ctest).

Two kinds of test files live here:
  - SPMD files (test_api.py, test_device.py) run under `mpirun -np 2 python3 -m pytest`:
    every rank runs the same tests in the same order, and the ranks meet in tide's
    collectives; rank 0 starts the tided they share (the `tided` fixture) and hands its
    endpoint to the others over MPI.
  - driver files run as one plain process (no MPI in it): they start tided, launch
    training programs with mpirun, resize them with tidectl and compare what they wrote.
Options (or environment): --build (TIDE_BUILD_DIR; default SOURCE/build), --mpirun
(TIDE_TEST_MPIRUN: the mpirun command line with its flags). The package is imported from
this source tree with the build's libtide (TIDE_LIB), unless TIDE_LIB is set already.
A session whose every test skipped exits 77, ctest's skip code (tests/python.cmake).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Iterator, List

import pytest

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNDER_MPI = "OMPI_COMM_WORLD_SIZE" in os.environ
SKIP_RC = 77


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--build", default=os.environ.get("TIDE_BUILD_DIR", os.path.join(SRC, "build")),
                     help="tide's build directory")
    parser.addoption("--mpirun", default=os.environ.get("TIDE_TEST_MPIRUN", "mpirun"),
                     help="the mpirun command line (with its flags)")


def pytest_configure(config: pytest.Config) -> None:
    build = os.path.abspath(config.getoption("--build"))
    os.environ.setdefault("TIDE_LIB", os.path.join(build, "worker", "libtide.so"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, os.path.join(SRC, "python"))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if UNDER_MPI and os.environ.get("TIDE_TEST_DEVICE") == "cuda":
        # each rank on the GPU of its rank (modulo the GPUs) with an NCCL "host" of its own,
        # so that NCCL accepts two ranks on one GPU; set before libtide reads them
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        import torch
        n = torch.cuda.device_count() if torch.cuda.is_available() else 1
        os.environ.setdefault("NCCL_HOSTID", "tide-py-%d" % rank)
        os.environ.setdefault("TIDE_DEVICE", str(rank % max(n, 1)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    rep = session.config.pluginmanager.get_plugin("terminalreporter")
    if rep is None or exitstatus not in (0, 5):  # 5: nothing ran (a module-level skip)
        return
    stats = rep.stats
    if stats.get("skipped") and not stats.get("passed") and not stats.get("failed"):
        session.exitstatus = SKIP_RC


@pytest.fixture(scope="session")
def build(pytestconfig: pytest.Config) -> str:
    return os.path.abspath(pytestconfig.getoption("--build"))


@pytest.fixture(scope="session")
def mpirun(pytestconfig: pytest.Config) -> List[str]:
    return shlex.split(pytestconfig.getoption("--mpirun"))


@pytest.fixture(scope="session")
def tidectl(build: str) -> str:
    return os.path.join(build, "coordinator", "tidectl")


def start_tided(build: str, work: str, miss_limit: int = 50) -> subprocess.Popen:
    """tided on a free loopback port, its endpoint in work/endpoint (heartbeats every
    100 ms, a worker declared dead after miss_limit missed ones)."""
    ep = os.path.join(work, "endpoint")
    log = open(os.path.join(work, "tided.log"), "w")
    p = subprocess.Popen([os.path.join(build, "coordinator", "tided"), "--endpoint",
                          "tcp://127.0.0.1:*", "--endpoint-file", ep, "--state",
                          os.path.join(work, "state.db"), "--heartbeat-ms", "100",
                          "--miss-limit", str(miss_limit)], stdout=log, stderr=subprocess.STDOUT)
    for _ in range(200):
        if os.path.exists(ep) and os.path.getsize(ep) > 0:
            return p
        if p.poll() is not None:
            break
        time.sleep(0.05)
    p.kill()
    raise RuntimeError("tided did not start: %s" % open(os.path.join(work, "tided.log")).read())


@pytest.fixture(scope="session")
def tided(build: str) -> Iterator[str]:
    """A tided for the session; its endpoint (also exported as TIDE_ENDPOINT). Under mpirun
    rank 0 starts it and the others get the endpoint from rank 0."""
    comm = None
    if UNDER_MPI:
        import mpi4py
        mpi4py.rc.thread_level = "funneled"
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    proc, work = None, None
    ep = None
    if comm is None or comm.Get_rank() == 0:
        work = tempfile.mkdtemp(prefix="tide-pytest.")
        try:
            proc = start_tided(build, work)
            ep = open(os.path.join(work, "endpoint")).read().strip()
        except RuntimeError as e:
            ep = "error: %s" % e
    if comm is not None:
        ep = comm.bcast(ep, root=0)
    if ep is None or ep.startswith("error:"):
        pytest.fail("tided: %s" % ep)
    os.environ["TIDE_ENDPOINT"] = ep
    yield ep
    if comm is not None:
        comm.Barrier()
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=30)
    if work is not None:
        subprocess.run(["rm", "-rf", work])
