"""Pipeline schedules over rt.pp_exchange: GPipe and 1F1B (Megatron's non-interleaved one).

A Stage knows what this rank runs of the model (the plan's pre modules on the first stage,
its blocks, the post modules and the loss on the last stage) and how to talk to its
neighbours. A schedule runs every micro-batch's forward and backward through it and
returns this stage's loss sum (0 on other stages). Every exchange sends and receives
together (one pp_exchange), so neighbouring stages never wait on each other in a cycle;
the waits count as pipeline bubbles (offline work may fill them).
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import torch


class Stage:
    """One rank's part of a pipeline step (built by Elastic.train_step)."""

    def __init__(self, rt: Any, first: bool, last: bool, pre: Sequence[torch.nn.Module],
                 blocks: Sequence[torch.nn.Module], post: Sequence[torch.nn.Module],
                 loss_fn: Callable[[Any, Any], torch.Tensor], inputs: List[Any],
                 targets: List[Any], scale: float, act_shape: Callable[[Any], Sequence[int]],
                 act_dtype: Any, device: Any) -> None:
        self.rt, self.first, self.last = rt, first, last
        self.pre, self.blocks, self.post, self.loss_fn = pre, blocks, post, loss_fn
        self.inputs, self.targets, self.scale = inputs, targets, scale
        self.act_shape, self.act_dtype, self.device = act_shape, act_dtype, device
        self.loss = 0.0

    def empty_act(self, m: int) -> torch.Tensor:
        return torch.empty(tuple(self.act_shape(self.inputs[m])), dtype=self.act_dtype,
                           device=self.device)

    def recv_input(self, m: int) -> Optional[torch.Tensor]:
        """The activation of micro-batch m from the previous stage (None on the first)."""
        if self.first:
            return None
        h = self.empty_act(m)
        self.rt.pp_exchange(recv=h, recv_from=-1)
        return h

    def forward(self, m: int, h_in: Optional[torch.Tensor]) -> Any:
        """Micro-batch m through this stage: (input that needs a gradient, output or loss)."""
        if self.first:
            h = self.inputs[m]
            for mod in self.pre:
                h = mod(h)
        else:
            assert h_in is not None
            h = h_in.requires_grad_(True)
        for b in self.blocks:
            h = b(h)
        if not self.last:
            return h
        for mod in self.post:
            h = mod(h)
        loss = self.loss_fn(h, self.targets[m]) * self.scale
        self.loss += float(loss.detach())
        return loss

    def backward(self, out: Any, grad: Optional[torch.Tensor]) -> None:
        if self.last:
            out.backward()
        else:
            out.backward(grad)

    def exchange(self, send: Optional[torch.Tensor], send_to: int,
                 recv: Optional[torch.Tensor], recv_from: int) -> None:
        if send is None and recv is None:
            return
        self.rt.pp_exchange(send=send, send_to=send_to, recv=recv, recv_from=recv_from)


def _in_grad(h_in: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if h_in is None:
        return None
    g = h_in.grad
    return torch.zeros_like(h_in) if g is None else g.contiguous()


def gpipe(st: Stage, n_micro: int) -> float:
    """Every micro-batch forward, then every one backward (in reverse)."""
    saved = []
    for m in range(n_micro):
        h_in = st.recv_input(m)
        out = st.forward(m, h_in)
        if not st.last:
            st.exchange(out.detach().contiguous(), +1, None, 0)
        saved.append((h_in, out))
    for h_in, out in reversed(saved):
        g = None
        if not st.last:
            g = torch.empty_like(out)
            st.exchange(None, 0, g, +1)
        st.backward(out, g)
        if not st.first:
            st.exchange(_in_grad(h_in), -1, None, 0)
    return st.loss


def one_f_one_b(st: Stage, n_micro: int, pp_rank: int, pp: int) -> float:
    """1F1B: pp - 1 - pp_rank warm-up forwards, then one forward and one backward in turn,
    then the remaining backwards; at most pp - pp_rank micro-batches' activations alive."""
    warm = min(pp - 1 - pp_rank, n_micro)
    saved: List[Any] = []
    for m in range(warm):
        h_in = st.recv_input(m)
        out = st.forward(m, h_in)
        if not st.last:
            st.exchange(out.detach().contiguous(), +1, None, 0)
        saved.append((h_in, out))
    steady = n_micro - warm
    h_next = st.recv_input(warm) if steady > 0 else None
    for i in range(steady):
        m = warm + i
        h_in = h_next
        out = st.forward(m, h_in)
        saved.append((h_in, out))
        g = None
        if not st.last:  # send this forward's output, receive the oldest one's gradient
            g = torch.empty_like(saved[0][1])
            st.exchange(out.detach().contiguous(), +1, g, +1)
        b_in, b_out = saved.pop(0)
        st.backward(b_out, g)
        h_next = None
        if i < steady - 1 and not st.first:  # send its input's gradient, receive the next input
            h_next = st.empty_act(m + 1)
            st.exchange(_in_grad(b_in), -1, h_next, -1)
        elif not st.first:
            st.exchange(_in_grad(b_in), -1, None, 0)
    while saved:
        b_in, b_out = saved.pop(0)
        g = None
        if not st.last:
            g = torch.empty_like(b_out)
            st.exchange(None, 0, g, +1)
        st.backward(b_out, g)
        if not st.first:
            st.exchange(_in_grad(b_in), -1, None, 0)
    return st.loss


SCHEDULES = ("1f1b", "gpipe")
