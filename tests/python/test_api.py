"""Bad input to every public call of the tide Python binding raises TideError with a status
and a message that names the problem, loses nothing (the runtime works after), and never
crashes the interpreter. SPMD: `mpirun -np 2 python3 -m pytest test_api.py` against the
session's tided; rank 0 resizes the job from dp 2 to dp 1 with tidectl so that reshard
meets bad new states. Tensors on another device (cuda, or cpu:1: the device INDEX must
match the runtime's, not only its type) are refused; no GPU is needed: a tensor subclass
claims the device. The tests share one runtime and run in file order."""
import os
import subprocess
import threading
import time

import pytest

mpi4py = pytest.importorskip("mpi4py")
torch = pytest.importorskip("torch")
mpi4py.rc.thread_level = "funneled"
from mpi4py import MPI  # noqa: E402

import tide  # noqa: E402
from tide import Group, Status  # noqa: E402
from spmd import Checks, on  # noqa: E402

ME = MPI.COMM_WORLD.Get_rank()
if MPI.COMM_WORLD.Get_size() != 2:
    pytest.skip("run under mpirun -np 2", allow_module_level=True)
I = Status.ERR_INVALID
R = Status.ERR_RANGE
c = lay = lay3 = info = full = sh = rt = st = x = me = keep = good = new = nv = a = None


def test_collection(tided):
    global c, lay, lay3, info, full, sh, rt, st, x, me, keep, good, new, nv, a
    ck = Checks(ME)
    # ---- Collection ----
    ck.expect("Collection(0)", lambda: tide.Collection(0), I, "num_layers")
    ck.expect("Collection('2')", lambda: tide.Collection("2"), I, "num_layers")
    c = tide.Collection(2)
    ck.expect("add name int", lambda: c.add(5, (4,)), I, "name must be a str")
    ck.expect("add name long", lambda: c.add("x" * 200, (4,)), I, "1..95 bytes")
    ck.expect("add empty name", lambda: c.add("", (4,)), I, "1..95 bytes")
    ck.expect("add shape int", lambda: c.add("a", 4), I, "tuple of ints")
    ck.expect("add shape 5 dims", lambda: c.add("a", (1, 1, 1, 1, 1)), I, "1..4 positive dims")
    ck.expect("add shape negative", lambda: c.add("a", (4, -1)), I, "positive dims")
    ck.expect("add shape float", lambda: c.add("a", (4.0,)), I, "positive dims")
    ck.expect("add dtype", lambda: c.add("a", (4,), torch.complex64), I, "dtype of 'a'")
    ck.expect("add dtype str", lambda: c.add("a", (4,), "float32"), I, "dtype of 'a'")
    ck.expect("add layer", lambda: c.add("a", (4,), layer=2), I, "layer of 'a'")
    ck.expect("add layer -4", lambda: c.add("a", (4,), layer=-4), I, "layer of 'a'")
    ck.expect("add tp_split", lambda: c.add("a", (4,), tp_split=1), I, "tp_split")
    ck.expect("add segments", lambda: c.add("a", (4,), tp_segments=0), I, "tp_segments")
    ck.expect("C rejects: segments", lambda: c.add("q", (6, 4), tp_split=0, tp_segments=4), I, "")
    ck.ok("add good", c.add("w", (8, 4), torch.float32, layer=0, tp_split=0) == 0)
    c.add("v", (8, 4), torch.float32, layer=1, tp_split=0, dp_sharded=True)
    c.add("step", (1,), torch.int64)
    ck.expect("add duplicate", lambda: c.add("w", (4,)), Status.ERR_EXISTS, "already")
    ck.expect("index unknown", lambda: c.index("nope"), Status.ERR_NOT_FOUND, "nope")
    ck.expect("index not str", lambda: c.index(["w"]), I, "name must be a str")
    ck.expect("local_shape index", lambda: c.local_shape(3, 1, 1, 16), R, "tensor index must be an int in 0..2")
    ck.expect("local_shape index -1", lambda: c.local_shape(-1, 1, 1, 16), R, "tensor index")
    ck.expect("local_shape index type", lambda: c.local_shape(0.0, 1, 1, 16), R, "tensor index")
    ck.expect("local_shape name", lambda: c.local_shape("nope", 1, 1, 16), Status.ERR_NOT_FOUND, "nope")
    ck.expect("local_shape tp", lambda: c.local_shape("w", 0, 1, 16), I, "tp must be")
    ck.expect("local_shape dp", lambda: c.local_shape("w", 1, "2", 16), I, "dp must be")
    ck.expect("local_shape nbytes", lambda: c.local_shape("w", 1, 1, -4), I, "nbytes")
    ck.expect("local_shape nbytes partial", lambda: c.local_shape("w", 1, 1, 6), I, "whole number")
    ck.expect("local_shape tp divides", lambda: c.local_shape("w", 3, 1, 32), I, "does not divide")
    ck.ok("local_shape good", c.local_shape("w", 2, 1, 64) == (4, 4) and c.local_shape(1, 2, 2, 32) == (8,))
    ck.ok("names", c.names() == ["w", "v", "step"] and len(c) == 3)
    ck.done()


