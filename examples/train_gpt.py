#!/usr/bin/env python3
"""train_gpt: a decoder-only transformer trained as a byte-level language model, elastic
with tide.torch (data, tensor and pipeline parallel).

The model: token and position embeddings, L blocks [layer norm, causal self-attention
(fused qkv: ColumnParallelLinear with 3 segments, projection: RowParallelLinear), layer
norm, MLP (ColumnParallelLinear, GeLU, RowParallelLinear)], a final layer norm and a head
over the 256 byte values; AdamW. The text is read from disk: by default the English
quotations of Debian's fortunes-min package (/usr/share/games/fortunes, installed by
scripts/install-deps.sh); --corpus names other files. Nothing is downloaded.

    tided &
    mpirun -np 4 python3 train_gpt.py --job gpt --dp 2 --pp 2 --micro-batches 2 --steps 300 &
    tidectl resize gpt --dp 1 --tp 2 --pp 2

--device cuda: every rank trains on the GPU libtide selected (nccl backend).
Determinism: torch.set_num_threads(1), the model built from --seed on every rank, and the
batch of step s a pure function of (seed, s): every layout trains on the same samples, so
a resized run follows the never-resized one up to the order of floating-point sums.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import signal
import sys
import time
from typing import List, Tuple

import mpi4py

# libtide needs >= FUNNELED; with MULTIPLE it builds an announced layout's communicators
# while the old layout trains (the switch then does not wait for them)
mpi4py.rc.thread_level = "multiple"
from mpi4py import MPI  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python")
if os.path.isdir(os.path.join(_SRC, "tide")):  # a source checkout; installed: PYTHONPATH
    sys.path.insert(0, _SRC)
import tide  # noqa: E402
import tide.torch as tt  # noqa: E402

CORPUS = "/usr/share/games/fortunes/*"  # Debian: fortunes-min
VOCAB = 256  # bytes


def parse_args(argv: List[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", default="train_gpt")
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", default=CORPUS, help="text files (a glob), read as bytes")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--step-ms", type=int, default=0, help="sleep per step (room for a resize)")
    ap.add_argument("--loss-out", help="append 'step loss' lines (the layout's first rank)")
    ap.add_argument("--state-out", help="save every member's shards of the final state "
                    "(DIR/final.w<rank>.pt)")
    ap.add_argument("--ckpt", help="checkpoint root: a save at the end of step --ckpt-at")
    ap.add_argument("--ckpt-at", type=int, action="append", default=[])
    ap.add_argument("--resume", help="start from the newest checkpoint under this root")
    ap.add_argument("--kill-rank", type=int, default=-1, help="test: this pool rank dies...")
    ap.add_argument("--kill-at", type=int, default=-1, help="...at the start of this step")
    ap.add_argument("--kill-file", help="...or at the start of the first step once this file "
                    "exists")
    ap.add_argument("--time-out", help="append 'step start end' lines: the wall-clock times (s) "
                    "each step began and its train_step ended (the layout's first rank)")
    return ap.parse_args(argv)


# ---- the model -------------------------------------------------------------------------------

class Embed(nn.Module):
    def __init__(self, seq: int, hidden: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, hidden)
        self.pos = nn.Embedding(seq, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.head_dim = hidden // heads
        # no qkv bias: the key's bias adds the same score to every key of a query, which
        # softmax ignores, so its gradient is rounding noise that Adam would amplify into
        # updates of full size (and runs differing only in sum order would drift apart)
        self.qkv = tt.ColumnParallelLinear(hidden, 3 * hidden, bias=False, segments=3)
        self.proj = tt.RowParallelLinear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # this tp rank's heads of each
        hd = self.head_dim
        q, k, v = (z.reshape(B, T, -1, hd).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, -1)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc = tt.ColumnParallelLinear(hidden, 4 * hidden)
        self.out = tt.RowParallelLinear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class GPT(nn.Module):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.embed = Embed(a.seq, a.hidden)
        self.blocks = nn.ModuleList(Block(a.hidden, a.heads) for _ in range(a.layers))
        self.head = Head(a.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # one process, no tide: the reference
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def build(a: argparse.Namespace) -> Tuple[GPT, torch.optim.Optimizer, tt.Plan]:
    """The model (the same on every rank: seeded), AdamW and the parallel plan."""
    torch.manual_seed(a.seed)
    model = GPT(a)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01)
    plan = tt.Plan(pre="embed", blocks="blocks", post="head",
                   act_shape=lambda x: (x.shape[0], x.shape[1], a.hidden))
    return model, opt, plan


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


# ---- the data ----------------------------------------------------------------------------------

def corpus(pattern: str) -> torch.Tensor:
    """Every file of pattern (sorted; fortune's .dat indexes skipped) as one byte tensor."""
    files = sorted(f for f in glob.glob(pattern)
                   if os.path.isfile(f) and not os.path.islink(f) and not f.endswith(".dat"))
    if not files:
        raise SystemExit("train_gpt: no text at %s: install Debian's fortunes-min "
                         "(scripts/install-deps.sh) or pass --corpus" % pattern)
    data = b"".join(open(f, "rb").read() for f in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def batch(a: argparse.Namespace, data: torch.Tensor, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The global batch of step `step`: global_batch windows of seq bytes and the next bytes."""
    g = torch.Generator().manual_seed(a.seed * 1000003 + step)
    start = torch.randint(0, data.numel() - a.seq - 1, (a.global_batch,), generator=g)
    idx = start.unsqueeze(1) + torch.arange(a.seq + 1).unsqueeze(0)
    w = data[idx]
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


# ---- the loop ----------------------------------------------------------------------------------

def main(argv: List[str]) -> int:
    a = parse_args(argv)
    if a.hidden % a.heads:
        raise SystemExit("train_gpt: --heads must divide --hidden")
    if a.device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=a.device == "cuda")
    data = corpus(a.corpus)
    model, opt, plan = build(a)
    n_params = sum(p.numel() for p in model.parameters())
    settings = {"backend": "nccl"} if a.device == "cuda" else {}
    fit = [("dp_micro", a.global_batch, "the global batch"), ("tp", a.heads, "attention heads")]
    with tt.Elastic(model, opt, plan, job=a.job, dp=a.dp, tp=a.tp, pp=a.pp,
                    micro_batches=a.micro_batches, fit=fit, resume=a.resume,
                    comm=MPI.COMM_WORLD, **settings) as el:
        rt = el.rt
        me = rt.pool_rank
        if el.member and el.view.coord == (0, 0, 0):
            print("train_gpt: %d parameters, %d bytes of text, from step %d on %s" % (
                n_params, data.numel(), el.view.step, rt.device), flush=True)
        gen = el.view.generation
        for step in el.steps(a.steps):
            v = el.view
            if v.generation != gen and v.coord == (0, 0, 0):
                L = v.layout
                st = rt.last_reshard or {}
                print("train_gpt: generation %d (dp %d, tp %d, pp %d, micro %d) from step %d; "
                      "switch %.1f ms (wait %.1f, sync %.1f, groups %.1f, move %.1f; in Python: "
                      "reshard %.1f, rebind %.1f)" % (
                          v.generation, L.dp, L.tp, L.pp, L.micro_batches, step,
                          st.get("total_ms", 0), st.get("wait_ms", 0), st.get("sync_ms", 0),
                          st.get("groups_ms", 0), st.get("move_ms", 0),
                          el.last_switch.get("reshard_ms", 0), el.last_switch.get("bind_ms", 0)),
                      flush=True)
            gen = v.generation
            if me == a.kill_rank and (step == a.kill_at or (a.kill_file and
                                                            os.path.exists(a.kill_file))):
                print("train_gpt: rank %d (worker %d) dies at step %d" % (me, rt.worker_id, step),
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            t_start = time.time()
            x, y = batch(a, data, step)
            loss = el.train_step(el.shard(x), el.shard(y), loss_fn, schedule=a.schedule)
            if a.time_out and v.coord == (0, 0, 0):  # what a user sees: step to step
                with open(a.time_out, "a") as f:
                    f.write("%d %.6f %.6f\n" % (step, t_start, time.time()))
            if math.isnan(loss):
                print("train_gpt: rank %d: step %d failed (a peer died); redone" % (me, step),
                      flush=True)
                continue
            if step in a.ckpt_at and a.ckpt:
                el.checkpoint(a.ckpt)
            if v.coord == (0, 0, 0):
                if a.loss_out:
                    with open(a.loss_out, "a") as f:
                        f.write("%d %.17g\n" % (step, loss))
                if step % 10 == 0:
                    print("train_gpt: step %d loss %.4f" % (step, loss), flush=True)
            if a.step_ms:
                time.sleep(a.step_ms / 1000.0)
        if a.state_out and el.member:
            torch.save(el.local_state(), "%s/final.w%d.pt" % (a.state_out, me))
        el.checkpoint_wait()
        print("train_gpt: rank %d done" % me, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
