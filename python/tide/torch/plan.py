"""The parallel plan and the tensor collection it declares for a module and its optimizer.

A Plan names the model's pipeline pieces (modules run before the blocks, the blocks, the
modules after them) and any tensor-parallel split the parallel layers do not declare
themselves. declare() turns a module, an optimizer and a plan into tide.Collection entries:
every parameter (layer: PRE, its block's index, POST), every per-parameter optimizer state
tensor of the parameter's shape (split like the parameter), every other optimizer state
value of a parameter (Adam's step: a small replicated tensor) and the program's extra
tensors (replicated on every stage). The optimizer's state keys are learned by running its
step once on zero-gradient copies of the parameters, so any torch.optim optimizer whose
per-parameter state tensors have the parameter's shape is covered.
"""
from __future__ import annotations

import copy
import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from .. import core
from ..core import TideError, Status
from .layers import _ParallelLinear

SEP = "@"  # parameter name + SEP + optimizer state key: the state tensor's collection name
INIT = "tide.optimizer_initialised"  # 1 once the optimizer made its state (first step)

Modules = Union[str, Sequence[str], None]


def _invalid(msg: str) -> TideError:
    return TideError(Status.ERR_INVALID, msg)


class Plan:
    """How a model is laid out over pipeline stages and tensor-parallel ranks.

    pre, post: the attribute path(s) (e.g. "embed", ["norm", "head"]) of the modules run
    before and after the blocks, in order; blocks: the path of the nn.ModuleList (or
    nn.Sequential) of the repeated blocks, which the pipeline splits into stages (a layout's
    stage_start); without blocks the model is one layer and pp must be 1. tp: extra splits
    {parameter name pattern (fnmatch): dim} for parameters outside the parallel layers
    (ColumnParallelLinear and RowParallelLinear declare theirs); tp_segments: {pattern: s}
    for fused dimensions. act_shape(micro_inputs) -> the shape of the activation passed
    between stages for a micro-batch (default: the micro-batch's own shape); act_dtype its
    dtype. Every parameter must lie under pre, blocks or post when blocks is given."""

    def __init__(self, blocks: Optional[str] = None, pre: Modules = None, post: Modules = None,
                 tp: Optional[Mapping[str, int]] = None,
                 tp_segments: Optional[Mapping[str, int]] = None,
                 act_shape: Optional[Callable[[torch.Tensor], Sequence[int]]] = None,
                 act_dtype: Any = torch.float32) -> None:
        self.blocks = blocks
        self.pre = _paths(pre, "pre")
        self.post = _paths(post, "post")
        self.tp = dict(tp or {})
        self.tp_segments = dict(tp_segments or {})
        for k, v in list(self.tp.items()) + list(self.tp_segments.items()):
            if not isinstance(k, str) or not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise _invalid("plan tp/tp_segments must map name patterns to ints >= 0, got %r: %r"
                               % (k, v))
        if blocks is not None and not isinstance(blocks, str):
            raise _invalid("plan blocks must be a module path (str), got %r" % (blocks,))
        self.act_shape = act_shape
        self.act_dtype = act_dtype


def _paths(x: Modules, what: str) -> List[str]:
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    if not all(isinstance(p, str) for p in x):
        raise _invalid("plan %s must be module paths (str), got %r" % (what, x))
    return list(x)


def submodule(model: torch.nn.Module, path: str) -> torch.nn.Module:
    """model's module at dotted path, with a clear error."""
    m: Any = model
    for part in path.split("."):
        if not hasattr(m, part):
            raise _invalid("the model has no module %r (plan path %r)" % (part, path))
        m = getattr(m, part)
    if not isinstance(m, torch.nn.Module):
        raise _invalid("plan path %r is a %s, not a torch.nn.Module" % (path, type(m).__name__))
    return m


@dataclass
class Entry:
    """One collection tensor: a parameter, an optimizer state value of one, or an extra."""
    name: str
    shape: Tuple[int, ...]
    dtype: Any
    layer: int
    tp_split: Optional[int]
    tp_segments: int
    param: Optional[str] = None  # the parameter this belongs to
    key: Optional[str] = None    # optimizer state key (None: the parameter itself)
    like_param: bool = False     # optimizer state of the parameter's shape: split like it
    py_type: Any = None          # a Python number in the optimizer state (int, float)
    state_shape: Tuple[int, ...] = ()  # the optimizer's own shape of a small state value
    state_device: Any = None     # where the optimizer keeps a small state value


@dataclass
class Declared:
    """What declare() found: the collection's entries, and the model's pieces."""
    entries: List[Entry] = field(default_factory=list)
    num_layers: int = 1
    layer_of: Dict[str, int] = field(default_factory=dict)  # parameter name -> layer
    blocks: Optional[torch.nn.Module] = None
    pre: List[torch.nn.Module] = field(default_factory=list)
    post: List[torch.nn.Module] = field(default_factory=list)