def test_layout_geometry(tided):
    global c, lay, lay3, info, full, sh, rt, st, x, me, keep, good, new, nv, a
    ck = Checks(ME)
    # ---- Layout and shard geometry ----
    ck.expect("Layout dp 0", lambda: tide.Layout(0, 1, 1, 2), I, "dp must be")
    ck.expect("Layout stages", lambda: tide.Layout(1, 1, 2, 2, 1, [0, 1]), I, "stage_start")
    ck.expect("Layout C stages", lambda: tide.Layout(1, 1, 2, 2, 1, [0, 0, 2]), I, "tide_layout_set_stages")
    ck.expect("Layout stages type", lambda: tide.Layout(1, 1, 2, 2, 1, 5), I, "stage_start")
    ck.expect("Layout stages str", lambda: tide.Layout(1, 1, 2, 2, 1, "012"), I, "stage_start")
    ck.expect("Layout validate", lambda: tide.Layout(1, 3, 1, 2).validate(c), I, "does not divide")
    ck.expect("Layout validate type", lambda: tide.Layout(1, 1, 1, 2).validate("c"), I, "tide.Collection")
    ck.expect("Layout.of type", lambda: tide.Layout.of((1, 1, 1, 2)), I, "LayoutInfo")
    info = tide.LayoutInfo(1, 1, 2, 2, 1, (0, 1, 2), (0, 1))
    ck.ok("stage_layers", info.stage_layers(1) == range(1, 2))
    ck.expect("stage_layers range", lambda: info.stage_layers(2), R, "stage must be an int in 0..1")
    ck.expect("stage_layers type", lambda: info.stage_layers("0"), R, "stage")
    ck.ok("Layout.of", tide.Layout.of(info).pp == 2)
    lay3 = tide.Layout(1, 1, 1, 3)  # 3 layers: not the collection's 2
    ck.expect("shard_bytes layers", lambda: lay3.shard_bytes(c, "w", (0, 0, 0)), I, "3 layers")
    ck.expect("shard_bytes coll type", lambda: lay3.shard_bytes("c", "w", (0, 0, 0)), I, "tide.Collection")
    ck.expect("extract layers", lambda: c.extract(lay3, "w", (0, 0, 0), torch.zeros(8, 4)), I, "3 layers")
    ck.expect("extract layout type", lambda: c.extract("lay", "w", (0, 0, 0), torch.zeros(8, 4)), I, "tide.Layout")
    ck.expect("assemble layers", lambda: c.assemble(lay3, {}), I, "3 layers")
    lay = tide.Layout(2, 2, 2, 2)
    ck.expect("shard_bytes coord", lambda: lay.shard_bytes(c, "w", (0, 2, 0)), I, "coordinate")
    ck.expect("shard_bytes coord type", lambda: lay.shard_bytes(c, "w", [0, 0, 0]), I, "coordinate")
    ck.expect("shard_bytes name", lambda: lay.shard_bytes(c, "x", (0, 0, 0)), Status.ERR_NOT_FOUND, "x")
    ck.ok("shard_bytes good", lay.shard_bytes(c, "w", (0, 1, 1)) == 4 * 4 * 4)
    full = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    ck.expect("extract shape", lambda: c.extract(lay, "w", (0, 0, 0), full.t()), I, "")
    ck.expect("extract dtype", lambda: c.extract(lay, "w", (0, 0, 0), full.double()), I, "must be torch.float32")
    ck.expect("extract noncontig", lambda: c.extract(lay, "w", (0, 0, 0), full[:, ::2]), I, "")
    ck.expect("extract not tensor", lambda: c.extract(lay, "w", (0, 0, 0), [1, 2]), I, "torch.Tensor")
    ck.expect("extract device", lambda: c.extract(lay, "w", (0, 0, 0), on("cuda:0", full)), I, "must be on cpu, got cuda:0")
    ck.expect("extract name", lambda: c.extract(lay, "nope", (0, 0, 0), full), Status.ERR_NOT_FOUND, "nope")
    ck.ok("extract good", torch.equal(c.extract(lay, "w", (0, 0, 1), full), full[4:]))
    ck.expect("assemble missing", lambda: c.assemble(lay, {}), I, "no shards")
    sh = {(p, d, t): {} for p in range(2) for d in range(2) for t in range(2)}
    ck.expect("assemble held missing", lambda: c.assemble(lay, sh), I, "shard 'w'")
    ck.expect("assemble type", lambda: c.assemble(lay, [1]), I, "must be a mapping")
    ck.expect("assemble coord type", lambda: c.assemble(lay, {k: [] for k in sh}), I, "must be a mapping name")
    ck.expect("assemble layout type", lambda: c.assemble(None, sh), I, "tide.Layout")
    ck.done()


