#!/usr/bin/env python3
"""Checks the state files of examples/train_torch.py (--check-dir, --state-out).

  --switches DIR      for every switch recorded in DIR (g<gen>.before/after.w*.pt), the full
                      state gathered from the old layout's shards right before it must be
                      bit-identical to the one gathered from the new layout's right after it;
  --compare A B       the full states gathered from the shard files A and B (globs) must be
                      equal: integer tensors (step, data cursor) exactly, float tensors
                      bit-identical with --rtol 0 (the default), else within a relative L2
                      difference ||a - b|| / ||b|| of --rtol (the C tests' measure);
                      repeatable, with --label and --rtol per comparison, in order.
A coordinate whose rank died (no file) is taken from a data-parallel replica (same stage
and tp rank). Prints one line per switch and per comparison; exit 1 at the first mismatch.
    usage: python_check_state.py [--switches DIR] [--compare A B [--rtol X] [--label L]]...
                                 -- TRAIN_TORCH_MODEL_ARGS...
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import re
import sys
from typing import Dict, List, Tuple

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import tide  # noqa: E402


def gather(coll: tide.Collection, files: List[str]) -> Tuple[Dict[str, torch.Tensor], tuple]:
    """The full state from every coordinate's shard file of one layout, and that layout."""
    if not files:
        raise SystemExit("python_check_state: no shard files")
    shards, lay = {}, None
    for f in files:
        d = torch.load(f)
        if lay is not None and tuple(d["layout"]) != tuple(lay):
            raise SystemExit("python_check_state: %s is of layout %r, not %r" % (f, d["layout"], lay))
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


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (||a - b|| where b is all zero)."""
    a, b = a.double(), b.double()
    den = float(b.norm())
    num = float((a - b).norm())
    return num / den if den > 0 else num


def compare(coll: tide.Collection, a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor],
            rtol: float, label: str) -> None:
    same, worst, worst_name = 0, 0.0, ""
    for n in coll.names():
        x, y = a[n], b[n]
        if torch.equal(x, y):
            same += 1
            continue
        if not x.is_floating_point() or rtol == 0:
            raise SystemExit("python_check_state: %s: %s differs (%s)" % (
                label, n, "integers must be equal" if not x.is_floating_point() else "bit-identical wanted"))
        r = rel_l2(x, y)
        if not math.isfinite(r) or r > rtol:
            raise SystemExit("python_check_state: %s: %s differs by a relative L2 of %.3g (limit %g)"
                             % (label, n, r, rtol))
        if r > worst:
            worst, worst_name = r, n
    print("python_check_state: %s: %d tensors, %d bit-identical%s" % (
        label, len(coll), same,
        "" if same == len(coll) else "; worst relative L2 %.3g in %s (limit %g)" % (worst, worst_name, rtol)))


def main() -> None:
    argv = sys.argv[1:]
    if "--" not in argv:
        raise SystemExit(__doc__)
    cut = argv.index("--")
    ours, model = argv[:cut], argv[cut + 1:]
    import train_torch
    coll = train_torch.make_collection(train_torch.parse_args_for(model))
    i = 0
    did = 0
    while i < len(ours):
        arg = ours[i]
        if arg == "--switches":
            d = ours[i + 1]
            i += 2
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
                did += 1
        elif arg == "--compare":
            ap = argparse.ArgumentParser(prog="--compare")
            ap.add_argument("a")
            ap.add_argument("b")
            ap.add_argument("--rtol", type=float, default=0.0)
            ap.add_argument("--label", default="")
            j = i + 3
            while j < len(ours) and ours[j] in ("--rtol", "--label"):
                j += 2
            c = ap.parse_args(ours[i + 1:j])
            i = j
            a, la = gather(coll, sorted(glob.glob(c.a)))
            b, lb = gather(coll, sorted(glob.glob(c.b)))
            compare(coll, a, b, c.rtol, "%s, (dp %d, pp %d) vs (dp %d, pp %d) at step %d" % (
                c.label or "state", la[0], la[2], lb[0], lb[2], int(b["step"][0])))
            did += 1
        else:
            raise SystemExit("python_check_state: unknown argument %r\n%s" % (arg, __doc__))
    if not did:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
