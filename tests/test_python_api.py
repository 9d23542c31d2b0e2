#!/usr/bin/env python3
"""Bad input to every public call of the tide Python binding raises TideError with a
status and a message that names the problem, loses nothing (the runtime works after),
and never crashes the interpreter. Runs as one rank under mpirun against tided
($TIDE_ENDPOINT). Prints 'N passed, M failed'; exit 1 when any failed."""
import os
import sys
import threading

import mpi4py

mpi4py.rc.thread_level = "funneled"
from mpi4py import MPI  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import tide  # noqa: E402
from tide import Group, Status, TideError  # noqa: E402

passed = failed = 0


def expect(what, fn, status, text):
    """fn() must raise TideError with status and text in its message."""
    global passed, failed
    try:
        fn()
    except TideError as e:
        if e.status == status and text in str(e):
            passed += 1
            return
        print("FAIL %s: got %s (%s)" % (what, e.status, e))
    except Exception as e:  # any other exception is a binding bug
        print("FAIL %s: %s: %s" % (what, type(e).__name__, e))
    else:
        print("FAIL %s: no exception" % what)
    failed += 1


def ok(what, cond):
    global passed, failed
    if cond:
        passed += 1
    else:
        print("FAIL %s" % what)
        failed += 1


I = Status.ERR_INVALID
# ---- Collection ----
expect("Collection(0)", lambda: tide.Collection(0), I, "num_layers")
expect("Collection('2')", lambda: tide.Collection("2"), I, "num_layers")
c = tide.Collection(2)
expect("add name int", lambda: c.add(5, (4,)), I, "name must be a str")
expect("add name long", lambda: c.add("x" * 200, (4,)), I, "1..95 bytes")
expect("add empty name", lambda: c.add("", (4,)), I, "1..95 bytes")
expect("add shape int", lambda: c.add("a", 4), I, "tuple of ints")
expect("add shape 5 dims", lambda: c.add("a", (1, 1, 1, 1, 1)), I, "1..4 positive dims")
expect("add shape negative", lambda: c.add("a", (4, -1)), I, "positive dims")
expect("add shape float", lambda: c.add("a", (4.0,)), I, "positive dims")
expect("add dtype", lambda: c.add("a", (4,), torch.complex64), I, "dtype of 'a'")
expect("add dtype str", lambda: c.add("a", (4,), "float32"), I, "dtype of 'a'")
expect("add layer", lambda: c.add("a", (4,), layer=2), I, "layer of 'a'")
expect("add layer -4", lambda: c.add("a", (4,), layer=-4), I, "layer of 'a'")
expect("add tp_split", lambda: c.add("a", (4,), tp_split=1), I, "tp_split")
expect("add segments", lambda: c.add("a", (4,), tp_segments=0), I, "tp_segments")
expect("C rejects: segments", lambda: c.add("q", (6, 4), tp_split=0, tp_segments=4), I, "")
ok("add good", c.add("w", (8, 4), torch.float32, layer=0, tp_split=0) == 0)
c.add("v", (8, 4), torch.float32, layer=1, tp_split=0, dp_sharded=True)
c.add("step", (1,), torch.int64)
expect("add duplicate", lambda: c.add("w", (4,)), Status.ERR_EXISTS, "already")
expect("index unknown", lambda: c.index("nope"), Status.ERR_NOT_FOUND, "nope")
# ---- Layout and shard geometry ----
expect("Layout dp 0", lambda: tide.Layout(0, 1, 1, 2), I, "dp must be")
expect("Layout stages", lambda: tide.Layout(1, 1, 2, 2, 1, [0, 1]), I, "stage_start")
expect("Layout C stages", lambda: tide.Layout(1, 1, 2, 2, 1, [0, 0, 2]), I, "tide_layout_set_stages")
expect("Layout validate", lambda: tide.Layout(1, 3, 1, 2).validate(c), I, "does not divide")
lay = tide.Layout(2, 2, 2, 2)
expect("shard_bytes coord", lambda: lay.shard_bytes(c, "w", (0, 2, 0)), I, "coordinate")
expect("shard_bytes coord type", lambda: lay.shard_bytes(c, "w", [0, 0, 0]), I, "coordinate")
expect("shard_bytes name", lambda: lay.shard_bytes(c, "x", (0, 0, 0)), Status.ERR_NOT_FOUND, "x")
ok("shard_bytes good", lay.shard_bytes(c, "w", (0, 1, 1)) == 4 * 4 * 4)
full = torch.arange(32, dtype=torch.float32).reshape(8, 4)
expect("extract shape", lambda: c.extract(lay, "w", (0, 0, 0), full.t()), I, "")
expect("extract dtype", lambda: c.extract(lay, "w", (0, 0, 0), full.double()), I, "must be torch.float32")
expect("extract noncontig", lambda: c.extract(lay, "w", (0, 0, 0), full[:, ::2]), I, "")
expect("extract not tensor", lambda: c.extract(lay, "w", (0, 0, 0), [1, 2]), I, "torch.Tensor")
ok("extract good", torch.equal(c.extract(lay, "w", (0, 0, 1), full), full[4:]))
expect("assemble missing", lambda: c.assemble(lay, {}), I, "no shards")
sh = {(p, d, t): {} for p in range(2) for d in range(2) for t in range(2)}
expect("assemble held missing", lambda: c.assemble(lay, sh), I, "shard 'w'")
# ---- Runtime ----
expect("Runtime comm", lambda: tide.Runtime("world"), I, "mpi4py intracommunicator")
expect("Runtime setting", lambda: tide.Runtime(MPI.COMM_WORLD, bogus=1), I, "unknown setting")
expect("Runtime endpoint type", lambda: tide.Runtime(MPI.COMM_WORLD, endpoint=5), I, "endpoint")
expect("Runtime timeout", lambda: tide.Runtime(MPI.COMM_WORLD, join_timeout_ms=-3), I, "join_timeout_ms")
expect("Runtime no tided", lambda: tide.Runtime(MPI.COMM_WORLD, endpoint="tcp://127.0.0.1:1",
                                                 register_timeout_ms=300), Status.ERR_TIMEOUT, "tide_new")