def test_runtime_settings(tided):
    global c, lay, lay3, info, full, sh, rt, st, x, me, keep, good, new, nv, a
    ck = Checks(ME)
    # ---- Runtime ----
    ck.expect("Runtime comm", lambda: tide.Runtime("world"), I, "mpi4py intracommunicator")
    ck.expect("Runtime setting", lambda: tide.Runtime(MPI.COMM_WORLD, bogus=1), I, "unknown setting")
    ck.expect("Runtime endpoint type", lambda: tide.Runtime(MPI.COMM_WORLD, endpoint=5), I, "endpoint")
    ck.expect("Runtime timeout", lambda: tide.Runtime(MPI.COMM_WORLD, join_timeout_ms=-3), I, "join_timeout_ms")
    ck.expect("Runtime device", lambda: tide.Runtime(MPI.COMM_WORLD, device=-2), I, "device")
    ck.expect("Runtime priority", lambda: tide.Runtime(MPI.COMM_WORLD, priority=101), I,
              "priority must be an int in 0..100")
    ck.expect("Runtime min_gpus", lambda: tide.Runtime(MPI.COMM_WORLD, min_gpus=-1), I, "min_gpus")
    ck.expect("Runtime no tided", lambda: tide.Runtime(MPI.COMM_WORLD, endpoint="tcp://127.0.0.1:1",
                                                     register_timeout_ms=300), Status.ERR_TIMEOUT, "tide_new")
    ck.done()


