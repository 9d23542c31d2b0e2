#!/usr/bin/env python3
"""A model tide.torch has never seen, made elastic in a few lines: a stack of
torch.nn.TransformerEncoderLayer trained with AdamW on a synthetic regression (the mean of
each sequence's features, per position). Every line of tide code ends in "# tide"
(test_encoder.py counts them). dp and pp come from tided; the data of step s is a pure
function of s, so any layout trains on the same samples.
    usage: encoder_job.py --job J --dp N --pp N --steps N [--step-ms MS] [--loss-out F]
                          [--state-out DIR]
"""
import argparse
import os
import sys
import time

import mpi4py
import torch
import torch.nn as nn
import torch.nn.functional as F

mpi4py.rc.thread_level = "funneled"  # tide
import tide.torch as tt  # noqa: E402  # tide

D, FEAT, T = 32, 8, 12


class Encoder(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embed = nn.Linear(FEAT, D)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0,
                                                               batch_first=True)
                                    for _ in range(layers))
        self.head = nn.Linear(D, 1)
        for layer in self.layers:  # the key's bias shifts every score of a query alike, which
            # softmax ignores: its gradient is rounding noise (that AdamW would turn into
            # full-size updates, making runs that differ in sum order drift apart); keep it 0
            keep = torch.ones(3 * D)
            keep[D:2 * D] = 0
            layer.self_attn.in_proj_bias.register_hook(lambda g, keep=keep: g * keep)


def batch(step: int, n: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(n, T, FEAT, generator=g)
    return x, x.mean(dim=2, keepdim=True).cumsum(dim=1) / T


def main() -> int:
    ap = argparse.ArgumentParser()
    for flag, kind, default in (("--job", str, "enc"), ("--dp", int, 1), ("--pp", int, 1),
                                ("--steps", int, 20), ("--step-ms", int, 0),
                                ("--loss-out", str, None), ("--state-out", str, None)):
        ap.add_argument(flag, type=kind, default=default)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Encoder(layers=4)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    plan = tt.Plan(pre="embed", blocks="layers", post="head",  # tide
                   act_shape=lambda x: (x.shape[0], T, D))  # tide
    with tt.Elastic(model, opt, plan, job=a.job, dp=a.dp, pp=a.pp,  # tide
                    micro_batches=2) as el:  # tide
        for step in el.steps(a.steps):  # tide
            x, y = batch(step, 8)
            loss = el.train_step(el.shard(x), el.shard(y), F.mse_loss)  # tide
            if a.loss_out and el.view.coord == (0, 0, 0):  # tide
                with open(a.loss_out, "a") as f:
                    f.write("%d %.17g\n" % (step, loss))
                L = el.layout  # tide
                print("encoder: step %d loss %.5f (dp %d, pp %d)" % (step, loss, L.dp, L.pp),
                      flush=True)
            time.sleep(a.step_ms / 1000.0)
        if a.state_out and el.member:  # tide
            torch.save(el.local_state(), os.path.join(a.state_out, "final.%d.pt" % el.rt.pool_rank))  # tide
    return 0


if __name__ == "__main__":
    sys.exit(main())