rt = tide.Runtime(MPI.COMM_WORLD)
ok("pool_rank", rt.pool_rank == MPI.COMM_WORLD.Get_rank())
ok("pool_worker_id of self", rt.worker_id >= 0 and rt.pool_worker_id(rt.pool_rank) == rt.worker_id)
ok("pool_worker_id out of range", rt.pool_worker_id(-1) == -1 and rt.pool_worker_id(rt.pool_size) == -1)
expect("pool_worker_id type", lambda: rt.pool_worker_id("0"), I, "rank must be an int")
expect("zeros before join", lambda: rt.zeros(), I, "join first")
expect("join job", lambda: rt.join("", c), I, "job must be")
expect("join collection", lambda: rt.join("api", "c"), I, "tide.Collection")
expect("join dp", lambda: rt.join("api", c, dp=0), I, "dp must be")
expect("join start_step", lambda: rt.join("api", c, start_step=-1), I, "start_step")
expect("join bad job chars (C)", lambda: rt.join("a b", c), I, "tide_join")
expect("join fit type", lambda: rt.join("api", c, fit="dp"), I, "fit must be a sequence")
expect("join fit tuple", lambda: rt.join("api", c, fit=[("dp",)]), I, "fit[0] must be")
expect("join fit degree", lambda: rt.join("api", c, fit=[("ep", 4)]), I, "degree must be")
expect("join fit n", lambda: rt.join("api", c, fit=[("tp", 0)]), I, "fit[0]: n must be")
expect("join fit what", lambda: rt.join("api", c, fit=[("dp", 4, "a\nb")]), I, "printable")
expect("join fit many", lambda: rt.join("api", c, fit=[("dp", 4)] * 33), I, "at most 32")
# the C library refuses a first layout the program's own rules forbid, naming the rule
expect("join fit first layout (C)",
       lambda: rt.join("api", c, dp=1, tp=2, fit=[("dp", 4), ("tp", 3, "the heads")]), I,
       "tp 2 does not divide 3 (the heads)")
