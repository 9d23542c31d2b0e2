"""tide.torch.Elastic: a torch.nn.Module and its optimizer made elastic on tide's runtime.

Elastic declares the tensor collection itself (plan.declare), joins the job, and binds the
module and the optimizer to the runtime's tensors: every parameter's .data, every
per-parameter optimizer state tensor and the gradients (views of flat buckets, one
allreduce per bucket over the data-parallel group) are this rank's shards of the current
layout. After join, after every live resize or recovery (rt.reshard) and after loading a
checkpoint it binds them again, so the program keeps using `model` and `optimizer` as
they are. Training runs through steps() (the elastic loop) and train_step() (micro-batches
through the pipeline stages, gradient sync, the update).

Binding rules: a parameter this rank does not hold (another stage's, or every parameter
on an idle rank) is an empty tensor with no gradient (optimizers skip it); optimizer
state of the parameter's shape is the collection's tensor itself; a small state value
(Adam's step) is the collection's tensor where the optimizer keeps it on the runtime's
device in the same dtype, otherwise a copy the update writes back after every step. The
optimizer makes its state at its first step exactly as without tide (SGD's first momentum
is the gradient); a flag in the collection says whether it has.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch

from .. import core
from ..core import Action, Group, Runtime, Status, TideError
from . import pipeline
from .layers import TPContext, _ParallelLinear
from .plan import INIT, Declared, Entry, Plan, declare

BUCKET_BYTES = 16 << 20  # gradient bytes per allreduce
_FAILED = (Status.ERR_ABORTED, Status.ERR_PEER)  # a peer died: the step is redone


def _invalid(msg: str) -> TideError:
    return TideError(Status.ERR_INVALID, msg)


def _collection_of(d: Declared) -> core.Collection:
    coll = core.Collection(d.num_layers)
    for e in d.entries:
        coll.add(e.name, e.shape, e.dtype, layer=e.layer, tp_split=e.tp_split,
                 tp_segments=e.tp_segments)
    return coll


def collection(model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer],
               plan: Optional[Plan] = None,
               extra: Optional[Mapping[str, Any]] = None) -> core.Collection:
    """The tensor collection Elastic declares for these (same names, shapes, rules): what
    tide.Collection.assemble and extract need to gather or split the state outside a job
    (tools, tests, a checkpoint read back)."""
    return _collection_of(declare(model, optimizer, plan if plan is not None else Plan(),
                                  {k: torch.as_tensor(v) for k, v in (extra or {}).items()}))


class Elastic:
    """model and optimizer trained elastically in online job `job` (see the module doc).

    plan: tide.torch.Plan (None: one layer, data parallel only); dp, tp, pp,
    micro_batches: the first layout (any later one comes from tided); extra: named tensors
    of the program's own state kept in the collection on every stage (el.extra[name]);
    resume: a checkpoint directory or root to start from (its step, any layout); fit:
    tide.Runtime.join's rules; rt: an existing tide.Runtime (else one is made over comm
    with `settings`, and closed with the Elastic). A context manager."""

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer],
                 plan: Optional[Plan] = None, *, job: str, dp: int = 1, tp: int = 1,
                 pp: int = 1, micro_batches: int = 1, extra: Optional[Mapping[str, Any]] = None,
                 resume: Optional[str] = None, fit: Optional[Sequence[Tuple[Any, ...]]] = None,
                 rt: Optional[Runtime] = None, comm: Any = None,
                 bucket_bytes: int = BUCKET_BYTES, **settings: Any) -> None:
        if not isinstance(model, torch.nn.Module):
            raise _invalid("model must be a torch.nn.Module, got %s" % type(model).__name__)
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise _invalid("optimizer must be a torch.optim.Optimizer, got %s"
                           % type(optimizer).__name__)
        self.model, self.opt = model, optimizer
        self.plan = plan if plan is not None else Plan()
        if not isinstance(self.plan, Plan):
            raise _invalid("plan must be a tide.torch.Plan, got %s" % type(plan).__name__)
        self._own_rt = rt is None
        self.rt = rt if rt is not None else Runtime(comm, **settings)
        self.bucket_bytes = bucket_bytes
        self._ckpt_root: Optional[str] = None
        self._pending = False   # the step's gradients are summed: FINISH may apply them
        self._failed: Optional[TideError] = None
        self._in_step = False
        #: the last switch in steps(): rt.reshard's and the rebinding's wall time, ms
        self.last_switch: Dict[str, float] = {}
        try:
            self._setup(job, dp, tp, pp, micro_batches, dict(extra or {}), resume, fit)
        except BaseException:
            self.close()
            raise

    # ---- set-up --------------------------------------------------------------------------

    def _setup(self, job: str, dp: int, tp: int, pp: int, micro: int, extra: Dict[str, Any],
               resume: Optional[str], fit: Any) -> None:
        dev = self.rt.device
        self.model.to(dev)  # buffers (masks, running stats); parameters are rebound below
        self.params = dict(self.model.named_parameters())
        self.decl: Declared = declare(self.model, self.opt, self.plan,
                                      {k: torch.as_tensor(v) for k, v in extra.items()})
        self.coll = coll = _collection_of(self.decl)
        self._state_of: Dict[str, List[Entry]] = {}
        for e in self.decl.entries:
            if e.key is not None:
                self._state_of.setdefault(e.param or "", []).append(e)
        # the full initial values, for this rank's first shards (the program built the
        # same model on every rank); dropped once bound
        init = {n: p.detach().to("cpu") for n, p in self.params.items()}
        init.update({k: torch.as_tensor(v).to("cpu") for k, v in extra.items()})
        self.rt.join(job, coll, dp=dp, tp=tp, pp=pp, micro_batches=micro, fit=fit,
                     resume=resume)
        state = self.rt.zeros() if self.rt.view.member else {}
        if state and resume is not None:
            self.rt.load_checkpoint(state)
        elif state:
            v = self.rt.view
            lay = core.Layout.of(v.layout)
            for name, x in state.items():
                if name in init:
                    x.copy_(coll.extract(lay, name, v.coord, init[name].contiguous()))
        del init
        self.rt.set_buffers(state)
        self._bind(state)

    # ---- binding ---------------------------------------------------------------------------

    def _bind(self, state: Dict[str, torch.Tensor]) -> None:
        """Points the module, the optimizer, the parallel layers and the gradient buckets at
        this rank's tensors of the current layout."""
        self.state = state
        v = self.rt.view
        self.view = v
        dev = self.rt.device
        for n, p in self.params.items():
            p.grad = None
            p.data = state[n] if n in state else torch.empty(0, dtype=p.dtype, device=dev)
        tp = TPContext(self.rt, v.layout.tp, v.tp_rank) if v.member else TPContext()
        for m in self.model.modules():
            if isinstance(m, _ParallelLinear):
                m.tp = tp
        self._links: List[Tuple[torch.nn.Parameter, Entry, Any]] = []
        if self.opt is not None:
            initialised = bool(state) and int(state[INIT][0]) == 1
            for n, p in self.params.items():
                self.opt.state.pop(p, None)
                if initialised and n in state:
                    self._link_state(p, n)
        self._make_buckets()

    def _link_state(self, p: torch.nn.Parameter, n: str) -> None:
        """p's optimizer state from the collection (see the module doc's rules)."""
        assert self.opt is not None
        st = self.opt.state[p]
        for e in self._state_of.get(n, []):
            buf = self.state[e.name]
            if e.like_param:
                st[e.key] = buf
                self._links.append((p, e, buf))
            elif e.py_type is not None:
                st[e.key] = e.py_type(buf.item())
                self._links.append((p, e, None))
            elif buf.device == e.state_device:
                st[e.key] = buf.view(e.state_shape)
                self._links.append((p, e, st[e.key]))
            else:  # the optimizer wants it elsewhere (Adam's step on the host): a copy
                st[e.key] = buf.to(e.state_device).view(e.state_shape).clone()
                self._links.append((p, e, None))

    def _after_update(self) -> None:
        """After the optimizer's step: state it made or replaced goes into the collection
        and is linked (first step); copies of small values are written back."""
        if self.opt is None or not self.state:
            return
        if int(self.state[INIT][0]) == 0:
            self._links = []
            for n, p in self.params.items():
                if n in self.state and p in self.opt.state:
                    self._write_back(p, n)
                    self._link_state(p, n)
            self.state[INIT].fill_(1)
            return
        for p, e, obj in self._links:
            st = self.opt.state[p]
            cur = st.get(e.key)
            if obj is None or cur is not obj:
                self._store(e, cur)
                if obj is not None:
                    st[e.key] = obj

    def _write_back(self, p: torch.nn.Parameter, n: str) -> None:
        assert self.opt is not None
        st = self.opt.state[p]
        for e in self._state_of.get(n, []):
            if e.key in st and st[e.key] is not None:
                self._store(e, st[e.key])

    def _store(self, e: Entry, val: Any) -> None:
        buf = self.state[e.name]
        with torch.no_grad():
            if isinstance(val, torch.Tensor):
                buf.copy_(val.reshape(buf.shape))
            else:
                buf.fill_(float(val))

    def _make_buckets(self) -> None:
        """Flat gradient buffers over the held trainable parameters, in reverse order (the
        order backward produces them), at most bucket_bytes each, one dtype each."""
        self.buckets: List[Tuple[torch.Tensor, List[Tuple[torch.nn.Parameter, torch.Tensor]]]] = []
        group: List[torch.nn.Parameter] = []
        size = 0

        def close() -> None:
            if not group:
                return
            flat = torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype,
                               device=self.rt.device)
            views, off = [], 0
            for p in group:
                views.append((p, flat[off:off + p.numel()].view_as(p)))
                off += p.numel()
            self.buckets.append((flat, views))

        for n, p in reversed(list(self.params.items())):
            if n not in self.state or not p.requires_grad:
                continue
            nb = p.numel() * p.element_size()
            if group and (size + nb > self.bucket_bytes or p.dtype != group[0].dtype):
                close()
                group, size = [], 0
            group.append(p)
            size += nb
        close()

    # ---- what the program reads ------------------------------------------------------------

    @property
    def member(self) -> bool:
        return self.view.member

    @property
    def layout(self) -> core.LayoutInfo:
        assert self.view.layout is not None
        return self.view.layout

    @property
    def dp(self) -> int:
        return self.layout.dp if self.member else 1

    @property
    def dp_rank(self) -> int:
        return self.view.dp_rank

    @property
    def extra(self) -> Dict[str, torch.Tensor]:
        """The program's extra tensors, bound (replaced at every resize)."""
        return {n: self.state[n] for n in self.state if self.coll.specs[self.coll.index(n)].layer
                == core.ALL and n != INIT}

    def shard(self, batch: torch.Tensor) -> torch.Tensor:
        """This data-parallel rank's rows of the global batch (dp must divide them)."""
        n = batch.shape[0]
        if n % self.dp:
            raise _invalid("dp %d does not divide the batch's %d rows" % (self.dp, n))
        k = n // self.dp
        return batch[self.dp_rank * k:(self.dp_rank + 1) * k]

    def local_state(self) -> Dict[str, Any]:
        """This rank's shards (host copies), its coordinate and layout: what
        tide.Collection.assemble gathers into the full state (tests, tools)."""
        L = self.layout
        return {"coord": self.view.coord,
                "layout": (L.dp, L.tp, L.pp, L.num_layers, L.micro_batches, L.stage_start),
                "state": {k: x.detach().cpu().clone() for k, x in self.state.items()}}

    # ---- the step -----------------------------------------------------------------------------

    def zero_grad(self) -> None:
        """Zero gradients, as views of the buckets (torch's zero_grad also works: sync_grads
        copies gradients that are not views)."""
        for flat, views in self.buckets:
            flat.zero_()
            for p, g in views:
                p.grad = g

    def sync_grads(self, average: bool = True) -> None:
        """Sums (average: averages) the held parameters' gradients over the data-parallel
        group, one allreduce per bucket. Blocks; TideError when a peer failed."""
        dp = self.dp
        for flat, views in self.buckets:
            for p, g in views:
                cur = p.grad
                if cur is None:
                    g.zero_()
                    p.grad = g
                elif cur.data_ptr() != g.data_ptr():
                    g.copy_(cur)
                    p.grad = g
            if dp > 1:
                self.rt.allreduce(flat, Group.DP)
                if average:
                    flat.div_(dp)

    def optimizer_step(self) -> None:
        """optimizer.step() on the synced gradients, its state kept in the collection."""
        if self.opt is not None and self.member:
            self.opt.step()
            self._after_update()
        self._pending = False

    def train_step(self, inputs: Any, targets: Any, loss_fn: Callable[[Any, Any], torch.Tensor],
                   schedule: str = "1f1b") -> float:
        """One step on this data-parallel rank's batch (el.shard of the global one; pass it on
        every stage, only the first uses inputs and the last targets): micro-batches
        through the pipeline (schedule "1f1b" or "gpipe"), gradients summed over dp, the
        optimizer's update. loss_fn(output, target) is a micro-batch's mean loss; the
        gradients are those of the global batch's mean. Returns that mean loss (every
        rank), or nan when a peer failed (steps() redoes the step)."""
        if schedule not in pipeline.SCHEDULES:
            raise _invalid("schedule must be one of %s, got %r" % (pipeline.SCHEDULES, schedule))
        try:
            return self._train_step(inputs, targets, loss_fn, schedule)
        except TideError as e:
            if e.status not in _FAILED:
                raise
            self._failed = e
            return float("nan")

    def _train_step(self, inputs: Any, targets: Any, loss_fn: Any, schedule: str) -> float:
        v, L = self.view, self.layout
        M = L.micro_batches
        rows = inputs.shape[0]
        if rows % M:
            raise _invalid("micro-batches %d do not divide this rank's %d rows" % (M, rows))
        dev = self.rt.device
        ins = [x.to(dev) for x in torch.chunk(inputs, M)]
        tgs = [y.to(dev) for y in torch.chunk(targets, M)]
        first, last = v.pp_rank == 0, v.pp_rank == L.pp - 1
        blocks = self.decl.blocks
        mine = [blocks[i] for i in L.stage_layers(v.pp_rank)] if blocks is not None else [self.model]
        act = self.plan.act_shape or (lambda x: x.shape)
        st = pipeline.Stage(self.rt, first, last, self.decl.pre if blocks is not None else [],
                            mine, self.decl.post, loss_fn, ins, tgs, 1.0 / (M * L.dp), act,
                            self.plan.act_dtype, dev)
        self.zero_grad()
        if L.pp == 1:
            loss = pipeline.gpipe(st, M)
        elif schedule == "gpipe":
            loss = pipeline.gpipe(st, M)
        else:
            loss = pipeline.one_f_one_b(st, M, v.pp_rank, L.pp)
        self.sync_grads(average=False)
        self._pending = True
        self.rt.step_can_finish()  # the update below needs no peer any more
        # the last collective spans the layout: no rank updates while another can still fail
        lt = torch.tensor([loss if last and v.tp_rank == 0 else 0.0], dtype=torch.float64,
                          device=dev)
        self.rt.allreduce(lt, Group.ALL)
        self.optimizer_step()
        return float(lt[0])

    # ---- the loop ----------------------------------------------------------------------------

    def steps(self, total: int) -> Iterator[int]:
        """The elastic loop: yields the index of each step to run (the view's step), until
        step `total` (then finish) or the job's end. Between yields it switches layouts
        (live resizes, recoveries, rollbacks: the module and optimizer are rebound), ends
        steps (a step whose train_step saw a peer fail is not counted and runs again),
        completes a step the runtime asks to finish, and saves requested checkpoints.
        Idle ranks wait inside it."""
        rt = self.rt
        while True:
            a = rt.step_begin()
            if a is Action.FINISHED:
                return
            if a is Action.RECONFIGURE:
                if self._ckpt_root is not None and self.member:
                    rt.checkpoint(self._ckpt_root)  # the old layout's state at this step
                    self._ckpt_root = None
                t0 = time.perf_counter()
                new = rt.reshard()
                t1 = time.perf_counter()
                self._bind(new)
                self.last_switch = {"reshard_ms": (t1 - t0) * 1e3,
                                    "bind_ms": (time.perf_counter() - t1) * 1e3}
                continue
            self.view = rt.view
            if a is Action.FINISH:
                self.optimizer_step()
                rt.step_end()
                continue
            if self.view.step >= total:
                rt.finish()
                return
            self._failed = None
            self._in_step = True
            try:
                yield self.view.step
            finally:
                self._in_step = False
            rt.step_end(self._failed)
            if self._failed is None and self._ckpt_root is not None:
                if self.member:
                    rt.checkpoint(self._ckpt_root)
                self._ckpt_root = None

    # ---- checkpoints ---------------------------------------------------------------------------

    def checkpoint(self, root: str) -> None:
        """Saves the state (model, optimizer, extra) under root at the end of the current
        step (inside steps(); at once outside it), asynchronously: ROOT/step-N/
        (docs/checkpoints.md). Loadable into any layout: Elastic(..., resume=root)."""
        if not isinstance(root, str) or not root:
            raise _invalid("root must be a non-empty str")
        if self._in_step:
            self._ckpt_root = root
        else:
            self.rt.checkpoint(root)

    def checkpoint_every(self, root: str, every: int, keep: int = 0) -> None:
        """A checkpoint under root at the end of every every-th step, the newest keep kept."""
        self.rt.checkpoint_every(root, every, keep)

    def checkpoint_wait(self) -> None:
        """Waits for the save being written; TideError if it failed."""
        self.rt.checkpoint_wait()

    # ---- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Leaves the pool when the Elastic made the runtime; idempotent."""
        if self._own_rt and getattr(self, "rt", None) is not None:
            self.rt.close()

    def __enter__(self) -> "Elastic":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
