"""tide.torch without a job: the collection a plan declares for a module and its optimizer
(the optimizer's state learned by probing a copy), the plan's refusals, and the parallel
layers' arithmetic against torch.nn.Linear with the tp group played by a stub that sums or
gathers what every simulated rank computed. One process; no tided, no MPI."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tide  # noqa: E402
import tide.torch as tt  # noqa: E402
from tide.torch import plan as P  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(tt.ColumnParallelLinear(8, 16), torch.nn.GELU(),
                                tt.RowParallelLinear(16, 8)) for _ in range(3))
        self.head = torch.nn.Linear(8, 2)


PLAN = tt.Plan(pre="embed", blocks="blocks", post="head")


def entries(opt_factory):
    torch.manual_seed(0)
    m = Net()
    opt = opt_factory(m.parameters())
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    d = P.declare(m, opt, PLAN, {"cursor": torch.zeros(1, dtype=torch.int64)})
    for n, p in m.named_parameters():  # the probe touched neither the model...
        assert torch.equal(p.detach(), before[n]) and p.grad is None
    assert len(opt.state) == 0  # ...nor the optimizer
    return m, {e.name: e for e in d.entries}, d


@pytest.mark.parametrize("make,keys,small", [
    (lambda ps: torch.optim.Adam(ps, lr=1e-3), ["exp_avg", "exp_avg_sq"], ["step"]),
    (lambda ps: torch.optim.AdamW(ps, lr=1e-3, amsgrad=True),
     ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"], ["step"]),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), ["momentum_buffer"], []),
    (lambda ps: torch.optim.SGD(ps, lr=0.1), [], []),
])
def test_declare_optimizer_state(make, keys, small):
    m, e, d = entries(make)
    assert d.num_layers == 3
    w = "blocks.1.0.weight"  # a column-parallel weight: split along dim 0
    assert e[w].layer == 1 and e[w].tp_split == 0 and e[w].shape == (16, 8)
    assert e["blocks.1.2.weight"].tp_split == 1 and e["blocks.1.2.bias"].tp_split is None
    assert e["embed.weight"].layer == tide.PRE and e["head.bias"].layer == tide.POST
    assert e["cursor"].layer == tide.ALL and e[P.INIT].layer == tide.ALL
    for k in keys:  # state of the parameter's shape: split like the parameter
        s = e[w + P.SEP + k]
        assert s.like_param and s.shape == (16, 8) and s.tp_split == 0 and s.layer == 1
    for k in small:  # Adam's step: a small replicated tensor the optimizer keeps on the host
        s = e[w + P.SEP + k]
        assert not s.like_param and s.tp_split is None and s.state_device == torch.device("cpu")
    n_params = len(list(m.parameters()))
    assert len(e) == 2 + n_params * (1 + len(keys) + len(small))


def test_plan_refusals():
    m = Net()
    with pytest.raises(tide.TideError, match="outside the plan"):
        P.declare(m, None, tt.Plan(blocks="blocks", post="head"), {})
    with pytest.raises(tide.TideError, match="no module 'nope'"):
        P.declare(m, None, tt.Plan(blocks="nope"), {})
    with pytest.raises(tide.TideError, match="nn.ModuleList"):
        P.declare(m, None, tt.Plan(blocks="head", pre="embed"), {})
    with pytest.raises(tide.TideError, match="not a parameter of the model"):
        P.declare(m, torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=1), PLAN, {})
    with pytest.raises(tide.TideError, match="1..4 dims"):
        P.declare(m, None, PLAN, {"scalar": torch.tensor(3)})
    with pytest.raises(tide.TideError, match="patterns to ints"):
        tt.Plan(tp={"x": "0"})


class StubRT:
    """The tp collectives over every simulated rank's tensor at once."""

    def __init__(self) -> None:
        self.parts = []

    def allreduce(self, x, group):
        x.copy_(sum(self.parts))
        return x

    def allgather(self, x, group):
        return torch.stack(self.parts)


def shard(full, dim, seg, tp, t):
    """Rank t's shard of full, split along dim in seg segments (tide's geometry)."""
    coll = tide.Collection(1)
    coll.add("x", tuple(full.shape), full.dtype, layer=0, tp_split=dim, tp_segments=seg)
    return coll.extract(tide.Layout(1, tp, 1, 1), "x", (0, 0, t), full.contiguous())


@pytest.mark.parametrize("seg", [1, 3])
def test_column_parallel_gathers_in_segment_order(seg):
    torch.manual_seed(1)
    full = tt.ColumnParallelLinear(6, 12, segments=seg, gather_output=True)
    x = torch.randn(5, 6)
    want = torch.nn.functional.linear(x, full.weight, full.bias)
    tp, rt = 2, StubRT()
    ranks = []
    for t in range(tp):
        layer = tt.ColumnParallelLinear(6, 12, segments=seg, gather_output=True)
        layer.weight.data = shard(full.weight.detach(), 0, seg, tp, t)
        layer.bias.data = shard(full.bias.detach(), 0, seg, tp, t)
        layer.tp = tt.TPContext(rt, tp, t)
        ranks.append(layer)
    rt.parts = [torch.nn.functional.linear(x, r.weight, r.bias) for r in ranks]
    for r in ranks:
        assert torch.allclose(r(x), want, atol=1e-6)


def test_row_parallel_sums_partials_and_adds_bias_once():
    torch.manual_seed(2)
    full = tt.RowParallelLinear(8, 3)
    x = torch.randn(4, 8)
    want = torch.nn.functional.linear(x, full.weight, full.bias)
    tp, rt = 2, StubRT()
    ranks = []
    for t in range(tp):
        layer = tt.RowParallelLinear(8, 3)
        layer.weight.data = shard(full.weight.detach(), 1, 1, tp, t)
        layer.bias.data = full.bias.detach().clone()
        layer.tp = tt.TPContext(rt, tp, t)
        ranks.append(layer)
    xs = x.chunk(tp, dim=-1)
    rt.parts = [torch.nn.functional.linear(xs[t], ranks[t].weight) for t in range(tp)]
    for t in range(tp):
        assert torch.allclose(ranks[t](xs[t]), want, atol=1e-6)


def test_tp1_layers_are_linears():
    torch.manual_seed(3)
    c, r = tt.ColumnParallelLinear(5, 7), tt.RowParallelLinear(7, 5)
    lin = torch.nn.Linear(5, 7)
    lin.weight.data, lin.bias.data = c.weight.detach().clone(), c.bias.detach().clone()
    x = torch.randn(2, 5)
    assert torch.equal(c(x), lin(x))
    assert r(c(x)).shape == (2, 5)
    with pytest.raises(ValueError, match="segments 3 must divide"):
        tt.ColumnParallelLinear(4, 8, segments=3)