rt.join("api-ok", c, dp=1, tp=1, pp=1, fit=[("dp", 4, "the batch"), ("tp", 8)])
expect("add after join", lambda: c.add("late", (4,)), I, "frozen")
expect("join twice", lambda: rt.join("api-ok", c), I, "already joined")
st = rt.zeros()
ok("zeros", sorted(st) == ["step", "v", "w"] and st["v"].shape == (8, 4))
expect("set_buffers type", lambda: rt.set_buffers([1]), I, "mapping")
expect("set_buffers missing", lambda: rt.set_buffers({"w": st["w"]}), I, "lacks tensors")
expect("set_buffers extra", lambda: rt.set_buffers(dict(st, x=st["w"])), I, "does not hold")
expect("set_buffers dtype", lambda: rt.set_buffers(dict(st, w=st["w"].double())), I, "float32")
expect("set_buffers size", lambda: rt.set_buffers(dict(st, w=torch.zeros(4, 4))), I, "bytes")
expect("set_buffers noncontig", lambda: rt.set_buffers(dict(st, w=torch.zeros(4, 8).t())), I, "contiguous")
expect("set_buffers not tensor", lambda: rt.set_buffers(dict(st, w=3)), I, "torch.Tensor")
rt.set_buffers(st)
expect("reshard outside", lambda: rt.reshard(), I, "RECONFIGURE")
ok("next_view None", rt.next_view is None)
expect("step_end before begin (C)", lambda: rt.step_end(), I, "tide_step_end")
ok("step_begin", rt.step_begin() is tide.Action.RUN)
x = torch.ones(4)
expect("allreduce group", lambda: rt.allreduce(x, "dp"), I, "tide.Group")
expect("allreduce tensor", lambda: rt.allreduce([1.0]), I, "torch.Tensor")
expect("allreduce dtype", lambda: rt.allreduce(torch.ones(4, dtype=torch.uint8)), I, "dtype")
expect("allreduce op", lambda: rt.allreduce(x, Group.DP, "sum"), I, "ReduceOp")
expect("allreduce noncontig", lambda: rt.allreduce(torch.ones(4, 4).t()), I, "contiguous")
expect("allreduce autograd", lambda: rt.allreduce(torch.ones(4, requires_grad=True) * 2), I, "leaf")
ok("allreduce good", torch.equal(rt.allreduce(x, Group.ALL), torch.ones(4)))
expect("broadcast root", lambda: rt.broadcast(x, 1), I, "root")
expect("broadcast root type", lambda: rt.broadcast(x, "0"), I, "root")
expect("p2p peer", lambda: rt.p2p(Group.PP, sends=[(1, x)]), I, "peer")
expect("p2p entry", lambda: rt.p2p(Group.PP, sends=[x]), I, "(peer, tensor)")
expect("pp_exchange no stage", lambda: rt.pp_exchange(send=x, send_to=1), I, "no next stage")
expect("pp_exchange dir", lambda: rt.pp_exchange(recv=x, recv_from=2), I, "direction")
ok("allgather", rt.allgather(x).shape == (1, 4))
ok("p2p self", rt.p2p(Group.ALL, sends=[(0, x)], recvs=[(0, torch.empty(4))]) is None)
expect("step_end value", lambda: rt.step_end("ok"), I, "step_end takes")
errs = []
th = threading.Thread(target=lambda: errs.append(expect("other thread", rt.step_begin, I, "thread")))
th.start()
th.join()
rt.step_end()
ok("step counted", rt.view.step == 1)
ok("still works after bad input", rt.step_begin() is tide.Action.RUN)
rt.finish()
rt.close()
expect("closed", lambda: rt.step_begin(), I, "closed")
expect("closed allreduce", lambda: rt.allreduce(x), I, "closed")
ok("SYMBOLS", "tide_new" in tide.SYMBOLS)

# the struct mirrors against the library's layout: a drifted copy is refused, by name
from tide import _lib as L  # noqa: E402
import ctypes  # noqa: E402


def abi_refused(what, fields, name, text):
    global passed, failed
    st = type("Drifted", (ctypes.Structure,), {"_c_name_": name, "_fields_": fields})
    try:
        L.check_abi(L.lib(), [st], "libtide")
    except L.AbiError as e:
        if text in str(e) and "different versions" in str(e):
            passed += 1
            return
        print("FAIL abi %s: %s" % (what, e))
    except Exception as e:
        print("FAIL abi %s: %s: %s" % (what, type(e).__name__, e))
    else:
        print("FAIL abi %s: accepted" % what)
    failed += 1


ok("abi of the binding", L.check_abi(L.lib()) is None)
vf, of = list(L.ViewS._fields_), list(L.Options._fields_)
abi_refused("field missing", of[:-1], "tide_options",
            "tide_options is %d bytes in the library" % ctypes.sizeof(L.Options))
abi_refused("fields swapped", [vf[1], vf[0]] + vf[2:], "tide_view",
            "tide_view.layout is at offset 8 in the library, 0 in")
abi_refused("field retyped", vf[:2] + [("member", ctypes.c_int64)] + vf[3:], "tide_view",
            "tide_view.pp_rank is at offset 20 in the library, 24 in")
abi_refused("field renamed", [("gen", vf[0][1])] + vf[1:], "tide_view", "tide_view has no field gen")
abi_refused("struct unknown", vf, "tide_viewx", "does not know struct tide_viewx")
# loading checks them: a binding whose mirror drifted never gets the library
saved = (L._lib, L.STRUCTS)
L._lib = None
L.STRUCTS = (type("Drifted", (ctypes.Structure,), {"_c_name_": "tide_options", "_fields_": of[:-1]}),)
try:
    L.lib()
    ok("load refuses a drifted mirror", False)
except L.AbiError as e:
    ok("load refuses a drifted mirror", "tide_options is" in str(e))
finally:
    L._lib, L.STRUCTS = saved
print("test_python_api: %d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