def test_runtime_and_join(tided):
    global c, lay, lay3, info, full, sh, rt, st, x, me, keep, good, new, nv, a
    ck = Checks(ME)
    rt = tide.Runtime(MPI.COMM_WORLD)
    ck.ok("pool_rank", rt.pool_rank == ME)
    ck.ok("pool_worker_id of self", rt.worker_id >= 0 and rt.pool_worker_id(rt.pool_rank) == rt.worker_id)
    ck.ok("pool_worker_id out of range", rt.pool_worker_id(-1) == -1 and rt.pool_worker_id(rt.pool_size) == -1)
    ck.expect("pool_worker_id type", lambda: rt.pool_worker_id("0"), I, "rank must be an int")
    # the device libtide chose: both ranks on one host, so their local indices (mpi: host memory)
    ck.ok("device", rt.device == torch.device("cpu") and rt.device_type == "cpu" and rt.device_index == ME)
    ck.expect("zeros before join", lambda: rt.zeros(), I, "join first")
    ck.expect("collection before join", lambda: rt.collection, I, "join first")
    ck.expect("join job", lambda: rt.join("", c), I, "job must be")
    ck.expect("join job NUL", lambda: rt.join("a\0b", c), I, "job must be")
    ck.expect("join job type", lambda: rt.join(7, c), I, "job must be")
    ck.expect("join collection", lambda: rt.join("api", "c"), I, "tide.Collection")
    ck.expect("join dp", lambda: rt.join("api", c, dp=0), I, "dp must be")
    ck.expect("join pp type", lambda: rt.join("api", c, pp=1.5), I, "pp must be")
    ck.expect("join start_step", lambda: rt.join("api", c, start_step=-1), I, "start_step")
    ck.expect("join bad job chars (C)", lambda: rt.join("a b", c), I, "tide_join")
    ck.expect("join fit type", lambda: rt.join("api", c, fit="dp"), I, "fit must be a sequence")
    ck.expect("join fit tuple", lambda: rt.join("api", c, fit=[("dp",)]), I, "fit[0] must be")
    ck.expect("join fit degree", lambda: rt.join("api", c, fit=[("ep", 4)]), I, "degree must be")
    ck.expect("join fit n", lambda: rt.join("api", c, fit=[("tp", 0)]), I, "fit[0]: n must be")
    ck.expect("join fit what", lambda: rt.join("api", c, fit=[("dp", 4, "a\nb")]), I, "printable")
    ck.expect("join fit many", lambda: rt.join("api", c, fit=[("dp", 4)] * 33), I, "at most 32")
    # the C library refuses a first layout the program's own rules forbid, naming the rule
    ck.expect("join fit first layout (C)",
           lambda: rt.join("api", c, dp=1, tp=2, fit=[("dp", 4), ("tp", 3, "the heads")]), I,
           "tp 2 does not divide 3 (the heads)")
    N = Status.ERR_NOT_FOUND
    ck.expect("join resume type", lambda: rt.join("api", c, resume=5), I, "checkpoint path")
    ck.expect("join resume absent (C)", lambda: rt.join("api", c, resume="/nonexistent/ck"), N,
              "tide_checkpoint_find")
    ck.expect("find_checkpoint empty", lambda: tide.find_checkpoint(""), I, "non-empty str")
    ck.expect("load_checkpoint before join", lambda: rt.load_checkpoint({}, "/x"), I, "join first")
    rt.join("api-ok", c, dp=2, tp=1, pp=1, fit=[("dp", 4, "the batch"), ("tp", 8)])
    ck.expect("add after join", lambda: c.add("late", (4,)), I, "frozen")
    ck.expect("join twice", lambda: rt.join("api-ok", c), I, "already joined")
    ck.done()


def test_buffers(tided):
    global c, lay, lay3, info, full, sh, rt, st, x, me, keep, good, new, nv, a
    ck = Checks(ME)
    st = rt.zeros()
    ck.ok("zeros", sorted(st) == ["step", "v", "w"] and st["v"].shape == (16,) and st["w"].shape == (8, 4))
    ck.expect("set_buffers type", lambda: rt.set_buffers([1]), I, "mapping")
    ck.expect("set_buffers missing", lambda: rt.set_buffers({"w": st["w"]}), I, "lacks tensors")
    ck.expect("set_buffers extra", lambda: rt.set_buffers(dict(st, x=st["w"])), I, "does not hold")
    ck.expect("set_buffers dtype", lambda: rt.set_buffers(dict(st, w=st["w"].double())), I, "float32")
    ck.expect("set_buffers size", lambda: rt.set_buffers(dict(st, w=torch.zeros(4, 4))), I, "bytes")
    ck.expect("set_buffers noncontig", lambda: rt.set_buffers(dict(st, w=torch.zeros(4, 8).t())), I, "contiguous")
    ck.expect("set_buffers not tensor", lambda: rt.set_buffers(dict(st, w=3)), I, "torch.Tensor")
    ck.expect("set_buffers cuda", lambda: rt.set_buffers(dict(st, w=on("cuda:0", st["w"]))), I,
           "tensor 'w' must be on cpu (the runtime's device: tide_device %d, mpi backend), got cuda:0" % ME)
    ck.expect("set_buffers device index", lambda: rt.set_buffers(dict(st, w=on("cpu:1", st["w"]))), I,
           "must be on cpu (the runtime's device")
    ck.expect("set_buffers shared", lambda: rt.set_buffers(dict(st, v=st["w"].view(-1)[:16])), I,
           "set_buffers: tensors v and w share memory")
    rt.set_buffers(st)
    ck.expect("reshard outside", lambda: rt.reshard(), I, "RECONFIGURE")
    ck.ok("next_view None", rt.next_view is None)
    ck.expect("step_end before begin (C)", lambda: rt.step_end(), I, "tide_step_end")
    ck.done()


