#!/usr/bin/env python3
"""train_torch: a PyTorch model made elastic with tide (the Python twin of train_mlp).

The model is train_mlp's: embedding, L blocks [layernorm, fc1, GeLU, fc2, residual], final
layernorm, head, softmax cross-entropy on a deterministic synthetic next-token task,
trained with Adam whose moments live in the tide collection next to the parameters (with
the step counter and the data cursor), so a resize moves the whole optimiser state.
Data parallel (gradient allreduce over dp) and pipeline parallel (GPipe over the
micro-batches, activations and gradients through tide's pp transfers, the waits counted
as bubbles); tp must be 1 (the collection declares the Megatron tp rules, the step
does not split matrices).

    tided &
    mpirun -np 4 python3 train_torch.py --job t --dp 2 --pp 2 --steps 200 --step-ms 20 &
    tidectl resize t --dp 1 --pp 4

--device cuda: every rank trains on the GPU libtide selected for it (rt.device:
cuda:<tide_device>, TIDE_DEVICE or the rank's index on its host) over the nccl backend;
the state, activations and gradients stay on the device and move device to device.

Determinism: torch.set_num_threads(1), parameters a pure function of (seed, name), sample
k a pure function of (seed, k): every layout sees the same batches, and the loss curve
equals a never-resized run up to the order of the dp sum (bit-identical while dp and the
micro-batches stay: a pp-only resize changes no sum).
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
import zlib

import mpi4py

mpi4py.rc.thread_level = "funneled"  # libtide needs >= FUNNELED; everything stays on one thread
from mpi4py import MPI  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import tide  # noqa: E402
from tide import Action, Group, TideError  # noqa: E402


def parse() -> argparse.Namespace:
    return parse_args_for(sys.argv[1:])


def parse_args_for(argv) -> argparse.Namespace:
    """The flags below from argv (defaults: train_mlp's default model)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", default="train_torch")
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: the GPU libtide selects for the rank, over the nccl backend")
    ap.add_argument("--step-ms", type=int, default=0, help="sleep per step (room for a resize)")
    ap.add_argument("--loss-out", help="append 'step loss' lines (first rank of the last stage)")
    ap.add_argument("--check-dir", help="save local shards before and after every switch")
    ap.add_argument("--state-out", help="save every member's local shards of the final state "
                    "(DIR/final.w<rank>.pt), and those of --state-at steps")
    ap.add_argument("--state-at", type=int, action="append", default=[],
                    help="also save the shards at the start of this step (DIR/at<step>.w<rank>.pt)")
    ap.add_argument("--kill-rank", type=int, default=-1, help="test: this pool rank dies...")
    ap.add_argument("--kill-at", type=int, default=-1, help="...inside this step (SIGKILL)")
    ap.add_argument("--time-out", help="append per-step seconds (json lines) for benchmarks")
    return ap.parse_args(argv)


# ---- the state -----------------------------------------------------------------------------

def params_of(a: argparse.Namespace):
    """(name, shape, layer, tp_split) of every parameter, in model order."""
    H, Fw, V = a.hidden, a.ffn, a.vocab
    out = [("embed.weight", (V, H), tide.PRE, 0)]
    for i in range(a.layers):
        p = "layer.%d." % i
        out += [(p + "ln2.weight", (H,), i, None), (p + "ln2.bias", (H,), i, None),
                (p + "fc1.weight", (Fw, H), i, 0), (p + "fc1.bias", (Fw,), i, 0),
                (p + "fc2.weight", (H, Fw), i, 1), (p + "fc2.bias", (H,), i, None)]
    out += [("final_ln.weight", (H,), tide.POST, None), ("final_ln.bias", (H,), tide.POST, None),
            ("head.weight", (V, H), tide.POST, 0)]
    return out


def make_collection(a: argparse.Namespace) -> tide.Collection:
    c = tide.Collection(num_layers=a.layers)
    for name, shape, layer, split in params_of(a):
        for suffix in ("", ".exp_avg", ".exp_avg_sq"):
            c.add(name + suffix, shape, torch.float32, layer=layer, tp_split=split)
    c.add("step", (1,), torch.int64, layer=tide.ALL)
    c.add("data.cursor", (1,), torch.int64, layer=tide.ALL)
    return c


def initial(a: argparse.Namespace, name: str, shape) -> torch.Tensor:
    """The full initial tensor: a pure function of (seed, name)."""
    if name.endswith((".exp_avg", ".exp_avg_sq")) or name.endswith(".bias") or name in ("step", "data.cursor"):
        return torch.zeros(shape, dtype=torch.int64 if name in ("step", "data.cursor") else torch.float32)
    if "ln" in name:
        return torch.ones(shape)
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) ^ a.seed)
    return torch.randn(shape, generator=g) * (1.0 / math.sqrt(shape[-1]))


def fresh_state(a, rt: tide.Runtime, coll: tide.Collection) -> dict:
    v = rt.view
    lay = tide.Layout.of(v.layout)
    state = rt.zeros()
    for name in state:
        spec = coll.specs[coll.index(name)]
        state[name].copy_(coll.extract(lay, name, v.coord, initial(a, name, spec.shape)))
    return state


