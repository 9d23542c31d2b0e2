"""Tensor-parallel layers (Megatron-style): a column-parallel and a row-parallel linear.

A ColumnParallelLinear's weight (out, in) and bias are split along out over the tp group;
a RowParallelLinear's weight along in (its bias is replicated). Placed one after the other
(attention's qkv then its projection, an MLP's up then down projection) the pair needs one
allreduce forward (after the row layer) and one backward (before the column layer):

    qkv  = ColumnParallelLinear(h, 3 * h, segments=3)   # fused q, k, v: split each part
    proj = RowParallelLinear(h, h)

Both start as plain full-size linears (initialised as torch.nn.Linear, so a model built with
them on one rank is the same model); tide.torch.Elastic declares their split in the tensor
collection and rebinds them to this rank's shard, and from then on they talk to the tp group
of the current layout (`tp_size`, `tp_rank`). Outside Elastic, or at tp 1, they are linears.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F

from ..core import Group


class TPContext:
    """The tp group a bound layer talks to: set by Elastic at every (re)bind."""

    def __init__(self, rt: Any = None, size: int = 1, rank: int = 0) -> None:
        self.rt, self.size, self.rank = rt, size, rank


_SOLO = TPContext()


class _CopyToTP(torch.autograd.Function):
    """Identity forward; the gradient summed over the tp group backward (the input of a
    column-parallel layer is used by every tp rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPContext) -> torch.Tensor:  # type: ignore[override]
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
        g = g.contiguous().clone()
        ctx.tp.rt.allreduce(g, Group.TP)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """The partial outputs of a row-parallel layer summed over the tp group forward;
    identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPContext) -> torch.Tensor:  # type: ignore[override]
        y = x.contiguous().clone()
        tp.rt.allreduce(y, Group.TP)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
        return g, None


class _ParallelLinear(torch.nn.Module):
    tp_dim = 0  # the weight's dimension split over tp

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 segments: int = 1, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        for k, v in (("in_features", in_features), ("out_features", out_features),
                     ("segments", segments)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError("%s must be an int >= 1, got %r" % (k, v))
        self.in_features, self.out_features, self.segments = in_features, out_features, segments
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device,
                                                     dtype=dtype))
        self.bias = (torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
                     if bias else None)
        self.tp: TPContext = _SOLO
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.Linear's initialisation of the full weight."""
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def tp_rules(self) -> dict:
        """{parameter name: (split dim or None, segments)} for the tensor collection."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return "in=%d, out=%d, segments=%d, tp=%d" % (self.in_features, self.out_features,
                                                       self.segments, self.tp.size)


class ColumnParallelLinear(_ParallelLinear):
    """y = x W^T + b with W (out, in) and b split along out: each tp rank computes its
    part of y (out / tp features; with segments s, its chunk of each of the s parts).
    gather_output: all-gather the parts into the full y (else y stays split, as the input
    of a RowParallelLinear wants it)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 segments: int = 1, gather_output: bool = False, **kw: Any) -> None:
        super().__init__(in_features, out_features, bias, segments, **kw)
        if out_features % segments:
            raise ValueError("segments %d must divide out_features %d" % (segments, out_features))
        self.gather_output = gather_output

    def tp_rules(self) -> dict:
        rules = {"weight": (0, self.segments)}
        if self.bias is not None:
            rules["bias"] = (0, self.segments)
        return rules

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tp = self.tp
        if tp.size == 1:
            return F.linear(x, self.weight, self.bias)
        y = F.linear(_CopyToTP.apply(x, tp), self.weight, self.bias)
        if not self.gather_output:
            return y
        parts = _GatherFromTP.apply(y, tp)  # [tp, ..., out / tp]
        s = self.segments  # back to [seg 0 of rank 0, seg 0 of rank 1, ..., seg 1 of rank 0...]
        parts = parts.unflatten(-1, (s, parts.shape[-1] // s))
        return torch.movedim(parts, 0, -2).flatten(-3)


class _GatherFromTP(torch.autograd.Function):
    """[tp, *x.shape] of every tp rank's x forward; each rank's slice of the gradient
    backward (the gathered output is used whole by every rank)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPContext) -> torch.Tensor:  # type: ignore[override]
        ctx.tp = tp
        return tp.rt.allgather(x.contiguous(), Group.TP)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:  # type: ignore[override]
        return g[ctx.tp.rank].contiguous(), None


class RowParallelLinear(_ParallelLinear):
    """y = x W^T + b with W (out, in) split along in: the input arrives split (a
    ColumnParallelLinear's output), each tp rank computes a partial y, and the partials are
    summed over the tp group; b is replicated and added once after the sum."""

    tp_dim = 1

    def tp_rules(self) -> dict:
        rules = {"weight": (1, self.segments)}
        if self.bias is not None:
            rules["bias"] = (None, 1)
        return rules

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tp = self.tp
        if tp.size == 1:
            return F.linear(x, self.weight, self.bias)
        y = _ReduceFromTP.apply(F.linear(x, self.weight), tp)
        return y if self.bias is None else y + self.bias


def local_features(n: int, tp: Optional[TPContext]) -> int:
    """n / tp: the features of a split dimension this rank holds (e.g. attention heads)."""
    size = 1 if tp is None else tp.size
    if n % size:
        raise ValueError("tp %d does not divide %d" % (size, n))
    return n // size
