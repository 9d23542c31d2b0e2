"""The binding on the runtime's device. SPMD: two ranks under mpirun against the session's
tided; TIDE_TEST_DEVICE=cuda (nccl backend: the GPU path) or cpu (default; mpi backend:
the same checks where no GPU is, gpu-check --cpu-dry).

  - rt.device is where libtide put the rank: cuda:<tide_device> (TIDE_DEVICE, else the
    rank's index on its host) on nccl, cpu on mpi; PyTorch's current device follows it;
  - tensors elsewhere are refused with TideError naming the runtime's device: another
    device type (a host tensor on nccl, a cuda tensor on mpi) and another INDEX of the
    same type (a tensor subclass claims cuda:<other> / cpu:1: one GPU is enough);
  - the collectives take tensors a kernel has only just been queued to write (PyTorch's
    stream orders them): allreduce, broadcast, allgather, p2p, barrier, exact results;
  - set_buffers, then tidectl shrinks the job dp 2 -> 1 and reshard moves the device
    tensors (DP-sharded and replicated) into new device tensors, values checked.
On cuda it skips (ctest: 77) only where no NVIDIA device exists or CUDA_VISIBLE_DEVICES
hides them all, or where this PyTorch or this build has no CUDA (said so); a device that
PyTorch cannot use fails.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

mpi4py = pytest.importorskip("mpi4py")
torch = pytest.importorskip("torch")
mpi4py.rc.thread_level = "funneled"
from mpi4py import MPI  # noqa: E402

import tide  # noqa: E402
from tide import Group  # noqa: E402
from gpu import require_cuda  # noqa: E402
from spmd import Checks, on  # noqa: E402

DEV = os.environ.get("TIDE_TEST_DEVICE", "cpu")
ME = MPI.COMM_WORLD.Get_rank()
if DEV == "cuda":
    require_cuda()


def test_device(tided, tidectl):
    ck = Checks(ME)
    coll = tide.Collection(2)
    coll.add("w", (64, 8), torch.float32, layer=0)
    coll.add("m", (64, 8), torch.float32, layer=1, dp_sharded=True)
    coll.add("step", (1,), torch.int64)
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", ME))
    with tide.Runtime(MPI.COMM_WORLD, **({"backend": "nccl"} if DEV == "cuda" else {})) as rt:
        want_index = int(os.environ.get("TIDE_DEVICE", local))
        ck.ok("device_index is TIDE_DEVICE or the local rank (%d, want %d)" % (rt.device_index, want_index),
           rt.device_index == want_index)
        if DEV == "cuda":
            d = torch.device("cuda", want_index)
            ck.ok("device %s is cuda:%d" % (rt.device, want_index), rt.device == d and rt.backend == "nccl")
            ck.ok("PyTorch's current device follows libtide's", torch.cuda.current_device() == want_index)
            other_type, other_index = "cpu", "cuda:%d" % (want_index + 1)
        else:
            d = torch.device("cpu")
            ck.ok("device %s is cpu" % rt.device, rt.device == d and rt.backend == "mpi")
            other_type, other_index = "cuda:%d" % want_index, "cpu:1"
        x = torch.ones(4, device=d)
        refusal = "must be on %s (the runtime's device: tide_device %d, %s backend)" % (d, want_index, rt.backend)
        rt.join("device", coll, dp=2)
        st = rt.zeros()
        ck.ok("zeros on the device", all(t.device == d for t in st.values()))
        for what, bad in (("another device type", other_type), ("another device index", other_index)):
            y = on(bad, x) if bad != "cpu" else x.cpu()
            ck.expect_invalid("allreduce, " + what, lambda: rt.allreduce(y), "allreduce tensor " + refusal)
            ck.expect_invalid("broadcast, " + what, lambda: rt.broadcast(y, 0), refusal)
            ck.expect_invalid("allgather, " + what, lambda: rt.allgather(y), refusal)
            ck.expect_invalid("p2p, " + what, lambda: rt.p2p(Group.ALL, sends=[(1 - ME, y)]), refusal)
            ck.expect_invalid("set_buffers, " + what, lambda: rt.set_buffers(
                dict(st, w=on(bad, st["w"]) if bad != "cpu" else st["w"].cpu())), "tensor 'w' " + refusal)

        # values written by kernels still queued when the collective starts
        n = 1 << 20
        st["w"].copy_(torch.arange(64 * 8, device=d, dtype=torch.float32).reshape(64, 8))
        dr, ar = rt.view.dp_rank, rt.group_rank(Group.ALL)
        st["m"].fill_(dr + 1)
        st["step"].fill_(7)
        rt.set_buffers(st)
        ck.ok("step_begin", rt.step_begin() is tide.Action.RUN)
        a = torch.arange(n, device=d, dtype=torch.float32) * 2 + dr
        rt.allreduce(a, Group.DP)
        ck.ok("allreduce of a just-written tensor", torch.equal(a, torch.arange(n, device=d, dtype=torch.float32) * 4 + 1))
        b = torch.full((n,), float(dr + 5), device=d)
        rt.broadcast(b, 1, Group.DP)
        ck.ok("broadcast", bool((b == 6).all()))
        g = rt.allgather(torch.full((3,), float(dr), device=d))
        ck.ok("allgather", g.device == d and torch.equal(g.cpu(), torch.tensor([[0.0] * 3, [1.0] * 3])))
        r = torch.empty(n, device=d)
        rt.p2p(Group.ALL, sends=[(1 - ar, torch.full((n,), float(ar + 10), device=d))], recvs=[(1 - ar, r)])
        ck.ok("p2p", bool((r == 11 - ar).all()))
        rt.barrier()
        rt.step_end()

        # tidectl shrinks to dp 1; the device tensors move into new device tensors
        if ME == 0:
            res = subprocess.run([tidectl, "resize", "device", "--dp", "1"], capture_output=True,
                                 text=True, timeout=60)
            ck.ok("tidectl resize: %s" % res.stderr.strip(), res.returncode == 0)
        deadline = time.time() + 60
        while True:
            act = rt.step_begin()
            if act is tide.Action.RECONFIGURE or time.time() > deadline:
                break
            rt.step_end()
        ck.ok("reconfigure", act is tide.Action.RECONFIGURE)
        keep = bool(rt.next_view and rt.next_view.member)
        if keep:
            ck.expect_invalid("reshard, another device index", lambda: rt.reshard(
                {"w": on(other_index, torch.zeros(64, 8, device=d)), "m": torch.zeros(64, 8, device=d),
                 "step": torch.zeros(1, dtype=torch.int64, device=d)}), refusal)
        new = rt.reshard()
        if keep:
            ck.ok("reshard on the device", all(t.device == d for t in new.values()))
            ck.ok("replicated tensor moved", torch.equal(new["w"].cpu(), torch.arange(512, dtype=torch.float32).reshape(64, 8)))
            ck.ok("dp-sharded tensor gathered", torch.equal(new["m"].cpu().reshape(-1),
                                                         torch.cat([torch.full((256,), 1.0), torch.full((256,), 2.0)])))
            ck.ok("step moved", int(new["step"][0]) == 7)
            ck.ok("runs after the switch", rt.step_begin() is tide.Action.RUN)
            rt.finish()
        else:
            ck.ok("idle after the switch", new == {} and rt.step_begin() is tide.Action.FINISHED)
    ck.done()
