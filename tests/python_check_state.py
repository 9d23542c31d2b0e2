#!/usr/bin/env python3
"""Checks train_torch --check-dir output: for every switch, the full state gathered from
the old layout's shards right before it is bit-identical to the one gathered from the new
layout's shards right after it. A coordinate whose rank died (no 'before' file) is taken
from a data-parallel replica (same stage and tp rank). Prints one line per switch.
usage: python_check_state.py DIR TRAIN_TORCH_ARGS..."""
import glob
import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import tide  # noqa: E402


def gather(coll, files):
    shards, lay = {}, None
    for f in files:
        d = torch.load(f)
        lay = d["layout"]
        shards[tuple(d["coord"])] = d["state"]
    dp, tp, pp, nl, mb, st = lay
    for p in range(pp):
        for dd in range(dp):
            for t in range(tp):
                if (p, dd, t) not in shards:
                    alt = [shards[(p, e, t)] for e in range(dp) if (p, e, t) in shards]
                    if not alt:
                        raise SystemExit("no replica for coordinate %r" % ((p, dd, t),))
                    shards[(p, dd, t)] = alt[0]
    return coll.assemble(tide.Layout(dp, tp, pp, nl, mb, st), shards), lay


def main():
    d = sys.argv[1]
    sys.argv = [sys.argv[0]] + sys.argv[2:]
    import train_torch
    coll = train_torch.make_collection(train_torch.parse())
    gens = sorted({int(m.group(1)) for f in os.listdir(d) for m in [re.match(r"g(\d+)\.", f)] if m})
    if not gens:
        raise SystemExit("python_check_state: no switch recorded in %s" % d)
    for g in gens:
        before, lb = gather(coll, glob.glob("%s/g%d.before.*.pt" % (d, g)))
        after, la = gather(coll, glob.glob("%s/g%d.after.*.pt" % (d, g)))
        bad = [n for n in coll.names() if not torch.equal(before[n], after[n])]
        if bad:
            raise SystemExit("generation %d: state differs across the switch in %s" % (g, ", ".join(bad[:5])))
        print("python_check_state: generation %d (dp %d, pp %d) -> (dp %d, pp %d): %d tensors, "
              "step %d, bit-identical" % (g, lb[0], lb[2], la[0], la[2], len(coll),
                                          int(after["step"][0])))


if __name__ == "__main__":
    main()