def _layers(model: torch.nn.Module, plan: Plan, d: Declared) -> None:
    names = dict((id(p), n) for n, p in model.named_parameters())
    if plan.blocks is None:
        for n in names.values():
            d.layer_of[n] = 0
        d.num_layers = 1
        if plan.pre or plan.post:
            raise _invalid("plan pre/post need blocks (the pipeline runs pre, blocks, post)")
        return
    d.blocks = submodule(model, plan.blocks)
    if not isinstance(d.blocks, (torch.nn.ModuleList, torch.nn.Sequential)) or len(d.blocks) == 0:
        raise _invalid("plan blocks %r must be a non-empty nn.ModuleList or nn.Sequential"
                       % plan.blocks)
    d.num_layers = len(d.blocks)
    owners = [(m, core.PRE) for m in (submodule(model, p) for p in plan.pre)]
    owners += [(b, i) for i, b in enumerate(d.blocks)]
    owners += [(m, core.POST) for m in (submodule(model, p) for p in plan.post)]
    d.pre = [submodule(model, p) for p in plan.pre]
    d.post = [submodule(model, p) for p in plan.post]
    for m, layer in owners:
        for p in m.parameters():
            n = names[id(p)]
            if n in d.layer_of and d.layer_of[n] != layer:
                raise _invalid("parameter %r is shared by two pipeline pieces (tied weights are "
                               "not supported across stages)" % n)
            d.layer_of[n] = layer
    missing = [n for n in names.values() if n not in d.layer_of]
    if missing:
        raise _invalid("parameters outside the plan's pre, blocks and post: %s"
                       % ", ".join(missing[:5]))


def _tp_rules(model: torch.nn.Module, plan: Plan) -> Dict[str, Tuple[Optional[int], int]]:
    rules: Dict[str, Tuple[Optional[int], int]] = {}
    for mname, m in model.named_modules():
        if isinstance(m, _ParallelLinear):
            for pname, r in m.tp_rules().items():
                rules[(mname + "." if mname else "") + pname] = r
    for n, p in model.named_parameters():
        for pat, dim in plan.tp.items():
            if fnmatch.fnmatchcase(n, pat):
                if dim >= p.dim():
                    raise _invalid("plan tp splits %r along dim %d; it has %d" % (n, dim, p.dim()))
                seg = next((s for q, s in plan.tp_segments.items() if fnmatch.fnmatchcase(n, q)), 1)
                rules[n] = (dim, seg)
    return rules


def probe_state(opt: torch.optim.Optimizer) -> Dict[int, Dict[str, Any]]:
    """{id(param): {key: example value}}: the per-parameter state opt keeps, learned by one
    step of a copy of opt over zero-gradient copies of its parameters (the real ones and the
    real optimizer are untouched)."""
    clones: Dict[int, torch.nn.Parameter] = {}
    groups = []
    for g in opt.param_groups:
        ps = []
        for p in g["params"]:
            c = torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
            c.grad = torch.zeros_like(c)
            clones[id(p)] = c
            ps.append(c)
        groups.append(dict(g, params=ps))
    try:
        twin = type(opt)(groups, **_ctor_defaults(opt))
    except TypeError:
        twin = copy.copy(opt)
        twin.__init__(groups)  # type: ignore[misc]
    twin.step()
    out = {}
    for pid, c in clones.items():
        out[pid] = dict(twin.state.get(c, {}))
    return out


def _ctor_defaults(opt: torch.optim.Optimizer) -> Dict[str, Any]:
    """opt.defaults limited to what its constructor takes (groups carry the rest)."""
    import inspect
    try:
        params = inspect.signature(type(opt).__init__).parameters
    except (TypeError, ValueError):
        return {}
    return {k: v for k, v in opt.defaults.items() if k in params}


def declare(model: torch.nn.Module, opt: Optional[torch.optim.Optimizer], plan: Plan,
            extra: Mapping[str, torch.Tensor]) -> Declared:
    """The collection entries of model, opt and extra under plan (see the module doc)."""
    d = Declared()
    _layers(model, plan, d)
    rules = _tp_rules(model, plan)
    params = list(model.named_parameters())
    d.entries.append(Entry(INIT, (1,), torch.int64, core.ALL, None, 1))
    for n, p in params:
        split, seg = rules.get(n, (None, 1))
        d.entries.append(Entry(n, tuple(p.shape), p.dtype, d.layer_of[n], split, seg, param=n))
    if opt is not None:
        owned = {id(p) for _, p in params}
        for g in opt.param_groups:
            for p in g["params"]:
                if id(p) not in owned:
                    raise _invalid("the optimizer steps a tensor that is not a parameter of the "
                                   "model")
        state = probe_state(opt)
        for n, p in params:
            for key, val in sorted(state.get(id(p), {}).items()):
                if val is None:  # SGD without momentum keeps momentum_buffer None: nothing
                    continue
                d.entries.append(_state_entry(n, p, key, val, d.layer_of[n], rules))
    for n, x in extra.items():
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            raise _invalid("extra state %r must be a tensor of 1..4 dims" % (n,))
        d.entries.append(Entry(n, tuple(x.shape), x.dtype, core.ALL, None, 1))
    return d


def _state_entry(n: str, p: torch.Tensor, key: str, val: Any, layer: int,
                 rules: Dict[str, Tuple[Optional[int], int]]) -> Entry:
    name = n + SEP + str(key)
    if isinstance(val, torch.Tensor):
        if tuple(val.shape) == tuple(p.shape) and val.dim() > 0:
            split, seg = rules.get(n, (None, 1))
            return Entry(name, tuple(p.shape), val.dtype, layer, split, seg, param=n, key=key,
                         like_param=True)
        shape = (max(val.numel(), 1),)
        return Entry(name, shape, val.dtype, layer, None, 1, param=n, key=key,
                     state_shape=tuple(val.shape), state_device=val.device)
    if isinstance(val, (bool, int, float)):
        return Entry(name, (1,), torch.float64, layer, None, 1, param=n, key=key,
                     py_type=type(val))
    raise _invalid("optimizer state %r of %r is a %s: only tensors and numbers can be made "
                   "elastic" % (key, n, type(val).__name__))