# ---- the data --------------------------------------------------------------------------------

def batch(a, first: int, n: int):
    """Samples [first, first + n): tokens and next-token targets (a fixed rule)."""
    k = torch.arange(first, first + n, dtype=torch.int64).unsqueeze(1)
    j = torch.arange(a.seq, dtype=torch.int64).unsqueeze(0)
    tok = (k * 2654435761 + j * 40503 + a.seed * 97) % a.vocab
    return tok, (tok * 5 + 3) % a.vocab


# ---- the step --------------------------------------------------------------------------------

class Trainer:
    def __init__(self, a, rt: tide.Runtime, coll: tide.Collection) -> None:
        self.a, self.rt, self.coll = a, rt, coll
        self.dev = rt.device  # where the state lives: libtide's choice
        self.pnames = [p[0] for p in params_of(a)]
        self.pending = None  # (step, [summed grads]) once the step's gradients are reduced

    def adopt(self, state: dict) -> None:
        self.state = state
        v = self.rt.view
        self.v = v
        self.mine = [n for n in self.pnames if n in state]
        if v.member and v.layout.tp != 1:
            raise TideError(tide.Status.ERR_UNSUPPORTED, "train_torch runs tp = 1 only")

    def block(self, h, i):
        s, p = self.state, "layer.%d." % i
        x = F.layer_norm(h, (self.a.hidden,), s[p + "ln2.weight"], s[p + "ln2.bias"])
        x = F.gelu(F.linear(x, s[p + "fc1.weight"], s[p + "fc1.bias"]))
        return h + F.linear(x, s[p + "fc2.weight"], s[p + "fc2.bias"])

    def step(self) -> float:
        """One step; returns the global mean loss. Raises TideError when a peer failed
        before this rank's update (the state is then unchanged)."""
        a, rt, v, s = self.a, self.rt, self.v, self.state
        L = v.layout
        first, last = v.pp_rank == 0, v.pp_rank == L.pp - 1
        if a.global_batch % (L.dp * L.micro_batches):
            raise TideError(tide.Status.ERR_INVALID, "dp x micro-batches must divide --global-batch")
        per = a.global_batch // L.dp // L.micro_batches
        cursor = int(s["data.cursor"][0])
        for n in self.mine:
            s[n].requires_grad_(True)
            s[n].grad = None
        norm = 1.0 / (a.global_batch * a.seq)
        saved, local = [], 0.0
        for m in range(L.micro_batches):
            tok, tgt = batch(a, cursor + (v.dp_rank * L.micro_batches + m) * per, per)
            tok, tgt = tok.to(self.dev), tgt.to(self.dev)
            if first:
                h_in, h = None, F.embedding(tok, s["embed.weight"])
            else:
                h_in = torch.empty(per, a.seq, a.hidden, device=self.dev)
                rt.pp_exchange(recv=h_in, recv_from=-1)
                h = h_in.requires_grad_(True)
            for i in L.stage_layers(v.pp_rank):
                h = self.block(h, i)
            if last:
                x = F.layer_norm(h, (a.hidden,), s["final_ln.weight"], s["final_ln.bias"])
                loss = F.cross_entropy(F.linear(x, s["head.weight"]).reshape(-1, a.vocab),
                                       tgt.reshape(-1), reduction="sum") * norm
                local += float(loss)
                saved.append((h_in, loss))
            else:
                rt.pp_exchange(send=h.detach().contiguous(), send_to=+1)
                saved.append((h_in, h))
        for h_in, out in reversed(saved):
            if last:
                out.backward()
            else:
                g = torch.empty_like(out)
                rt.pp_exchange(recv=g, recv_from=+1)
                out.backward(g)
            if not first:
                rt.pp_exchange(send=h_in.grad.contiguous(), send_to=-1)
        if v.member and v.pp_rank >= 0 and self.rt.pool_rank == a.kill_rank and int(s["step"][0]) == a.kill_at:
            print("train_torch: rank %d (worker %d) dies inside step %d" % (a.kill_rank, self.rt.worker_id, a.kill_at), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        flat = torch.cat([s[n].grad.reshape(-1) for n in self.mine])
        if L.dp > 1:
            rt.allreduce(flat, Group.DP)
        grads = [g.view_as(s[n]) for g, n in zip(torch.split(flat, [s[n].numel() for n in self.mine]), self.mine)]
        self.pending = (int(s["step"][0]), grads)
        rt.step_can_finish()  # the update below needs no peer any more
        lt = torch.tensor([local], dtype=torch.float64, device=self.dev)
        if L.dp > 1:  # the last reductions span the whole layout (tp = 1)
            rt.allreduce(lt, Group.DP)
        if L.pp > 1:
            rt.allreduce(lt, Group.PP)
        self.apply()
        return float(lt[0])

    def apply(self) -> None:
        """Adam on the local parameters from the pending summed gradients."""
        a, s = self.a, self.state
        step, grads = self.pending
        if step != int(s["step"][0]):
            raise TideError(tide.Status.ERR_INTERNAL, "no summed gradients for step %d" % int(s["step"][0]))
        t = step + 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        with torch.no_grad():
            for n, g in zip(self.mine, grads):
                p, m, v2 = s[n], s[n + ".exp_avg"], s[n + ".exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v2.mul_(b2).addcmul_(g, g, value=1 - b2)
                p.sub_(a.lr * (m / c1) / ((v2 / c2).sqrt() + eps))
                p.requires_grad_(False)
                p.grad = None
            s["step"] += 1
            s["data.cursor"] += a.global_batch
        self.pending = None


def save_shards(rt: tide.Runtime, state: dict, view: tide.View, path: str) -> None:
    """This rank's local shards (copied to host memory) with their coordinate and layout:
    what tests/python/jobs.py's gather() assembles into the full state."""
    L = view.layout
    torch.save({"coord": view.coord, "layout": (L.dp, L.tp, L.pp, L.num_layers, L.micro_batches,
                                                L.stage_start),
                "state": {k: x.detach().cpu().clone() for k, x in state.items()}}, path)


def main() -> int:
    a = parse()
    if a.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    # on CUDA an op without a deterministic kernel warns instead of stopping the job
    torch.use_deterministic_algorithms(True, warn_only=a.device == "cuda")
    coll = make_collection(a)
    # device buffers need the device backend (TIDE_BACKEND still wins for cpu)
    settings = {"backend": "nccl"} if a.device == "cuda" else {}
    with tide.Runtime(MPI.COMM_WORLD, **settings) as rt:
        me = rt.pool_rank  # the ids of rt.view.layout; rt.worker_id is tided's (tidectl status)
        if rt.device.type != a.device:
            raise TideError(tide.Status.ERR_INVALID, "--device %s, but the %s backend takes %s "
                            "tensors" % (a.device, rt.backend, rt.device.type))
        if a.device == "cuda":
            print("train_torch: pool rank %d on %s (tide_device %d, %s backend)" % (
                me, rt.device, rt.device_index, rt.backend), flush=True)
        rt.join(a.job, coll, dp=a.dp, tp=a.tp, pp=a.pp, micro_batches=a.micro_batches)
        state = fresh_state(a, rt, coll) if rt.view.member else {}
        rt.set_buffers(state)
        tr = Trainer(a, rt, coll)
        tr.adopt(state)
        while True:
            act = rt.step_begin()
            if act is Action.FINISHED:
                break
            if act is Action.RECONFIGURE:
                nv = rt.next_view
                if a.check_dir and rt.view.member:
                    save_shards(rt, state, rt.view, "%s/g%d.before.w%d.pt" % (a.check_dir, nv.generation, me))
                state = rt.reshard()
                tr.adopt(state)
                v = rt.view
                if v.member and a.check_dir:
                    save_shards(rt, state, v, "%s/g%d.after.w%d.pt" % (a.check_dir, v.generation, me))
                if v.member and v.coord == (0, 0, 0):
                    print("train_torch: generation %d (dp %d, tp %d, pp %d) from step %d" % (
                        v.generation, v.layout.dp, v.layout.tp, v.layout.pp, v.step), flush=True)
                continue
            v = rt.view
            if act is Action.FINISH:
                tr.apply()  # the step's last reduction failed after its gradients were summed
                rt.step_end()
                continue
            if a.state_out and v.member and (v.step >= a.steps or v.step in a.state_at):
                save_shards(rt, state, v, "%s/%s.w%d.pt" % (
                    a.state_out, "final" if v.step >= a.steps else "at%d" % v.step, me))
            if v.step >= a.steps:
                rt.finish()
                break
            if int(state["step"][0]) != v.step:
                raise TideError(tide.Status.ERR_INTERNAL, "model at step %d, runtime at %d" % (
                    int(state["step"][0]), v.step))
            t0 = time.perf_counter()
            try:
                loss = tr.step()
            except TideError as e:
                if e.status != tide.Status.ERR_ABORTED:
                    raise
                rt.step_end(e)  # a peer died: not counted, the next begin reconfigures
                print("train_torch: rank %d: step %d aborted: %s" % (me, v.step, e), flush=True)
                continue
            dt = time.perf_counter() - t0
            rt.step_end()
            if v.pp_rank == v.layout.pp - 1 and v.dp_rank == 0:
                if a.loss_out:
                    with open(a.loss_out, "a") as f:
                        f.write("%d %.17g\n" % (v.step, loss))  # every bit of the float64
                if v.step % 10 == 0:
                    print("train_torch: step %d loss %.6f (dp %d, pp %d)" % (
                        v.step, loss, v.layout.dp, v.layout.pp), flush=True)
            if a.time_out and v.coord == (0, 0, 0):
                with open(a.time_out, "a") as f:
                    f.write("%d %.9f\n" % (v.step, dt))
            if a.step_ms:
                time.sleep(a.step_ms / 1000.0)
        print("train_torch: rank %d done" % me, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