def test_step_and_collectives(tided):
    global c, lay, lay3, info, full, sh, rt, st, x, me, keep, good, new, nv, a
    ck = Checks(ME)
    ck.expect("checkpoint root type", lambda: rt.checkpoint(5), I, "checkpoint root")
    ck.expect("checkpoint_every every", lambda: rt.checkpoint_every("/tmp/ck", -1), I, "every")
    ck.expect("checkpoint_every keep", lambda: rt.checkpoint_every("/tmp/ck", 1, "2"), I, "keep")
    ck.expect("load_checkpoint no path", lambda: rt.load_checkpoint(st), I, "no path")
    ck.expect("load_checkpoint state", lambda: rt.load_checkpoint({"w": st["w"]}, "/x"), I,
              "lacks tensors")
    ck.expect("load_checkpoint absent (C)", lambda: rt.load_checkpoint(st, "/nonexistent/ck"),
              Status.ERR_NOT_FOUND, "tide_checkpoint_load")
    ck.ok("step_begin", rt.step_begin() is tide.Action.RUN)
    ck.expect("checkpoint inside a step (C)", lambda: rt.checkpoint("/tmp/ck"), I, "inside step")
    x = torch.ones(4)
    ck.expect("allreduce group", lambda: rt.allreduce(x, "dp"), I, "tide.Group")
    ck.expect("allreduce tensor", lambda: rt.allreduce([1.0]), I, "torch.Tensor")
    ck.expect("allreduce dtype", lambda: rt.allreduce(torch.ones(4, dtype=torch.uint8)), I, "dtype")
    ck.expect("allreduce op", lambda: rt.allreduce(x, Group.DP, "sum"), I, "ReduceOp")
    ck.expect("allreduce noncontig", lambda: rt.allreduce(torch.ones(4, 4).t()), I, "contiguous")
    ck.expect("allreduce autograd", lambda: rt.allreduce(torch.ones(4, requires_grad=True) * 2), I, "leaf")
    ck.expect("allreduce cuda", lambda: rt.allreduce(on("cuda:0", x)), I, "allreduce tensor must be on cpu")
    ck.expect("allreduce device index", lambda: rt.allreduce(on("cpu:1", x)), I, "got cpu:1")
    ck.ok("allreduce good", torch.equal(rt.allreduce(x, Group.ALL), torch.full((4,), 2.0)))
    ck.expect("broadcast root", lambda: rt.broadcast(x, 2), I, "root must be a rank in 0..1")
    ck.expect("broadcast root type", lambda: rt.broadcast(x, "0"), I, "root")
    ck.expect("broadcast group", lambda: rt.broadcast(x, 0, 1), I, "tide.Group")
    ck.expect("broadcast device", lambda: rt.broadcast(on("cuda:1", x), 0), I, "got cuda:1")
    ck.expect("allgather tensor", lambda: rt.allgather([1.0]), I, "torch.Tensor")
    ck.expect("allgather device", lambda: rt.allgather(on("cpu:1", x)), I, "got cpu:1")
    ck.expect("barrier group", lambda: rt.barrier("all"), I, "tide.Group")
    ck.expect("group_size group", lambda: rt.group_size(None), I, "tide.Group")
    ck.expect("group_rank group", lambda: rt.group_rank("dp"), I, "tide.Group")
    ck.ok("group_size/rank", rt.group_size(Group.DP) == 2 and rt.group_rank(Group.DP) == rt.view.dp_rank)
    ck.expect("p2p group", lambda: rt.p2p("pp", sends=[(0, x)]), I, "tide.Group")
    ck.expect("p2p peer", lambda: rt.p2p(Group.PP, sends=[(1, x)]), I, "peer")
    ck.expect("p2p entry", lambda: rt.p2p(Group.PP, sends=[x]), I, "(peer, tensor)")
    ck.expect("p2p sends type", lambda: rt.p2p(Group.PP, sends=5), I, "sends must be a list")
    ck.expect("p2p sends tensor", lambda: rt.p2p(Group.PP, sends=x), I, "sends must be a list")
    ck.expect("p2p recvs dict", lambda: rt.p2p(Group.PP, recvs={0: x}), I, "recvs must be a list")
    ck.expect("p2p bubble", lambda: rt.p2p(Group.PP, sends=[(0, x)], bubble="yes"), I, "bubble must be a bool")
    ck.expect("p2p device", lambda: rt.p2p(Group.PP, recvs=[(0, on("cuda:0", x))]), I, "p2p tensor must be on cpu")
    ck.expect("pp_exchange no stage", lambda: rt.pp_exchange(send=x, send_to=1), I, "no next stage")
    ck.expect("pp_exchange dir", lambda: rt.pp_exchange(recv=x, recv_from=2), I, "direction")
    ck.expect("pp_exchange dir float", lambda: rt.pp_exchange(recv=x, recv_from=-1.0), I, "direction")
    ck.expect("pp_exchange dir bool", lambda: rt.pp_exchange(send=x, send_to=True), I, "direction")
    ck.ok("allgather", torch.equal(rt.allgather(x), torch.full((2, 4), 2.0)))
    me = rt.group_rank(Group.ALL)
    ck.ok("p2p self", rt.p2p(Group.ALL, sends=[(me, x)], recvs=[(me, torch.empty(4))]) is None)
    ck.ok("bubble_stats", set(rt.bubble_stats()) == {"windows", "bubble_ms", "filled_ms", "task_steps", "task"})
    ck.expect("step_end value", lambda: rt.step_end("ok"), I, "step_end takes")
    ck.expect("step_end bool", lambda: rt.step_end(True), I, "step_end takes")
    errs = []
    th = threading.Thread(target=lambda: errs.append(ck.expect("other thread", rt.step_begin, I, "thread")))
    th.start()
    th.join()
    rt.step_end()
    ck.ok("step counted", rt.view.step == 1)

    ck.done()


