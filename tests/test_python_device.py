#!/usr/bin/env python3
"""The binding on the runtime's device, as test_python.sh's device mode runs it: two ranks
under mpirun against tided ($TIDE_ENDPOINT), --device cuda (nccl backend: the GPU path)
or --device cpu (mpi backend: the same checks where no GPU is, gpu-check --cpu-dry).

  - rt.device is where libtide put the rank: cuda:<tide_device> (TIDE_DEVICE, else the
    rank's index on its host) on nccl, cpu on mpi; PyTorch's current device follows it;
  - tensors elsewhere are refused with TideError naming the runtime's device: another
    device type (a host tensor on nccl, a cuda tensor on mpi) and another INDEX of the
    same type (a tensor subclass claims cuda:<other> / cpu:1: one GPU is enough);
  - the collectives take tensors a kernel has only just been queued to write (PyTorch's
    stream orders them): allreduce, broadcast, allgather, p2p, barrier, exact results;
  - set_buffers, then tidectl ($TIDECTL) shrinks the job dp 2 -> 1 and reshard moves the
    device tensors (DP-sharded and replicated) into new device tensors, values checked.
Prints 'N passed, M failed' (rank 0, both ranks' counts); exit 1 when any failed.
    usage: test_python_device.py cpu|cuda
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Callable

import mpi4py

mpi4py.rc.thread_level = "funneled"
from mpi4py import MPI  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import tide  # noqa: E402
from tide import Group, Status, TideError  # noqa: E402

DEV = sys.argv[1] if len(sys.argv) > 1 else "cpu"
ME = MPI.COMM_WORLD.Get_rank()
passed = failed = 0


def ok(what: str, cond: bool) -> None:
    global passed, failed
    if cond:
        passed += 1
    else:
        print("rank %d: FAIL %s" % (ME, what), flush=True)
        failed += 1


def expect(what: str, fn: Callable[[], Any], text: str) -> None:
    """fn() must raise TideError(ERR_INVALID) whose message holds text."""
    global passed, failed
    try:
        fn()
    except TideError as e:
        if e.status == Status.ERR_INVALID and text in str(e):
            passed += 1
            return
        print("rank %d: FAIL %s: %s" % (ME, what, e), flush=True)
    except Exception as e:  # noqa: BLE001 - anything else is a binding bug
        print("rank %d: FAIL %s: %s: %s" % (ME, what, type(e).__name__, e), flush=True)
    else:
        print("rank %d: FAIL %s: accepted" % (ME, what), flush=True)
    failed += 1


class OnDevice(torch.Tensor):
    """A real tensor that says it lives on `fake`: a device this machine may not have."""
    fake = None

    @property
    def device(self):
        return self.fake


def on(device: str, x: torch.Tensor) -> torch.Tensor:
    y = x.as_subclass(OnDevice)
    y.fake = torch.device(device)
    return y


coll = tide.Collection(2)
coll.add("w", (64, 8), torch.float32, layer=0)
coll.add("m", (64, 8), torch.float32, layer=1, dp_sharded=True)
coll.add("step", (1,), torch.int64)
local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", ME))
with tide.Runtime(MPI.COMM_WORLD, **({"backend": "nccl"} if DEV == "cuda" else {})) as rt:
    want_index = int(os.environ.get("TIDE_DEVICE", local))
    ok("device_index is TIDE_DEVICE or the local rank (%d, want %d)" % (rt.device_index, want_index),
       rt.device_index == want_index)
    if DEV == "cuda":
        d = torch.device("cuda", want_index)
        ok("device %s is cuda:%d" % (rt.device, want_index), rt.device == d and rt.backend == "nccl")
        ok("PyTorch's current device follows libtide's", torch.cuda.current_device() == want_index)
        other_type, other_index = "cpu", "cuda:%d" % (want_index + 1)
    else:
        d = torch.device("cpu")
        ok("device %s is cpu" % rt.device, rt.device == d and rt.backend == "mpi")
        other_type, other_index = "cuda:%d" % want_index, "cpu:1"
    x = torch.ones(4, device=d)
    refusal = "must be on %s (the runtime's device: tide_device %d, %s backend)" % (d, want_index, rt.backend)
    rt.join("device", coll, dp=2)
    st = rt.zeros()
    ok("zeros on the device", all(t.device == d for t in st.values()))
    for what, bad in (("another device type", other_type), ("another device index", other_index)):
        y = on(bad, x) if bad != "cpu" else x.cpu()
        expect("allreduce, " + what, lambda: rt.allreduce(y), "allreduce tensor " + refusal)
        expect("broadcast, " + what, lambda: rt.broadcast(y, 0), refusal)
        expect("allgather, " + what, lambda: rt.allgather(y), refusal)
        expect("p2p, " + what, lambda: rt.p2p(Group.ALL, sends=[(1 - ME, y)]), refusal)
        expect("set_buffers, " + what, lambda: rt.set_buffers(
            dict(st, w=on(bad, st["w"]) if bad != "cpu" else st["w"].cpu())), "tensor 'w' " + refusal)

    # values written by kernels still queued when the collective starts
    n = 1 << 20
    st["w"].copy_(torch.arange(64 * 8, device=d, dtype=torch.float32).reshape(64, 8))
    dr, ar = rt.view.dp_rank, rt.group_rank(Group.ALL)
    st["m"].fill_(dr + 1)
    st["step"].fill_(7)
    rt.set_buffers(st)
    ok("step_begin", rt.step_begin() is tide.Action.RUN)
    a = torch.arange(n, device=d, dtype=torch.float32) * 2 + dr
    rt.allreduce(a, Group.DP)
    ok("allreduce of a just-written tensor", torch.equal(a, torch.arange(n, device=d, dtype=torch.float32) * 4 + 1))
    b = torch.full((n,), float(dr + 5), device=d)
    rt.broadcast(b, 1, Group.DP)
    ok("broadcast", bool((b == 6).all()))
    g = rt.allgather(torch.full((3,), float(dr), device=d))
    ok("allgather", g.device == d and torch.equal(g.cpu(), torch.tensor([[0.0] * 3, [1.0] * 3])))
    r = torch.empty(n, device=d)
    rt.p2p(Group.ALL, sends=[(1 - ar, torch.full((n,), float(ar + 10), device=d))], recvs=[(1 - ar, r)])
    ok("p2p", bool((r == 11 - ar).all()))
    rt.barrier()
    rt.step_end()

    # tidectl shrinks to dp 1; the device tensors move into new device tensors
    if ME == 0:
        res = subprocess.run([os.environ["TIDECTL"], "resize", "device", "--dp", "1"], capture_output=True,
                             text=True, timeout=60)
        ok("tidectl resize: %s" % res.stderr.strip(), res.returncode == 0)
    deadline = time.time() + 60
    while True:
        act = rt.step_begin()
        if act is tide.Action.RECONFIGURE or time.time() > deadline:
            break
        rt.step_end()
    ok("reconfigure", act is tide.Action.RECONFIGURE)
    keep = bool(rt.next_view and rt.next_view.member)
    if keep:
        expect("reshard, another device index", lambda: rt.reshard(
            {"w": on(other_index, torch.zeros(64, 8, device=d)), "m": torch.zeros(64, 8, device=d),
             "step": torch.zeros(1, dtype=torch.int64, device=d)}), refusal)
    new = rt.reshard()
    if keep:
        ok("reshard on the device", all(t.device == d for t in new.values()))
        ok("replicated tensor moved", torch.equal(new["w"].cpu(), torch.arange(512, dtype=torch.float32).reshape(64, 8)))
        ok("dp-sharded tensor gathered", torch.equal(new["m"].cpu().reshape(-1),
                                                     torch.cat([torch.full((256,), 1.0), torch.full((256,), 2.0)])))
        ok("step moved", int(new["step"][0]) == 7)
        ok("runs after the switch", rt.step_begin() is tide.Action.RUN)
        rt.finish()
    else:
        ok("idle after the switch", new == {} and rt.step_begin() is tide.Action.FINISHED)
tot = MPI.COMM_WORLD.gather((passed, failed), root=0)
if ME == 0:
    print("test_python_device(%s): %d passed, %d failed" % (DEV, sum(p for p, _ in tot), sum(f for _, f in tot)))
sys.exit(1 if failed else 0)
