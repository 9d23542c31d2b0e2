#!/usr/bin/env python3
"""torch_bench: what tide.torch costs a PyTorch job, and what a live resize saves it.

One run, side by side, on examples/train_gpt.py's model at a size where a step takes at
least 50 ms here (hidden 128, 4 layers, seq 64, global batch 16: ~0.9 M parameters,
AdamW), 2 ranks:
  1. overhead per step at dp 2: train_gpt on tide.torch under tided against the same model,
     data and optimizer synchronised with plain mpi4py (gradients flattened into one
     buffer, comm.Allreduce, copied back; the loss averaged with another), --rounds
     interleaved runs of each; a step is the wall time from one step's start to the next
     (what the user sees: step_begin, step_end and the gradient sync included), the median
     of the steps after --warm; the overhead is the median over rounds of tide's median over
     plain's (each round's two runs back to back). Goal: at most 2%.
  2. resize downtime: train_gpt resized live under tided from (dp 2) to (dp 1, pp 2): the
     time from the end of the last step's work to the start of the next step across the
     switch, minus the median of that time between steps; against stopping the
     plain job with torch.save of the same state (model and AdamW), relaunching it under
     mpirun and torch.load-ing it until every rank is ready to step. Goal: at most 1/30.
Prints a table and writes bench-out/torch_bench.json.
    usage: python3 benchmarks/torch_bench.py [--build build] [--steps 40] [--rounds 2]
    (internal modes, run under mpirun: --plain, --restart FILE)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EX = os.path.join(ROOT, "examples", "train_gpt.py")
MODEL = ["--layers", "4", "--hidden", "128", "--heads", "4", "--seq", "64", "--global-batch", "16"]
PY = os.environ.get("TIDE_PYTHON", "/usr/bin/python3")


# ---- the plain mpi4py job (--plain) and its relaunch (--restart) -------------------------------

def _setup(argv: List[str]):
    import mpi4py
    mpi4py.rc.thread_level = "funneled"
    from mpi4py import MPI
    import torch
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import train_gpt
    a = train_gpt.parse_args(MODEL + argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model, opt, _ = train_gpt.build(a)
    return MPI, torch, train_gpt, a, model, opt


def plain(argv: List[str], save: str, save_at: int, times: str) -> int:
    """train_gpt's model at dp = the world's size, synchronised with mpi4py only."""
    MPI, torch, tg, a, model, opt = _setup(argv)
    comm = MPI.COMM_WORLD
    rank, dp = comm.Get_rank(), comm.Get_size()
    data = tg.corpus(a.corpus)
    params = [p for p in model.parameters()]
    for step in range(a.steps):
        t_start = time.time()
        if step == save_at:  # stop here: torch.save the whole state, then exit
            t0 = time.time()
            if rank == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                           save)
            comm.Barrier()
            if rank == 0:
                print("plain: saved step %d at %.6f in %.1f ms" % (step, t0, (time.time() - t0) * 1e3),
                      flush=True)
            return 0
        x, y = tg.batch(a, data, step)
        n = x.shape[0] // dp
        x, y = x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]
        opt.zero_grad()
        loss = tg.loss_fn(model(x), y) / dp
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
        off = 0
        for p in params:
            p.grad.copy_(flat[off:off + p.numel()].view_as(p))
            off += p.numel()
        lt = torch.tensor([float(loss)], dtype=torch.float64)
        comm.Allreduce(MPI.IN_PLACE, lt.numpy(), op=MPI.SUM)
        opt.step()
        if rank == 0 and times:
            with open(times, "a") as f:
                f.write("%d %.6f %.6f\n" % (step, t_start, time.time()))
    return 0


def restart(argv: List[str], path: str) -> int:
    """The relaunched job: imports, builds the model, loads the saved state, and says when
    every rank is ready to step."""
    MPI, torch, tg, a, model, opt = _setup(argv)
    st = torch.load(path)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    tg.corpus(a.corpus)
    MPI.COMM_WORLD.Barrier()
    if MPI.COMM_WORLD.Get_rank() == 0:
        print("restart: ready at step %d at %.6f" % (st["step"], time.time()), flush=True)
    return 0


# ---- the driver -------------------------------------------------------------------------------------

def rows(path: str) -> List[Tuple[int, float, float]]:
    """(step, start, end of its training work) of a times file, by step."""
    return sorted((int(s), float(t0), float(t1)) for s, t0, t1 in (l.split() for l in open(path)))


def intervals(path: str) -> Dict[int, float]:
    """{step: seconds from its start to the next step's start}."""
    r = rows(path)
    return {s: b[1] - a[1] for a, b in zip(r, r[1:]) for s in [a[0]]}


def gaps(path: str) -> Dict[int, float]:
    """{step: seconds between the end of its work and the start of the next step}: the
    time not spent training (step_end, step_begin, a switch)."""
    r = rows(path)
    return {a[0]: b[1] - a[2] for a, b in zip(r, r[1:])}


class Tided:
    def __init__(self, build: str, work: str) -> None:
        ep = os.path.join(work, "endpoint")
        self.p = subprocess.Popen([os.path.join(build, "coordinator", "tided"), "--endpoint",
                                   "tcp://127.0.0.1:*", "--endpoint-file", ep, "--state",
                                   os.path.join(work, "state.db")],
                                  stdout=open(os.path.join(work, "tided.log"), "w"),
                                  stderr=subprocess.STDOUT)
        for _ in range(200):
            if os.path.exists(ep) and os.path.getsize(ep):
                break
            time.sleep(0.05)
        self.endpoint = open(ep).read().strip()
        self.ctl = os.path.join(build, "coordinator", "tidectl")

    def close(self) -> None:
        self.p.terminate()
        self.p.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mpirun", default="mpirun --oversubscribe --bind-to none"
                    + (" --allow-run-as-root" if os.geteuid() == 0 else ""))
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--save", default="")
    ap.add_argument("--save-at", type=int, default=-1)
    ap.add_argument("--times", default="")
    ap.add_argument("--restart", default="")
    a, rest = ap.parse_known_args()
    if a.plain:
        return plain(rest, a.save, a.save_at, a.times)
    if a.restart:
        return restart(rest, a.restart)
    work = tempfile.mkdtemp(prefix="torch_bench.")
    mpirun = a.mpirun.split() + ["-np", "2"]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               TIDE_LIB=os.environ.get("TIDE_LIB", os.path.join(a.build, "worker", "libtide.so")))
    steps = ["--steps", str(a.steps)]
    t = Tided(a.build, work)
    env["TIDE_ENDPOINT"] = t.endpoint
    res: Dict[str, List[float]] = {"tide": [], "plain": []}
    try:
        for r in range(a.rounds):  # interleaved: the machine's load drifts
            for kind in ("tide", "plain"):
                f = os.path.join(work, "%s%d.times" % (kind, r))
                if kind == "tide":
                    cmd = [PY, EX] + MODEL + steps + ["--job", "o%d" % r, "--dp", "2",
                                                      "--time-out", f]
                else:
                    cmd = [PY, __file__, "--plain", "--times", f] + steps
                subprocess.run(mpirun + cmd, env=env, check=True, stdout=subprocess.DEVNULL)
                iv = intervals(f)
                res[kind].append(statistics.median(v for s, v in iv.items() if s >= a.warm))
        tide_ms = statistics.median(res["tide"]) * 1e3
        plain_ms = statistics.median(res["plain"]) * 1e3
        # live resize (dp 2) -> (dp 1, pp 2)
        f = os.path.join(work, "live.times")
        log = os.path.join(work, "live.log")
        p = subprocess.Popen(mpirun + [PY, EX] + MODEL + steps + ["--job", "live", "--dp", "2",
                                                                  "--time-out", f],
                             env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        while not (os.path.exists(f) and len(open(f).read().splitlines()) > a.warm + 3):
            time.sleep(0.05)
        subprocess.run([t.ctl, "resize", "live", "--dp", "1", "--pp", "2"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        p.wait()
        m = re.search(r"generation 2 .* from step (\d+)", open(log).read())
        if not m:
            raise SystemExit("torch_bench: the resize did not happen:\n" + open(log).read()[-2000:])
        first = int(m.group(1))
        gp = gaps(f)
        usual = statistics.median(v for s, v in gp.items() if a.warm <= s < first - 1)
        live_ms = (gp[first - 1] - usual) * 1e3
        # checkpoint-restart of the same state
        ck = os.path.join(work, "state.pt")
        out = subprocess.run(mpirun + [PY, __file__, "--plain", "--save", ck, "--save-at",
                                       str(a.warm + 3)] + steps, env=env, check=True,
                             capture_output=True, text=True).stdout
        t_save = float(re.search(r"saved step \d+ at ([0-9.]+)", out).group(1))
        out = subprocess.run(mpirun + [PY, __file__, "--restart", ck] + steps, env=env,
                             check=True, capture_output=True, text=True).stdout
        t_ready = float(re.search(r"ready at step \d+ at ([0-9.]+)", out).group(1))
        restart_ms = (t_ready - t_save) * 1e3
    finally:
        t.close()
    # each round's pair ran back to back: the median of the pairs' ratios cancels most of the
    # machine's drift between rounds
    over = (statistics.median(t / p for t, p in zip(res["tide"], res["plain"])) - 1) * 100
    print("torch_bench: train_gpt %s, 2 ranks, medians of %d interleaved rounds" % (
        " ".join(MODEL), a.rounds))
    print("  %-44s %10s %10s %12s" % ("", "tide.torch", "mpi4py", "ratio (goal)"))
    print("  %-44s %8.1f ms %8.1f ms %+10.2f%% (<= 2%%)" % ("step at dp 2 (rounds: %s | %s)" % (
        ", ".join("%.1f" % (x * 1e3) for x in res["tide"]),
        ", ".join("%.1f" % (x * 1e3) for x in res["plain"])), tide_ms, plain_ms, over))
    print("  %-44s %8.1f ms %8.1f ms %12s" % ("resize (dp 2) -> (dp 1, pp 2): live vs save/relaunch/load",
                                              live_ms, restart_ms, "1/%.1f (<= 1/30)" % (restart_ms / max(live_ms, 1e-3))))
    os.makedirs("bench-out", exist_ok=True)
    with open(os.path.join("bench-out", "torch_bench.json"), "w") as fo:
        json.dump({"model": MODEL, "step_ms_tide": tide_ms, "step_ms_plain": plain_ms,
                   "overhead_pct": over, "rounds_tide_ms": [x * 1e3 for x in res["tide"]],
                   "rounds_plain_ms": [x * 1e3 for x in res["plain"]], "live_resize_ms": live_ms,
                   "checkpoint_restart_ms": restart_ms,
                   "resize_ratio": live_ms / restart_ms if restart_ms else None}, fo, indent=1)
    subprocess.run(["rm", "-rf", work])
    return 0


if __name__ == "__main__":
    sys.exit(main())