def test_reshard(tided, tidectl):
    global c, lay, lay3, info, full, sh, rt, st, x, me, keep, good, new, nv, a
    ck = Checks(ME)
    # ---- reshard: tidectl shrinks the job to dp 1; both ranks meet the switch with bad new
    # states first (refused before anything starts), then move with the right one.
    if ME == 0:
        r = subprocess.run([tidectl, "resize", "api-ok", "--dp", "1"], capture_output=True,
                           text=True, timeout=60)
        ck.ok("tidectl resize", r.returncode == 0)
    deadline = time.time() + 60
    while True:
        a = rt.step_begin()
        if a is tide.Action.RECONFIGURE or time.time() > deadline:
            break
        rt.step_end()
    ck.ok("reconfigure", a is tide.Action.RECONFIGURE)
    nv = rt.next_view
    ck.ok("next_view", nv is not None and nv.layout.dp == 1 and nv.generation == 2)
    keep = rt.view.member and nv.member  # the rank that stays holds every tensor whole
    if keep:
        good = {"w": torch.zeros(8, 4), "v": torch.zeros(8, 4), "step": torch.zeros(1, dtype=torch.int64)}
    else:
        good = {}
    ck.expect("reshard type", lambda: rt.reshard([1]), I, "mapping")
    ck.expect("reshard extra", lambda: rt.reshard(dict(good, x=torch.zeros(4))), I, "does not hold")
    if keep:
        ck.expect("reshard missing", lambda: rt.reshard({"w": good["w"]}), I, "lacks tensors")
        ck.expect("reshard size", lambda: rt.reshard(dict(good, v=torch.zeros(16))), I, "must hold 128 bytes")
        ck.expect("reshard dtype", lambda: rt.reshard(dict(good, step=torch.zeros(1))), I, "torch.int64")
        ck.expect("reshard noncontig", lambda: rt.reshard(dict(good, w=torch.zeros(4, 8).t())), I, "contiguous")
        ck.expect("reshard not tensor", lambda: rt.reshard(dict(good, w=None)), I, "torch.Tensor")
        ck.expect("reshard device", lambda: rt.reshard(dict(good, w=on("cuda:0", good["w"]))), I, "got cuda:0")
        ck.expect("reshard device index", lambda: rt.reshard(dict(good, w=on("cpu:1", good["w"]))), I, "got cpu:1")
        ck.expect("reshard old state", lambda: rt.reshard(dict(good, w=st["w"])), I,
               "tensors new w and registered w share memory")
        ck.expect("reshard shared", lambda: rt.reshard(dict(good, v=good["w"])), I, "new v and new w share memory")
        ck.ok("still RECONFIGURE after refusals", rt.next_view == nv)
    for t in st.values():
        t.fill_(1)
    new = rt.reshard(good if keep else None)
    ck.ok("reshard", sorted(new) == (["step", "v", "w"] if keep else []))
    if keep:
        ck.ok("reshard moved the state", all(bool((t == 1).all()) for t in new.values()))
        ck.ok("reshard gave the given tensors", all(new[k] is good[k] for k in good))
        ck.ok("view after reshard", rt.view.generation == 2 and rt.view.layout.dp == 1)
        ck.ok("still works after bad input", rt.step_begin() is tide.Action.RUN)
        rt.step_end()
        ck.ok("step_begin", rt.step_begin() is tide.Action.RUN)
        rt.finish()
    else:
        ck.ok("idle after reshard", not rt.view.member)
        ck.ok("finished", rt.step_begin() is tide.Action.FINISHED)
    ck.done()


def test_closed(tided):
    global c, lay, lay3, info, full, sh, rt, st, x, me, keep, good, new, nv, a
    ck = Checks(ME)
    ck.expect("reshard after", lambda: rt.reshard(), I, "RECONFIGURE")
    rt.close()
    ck.expect("closed", lambda: rt.step_begin(), I, "closed")
    ck.expect("closed allreduce", lambda: rt.allreduce(x), I, "closed")
    ck.expect("closed device", lambda: rt.worker_id, I, "closed")
    ck.ok("SYMBOLS", "tide_new" in tide.SYMBOLS and "tide_device" in tide.SYMBOLS)

    ck.done()


def test_abi(tided):
    global c, lay, lay3, info, full, sh, rt, st, x, me, keep, good, new, nv, a
    ck = Checks(ME)
    # the struct mirrors against the library's layout: a drifted copy is refused, by name
    from tide import _lib as L
    import ctypes

    def abi_refused(what, fields, name, text):
        drifted = type("Drifted", (ctypes.Structure,), {"_c_name_": name, "_fields_": fields})
        try:
            L.check_abi(L.lib(), [drifted], "libtide")
        except L.AbiError as e:
            ck.ok("abi %s: %s" % (what, e), text in str(e) and "different versions" in str(e))
        except Exception as e:  # noqa: BLE001
            ck.ok("abi %s: %s: %s" % (what, type(e).__name__, e), False)
        else:
            ck.ok("abi %s: accepted" % what, False)

    ck.ok("abi of the binding", L.check_abi(L.lib()) is None)
    vf, of = list(L.ViewS._fields_), list(L.Options._fields_)
    # tide_view's last int (pp_next) sits in padding: only the count tells it is missing
    abi_refused("field missing", vf[:-1], "tide_view",
                "tide_view has %d fields in the library, %d in" % (len(vf), len(vf) - 1))
    abi_refused("field missing at the end", of[:-1], "tide_options",
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
    L.STRUCTS = (type("Drifted", (ctypes.Structure,), {"_c_name_": "tide_view", "_fields_": vf[:-1]}),)
    try:
        L.lib()
        ck.ok("load refuses a drifted mirror", False)
    except L.AbiError as e:
        ck.ok("load refuses a drifted mirror", "tide_view has" in str(e))
    finally:
        L._lib, L.STRUCTS = saved
    ck.done()
