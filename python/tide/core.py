"""The binding proper: Runtime, Collection, Layout, views, collectives; see tide.h."""
from __future__ import annotations

import ctypes
import enum
import threading
from ctypes import byref, c_int, c_void_p
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import _lib as L

try:
    import torch
except ImportError:  # the package imports without torch; tensor calls then fail clearly
    torch = None  # type: ignore

PRE, POST, ALL = -1, -2, -3  # owning layer of a tensor besides a layer index


class Status(enum.IntEnum):
    """tide_status (include/tide/status.h)."""
    OK = 0
    ERR_INVALID = -1
    ERR_NOMEM = -2
    ERR_IO = -3
    ERR_PROTOCOL = -4
    ERR_TIMEOUT = -5
    ERR_ABORTED = -6
    ERR_PEER = -7
    ERR_NOT_FOUND = -8
    ERR_EXISTS = -9
    ERR_STALE = -10
    ERR_DENIED = -11
    ERR_UNSUPPORTED = -12
    ERR_NO_HOLDER = -13
    ERR_BUSY = -14
    ERR_RANGE = -15
    ERR_NO_DEVICE = -16
    ERR_CLOSED = -17
    ERR_BACKEND = -18
    ERR_INTERNAL = -19


class TideError(Exception):
    """A failed tide call: .status (Status), .message (tide_strerror), .detail."""

    def __init__(self, status: int, detail: str = "", what: str = "") -> None:
        try:
            self.status: Union[Status, int] = Status(status)
        except ValueError:
            self.status = status
        try:
            self.message = L.lib().tide_strerror(int(status)).decode()
        except OSError:
            self.message = getattr(self.status, "name", str(status))
        self.detail = detail
        text = "%s%s (%s)" % (what + ": " if what else "", self.message,
                              getattr(self.status, "name", status))
        super().__init__(text + (": " + detail if detail else ""))


def _invalid(msg: str) -> TideError:
    return TideError(Status.ERR_INVALID, msg)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        detail = L.lib().tide_last_error() or b""
        raise TideError(rc, detail.decode(errors="replace"), what)


class Action(enum.Enum):
    """What Runtime.step_begin asks the program to do (tide_step_action)."""
    RUN = 0          # run step view.step, then step_end
    RECONFIGURE = 1  # switch now: reshard
    FINISHED = 2     # the job ended: stop
    FINISH = 3       # complete the failed step alone (apply the update computed), step_end


class Group(enum.Enum):
    """The communicators of the current layout."""
    ALL = "all"
    TP = "tp"
    DP = "dp"
    PP = "pp"


class ReduceOp(enum.Enum):
    SUM = 0
    MAX = 1


_DTYPES: Dict[Any, int] = {}
_DTYPE_OF: Dict[int, Any] = {}
if torch is not None:
    _DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3,
               torch.int32: 4, torch.int64: 5, torch.uint8: 6}
    _DTYPE_OF = {v: k for k, v in _DTYPES.items()}


def _need_torch() -> None:
    if torch is None:
        raise TideError(Status.ERR_UNSUPPORTED, "PyTorch is not installed")


_DEGREES = {"dp": 0, "tp": 1, "pp": 2, "dp_micro": 3}  # tide_degree


def _fit_rules(fit: Optional[Sequence[Tuple[Any, ...]]]) -> Tuple[Any, int]:
    """The ctypes array of tide_fit_rule for join's fit argument (None when empty) and its
    length, checked."""
    if fit is None:
        fit = ()
    if isinstance(fit, (str, bytes)) or not hasattr(fit, "__len__"):
        raise _invalid("fit must be a sequence of (degree, n[, what]) tuples, got %r" % (fit,))
    if len(fit) > L.FIT_RULES_MAX:
        raise _invalid("fit has %d rules; at most %d" % (len(fit), L.FIT_RULES_MAX))
    arr = (L.FitRule * max(len(fit), 1))()
    for i, rule in enumerate(fit):
        if not isinstance(rule, tuple) or len(rule) not in (2, 3):
            raise _invalid("fit[%d] must be a (degree, n[, what]) tuple, got %r" % (i, rule))
        degree, n = rule[0], rule[1]
        what = rule[2] if len(rule) == 3 else ""
        if degree not in _DEGREES:
            raise _invalid("fit[%d]: degree must be \"dp\", \"tp\", \"pp\" or \"dp_micro\", got %r"
                           % (i, degree))
        if not _is_int(n) or not 1 <= n <= 1 << 62:
            raise _invalid("fit[%d]: n must be an int in 1..2^62, got %r" % (i, n))
        if (not isinstance(what, str) or len(what) >= L.FIT_WHAT_MAX
                or any(not " " <= ch <= "~" for ch in what)):
            raise _invalid("fit[%d]: what must be a str of 0..%d printable ASCII chars, got %r"
                           % (i, L.FIT_WHAT_MAX - 1, what))
        arr[i] = L.FitRule(_DEGREES[degree], n, what.encode())
    return (arr if len(fit) else None), len(fit)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a Collection, as declared."""
    name: str
    shape: Tuple[int, ...]
    dtype: Any
    layer: int
    tp_split: Optional[int]  # dimension split over tp, None: replicated
    tp_segments: int
    dp_sharded: bool


class Collection:
    """A job's state as named tensors (tide_collection_t): frozen once a Runtime joins."""

    def __init__(self, num_layers: int) -> None:
        if not _is_int(num_layers) or num_layers < 1 or num_layers > 1 << 20:
            raise _invalid("num_layers must be an int in 1..2^20, got %r" % (num_layers,))
        self._ptr = c_void_p()
        _check(L.lib().tide_collection_new(byref(self._ptr), num_layers), "tide_collection_new")
        self.num_layers = num_layers
        self.specs: List[TensorSpec] = []
        self._index: Dict[str, int] = {}
        self.frozen = False

    def add(self, name: str, shape: Sequence[int], dtype: Any = None, *, layer: int = ALL,
            tp_split: Optional[int] = None, tp_segments: int = 1,
            dp_sharded: bool = False) -> int:
        """Appends a tensor; returns its index. layer: >= 0, PRE, POST or ALL; tp_split: the
        dimension split over tp (None: replicated); dp_sharded: ZeRO-1 ranges over dp."""
        _need_torch()
        if self.frozen:
            raise _invalid("collection is frozen: a runtime joined with it")
        if not isinstance(name, str):
            raise _invalid("tensor name must be a str, got %s" % type(name).__name__)
        raw = name.encode()
        if not raw or len(raw) >= L.NAME_MAX or b"\0" in raw:
            raise _invalid("tensor name must be 1..%d bytes without NUL: %r" % (L.NAME_MAX - 1, name))
        if name in self._index:
            raise TideError(Status.ERR_EXISTS, "tensor %r is already in the collection" % name)
        if isinstance(shape, int) or not isinstance(shape, (tuple, list, torch.Size)):
            raise _invalid("shape of %r must be a tuple of ints" % name)
        shape = tuple(shape)
        if not 1 <= len(shape) <= L.MAX_DIMS or not all(_is_int(s) and 0 < s < 1 << 62 for s in shape):
            raise _invalid("shape of %r must have 1..%d positive dims, got %r" % (name, L.MAX_DIMS, shape))
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in _DTYPES:
            raise _invalid("dtype of %r must be one of %s, got %r" % (
                name, ", ".join(str(d) for d in _DTYPES), dtype))
        if not _is_int(layer) or not (layer >= ALL and layer < self.num_layers):
            raise _invalid("layer of %r must be PRE, POST, ALL or 0..%d, got %r" % (
                name, self.num_layers - 1, layer))
        if tp_split is not None and (not _is_int(tp_split) or not 0 <= tp_split < len(shape)):
            raise _invalid("tp_split of %r must be None or a dim in 0..%d" % (name, len(shape) - 1))
        if not _is_int(tp_segments) or tp_segments < 1:
            raise _invalid("tp_segments of %r must be an int >= 1" % name)
        d = L.TensorDesc()
        d.name = raw
        d.dtype = _DTYPES[dtype]
        d.ndim = len(shape)
        for i, s in enumerate(shape):
            d.shape[i] = s
        d.layer = layer
        d.tp = 0 if tp_split is None else 1
        d.tp_dim = tp_split or 0
        d.tp_segments = tp_segments
        d.dp = 1 if dp_sharded else 0
        _check(L.lib().tide_collection_add(self._ptr, byref(d)), "collection add %r" % name)
        self._index[name] = len(self.specs)
        self.specs.append(TensorSpec(name, shape, dtype, layer, tp_split, tp_segments,
                                     bool(dp_sharded)))
        return len(self.specs) - 1

    def __len__(self) -> int:
        return len(self.specs)

    def index(self, name: str) -> int:
        """Index of tensor name; TideError(ERR_NOT_FOUND) when absent."""
        if not isinstance(name, str):
            raise _invalid("tensor name must be a str, got %s" % type(name).__name__)
        if name not in self._index:
            raise TideError(Status.ERR_NOT_FOUND, "no tensor %r in the collection" % (name,))
        return self._index[name]

    def names(self) -> List[str]:
        """The tensors' names in the order they were added (their indices)."""
        return [s.name for s in self.specs]

    def _tensor(self, i: Any) -> int:
        """i as a tensor index (an int in range, or a name)."""
        if isinstance(i, str):
            return self.index(i)
        if not _is_int(i) or not 0 <= i < len(self.specs):
            raise TideError(Status.ERR_RANGE, "tensor index must be an int in 0..%d or a name, got %r"
                            % (len(self.specs) - 1, i))
        return i

    def local_shape(self, i: Union[int, str], tp: int, dp: int, nbytes: int) -> Tuple[int, ...]:
        """Shape of tensor i's (an index or a name) local buffer of nbytes under tp and dp
        degrees: the tp shard's shape, flat when DP-sharded (a range of the flattened shard)."""
        i = self._tensor(i)
        for k, v in (("tp", tp), ("dp", dp)):
            if not _is_int(v) or not 1 <= v <= 1 << 20:
                raise _invalid("%s must be an int in 1..2^20, got %r" % (k, v))
        if not _is_int(nbytes) or nbytes < 0:
            raise _invalid("nbytes must be an int >= 0, got %r" % (nbytes,))
        s = self.specs[i]
        es = _elem_size(s.dtype)
        if nbytes % es:
            raise _invalid("nbytes %d of %r is not a whole number of %s elements" % (nbytes, s.name, s.dtype))
        if s.tp_split is not None and s.shape[s.tp_split] % tp:
            raise _invalid("tp %d does not divide dim %d (%d) of %r" % (tp, s.tp_split, s.shape[s.tp_split], s.name))
        if s.dp_sharded and dp > 1:
            return (nbytes // es,)
        shape = list(s.shape)
        if s.tp_split is not None:
            shape[s.tp_split] //= tp
        return tuple(shape)

    def extract(self, layout: "Layout", name: str, coord: Tuple[int, int, int], full: Any) -> Any:
        """Coordinate (p, d, t)'s local shard of the full tensor `name` (a new tensor)."""
        _need_torch()
        _valid_layout(layout, self)
        i = self.index(name)
        p, d, t = layout._coord(coord)
        spec = self.specs[i]
        _check_tensor(full, spec.dtype, "full tensor %r" % name, device=_CPU)
        if tuple(full.shape) != spec.shape:
            raise _invalid("full tensor %r must have shape %r, got %r" % (name, spec.shape, tuple(full.shape)))
        nb = L.lib().tide_shard_bytes(layout._ptr, self._ptr, i, p, d, t)
        out = torch.empty(self.local_shape(i, layout.tp, layout.dp, nb), dtype=spec.dtype)
        if nb:
            L.lib().tide_shard_extract(layout._ptr, self._ptr, i, p, d, t, full.data_ptr(), out.data_ptr())
        return out

    def assemble(self, layout: "Layout", shards: Mapping[Tuple[int, int, int], Mapping[str, Any]]) -> Dict[str, Any]:
        """Full tensors from the local shards of every coordinate of layout (one
        {name: tensor} per (p, d, t); a held tensor missing at its coordinate is an error)."""
        _need_torch()
        _valid_layout(layout, self)
        if not isinstance(shards, Mapping):
            raise _invalid("shards must be a mapping (p, d, t) -> {name: tensor}, got %s"
                           % type(shards).__name__)
        full = {s.name: torch.zeros(s.shape, dtype=s.dtype) for s in self.specs}
        for p in range(layout.pp):
            for d in range(layout.dp):
                for t in range(layout.tp):
                    got = shards.get((p, d, t))
                    if got is None:
                        raise _invalid("no shards for coordinate %r" % ((p, d, t),))
                    if not isinstance(got, Mapping):
                        raise _invalid("shards of coordinate %r must be a mapping name -> tensor, got %s"
                                       % ((p, d, t), type(got).__name__))
                    for i, s in enumerate(self.specs):
                        nb = L.lib().tide_shard_bytes(layout._ptr, self._ptr, i, p, d, t)
                        if nb == 0:
                            continue
                        x = got.get(s.name)
                        _check_tensor(x, s.dtype, "shard %r at %r" % (s.name, (p, d, t)), device=_CPU, nbytes=nb)
                        L.lib().tide_shard_insert(layout._ptr, self._ptr, i, p, d, t, x.data_ptr(),
                                                  full[s.name].data_ptr())
        return full

    def __del__(self) -> None:
        p = getattr(self, "_ptr", None)
        if p is not None and p.value and not getattr(self, "_borrowed", 0):
            L.lib().tide_collection_destroy(byref(p))


def _elem_size(dtype: Any) -> int:
    return torch.empty((), dtype=dtype).element_size()


_CPU = "cpu"  # the device of the geometry calls' full tensors (a torch.device once torch loads)
if torch is not None:
    _CPU = torch.device("cpu")


def _check_tensor(x: Any, dtype: Any, what: str, device: Any = None,
                  nbytes: Optional[int] = None, whose: Any = "") -> None:
    """TideError unless x is a contiguous leaf torch.Tensor of dtype (None: any) on device
    (a torch.device: its type AND index; None: any) holding nbytes (None: any)."""
    _need_torch()
    if not isinstance(x, torch.Tensor):
        raise _invalid("%s must be a torch.Tensor, got %s" % (what, type(x).__name__))
    if dtype is not None and x.dtype != dtype:
        raise _invalid("%s must be %s, got %s" % (what, dtype, x.dtype))
    if device is not None and x.device != device:
        raise _invalid("%s must be on %s%s, got %s" % (what, device, whose() if callable(whose) else whose,
                                                      x.device))
    if not x.is_contiguous():
        raise _invalid("%s must be contiguous" % what)
    if x.requires_grad and x.grad_fn is not None:
        raise _invalid("%s must be a leaf tensor (not an autograd result)" % what)
    if nbytes is not None and x.numel() * x.element_size() != nbytes:
        raise _invalid("%s must hold %d bytes, got %d" % (what, nbytes, x.numel() * x.element_size()))


def _valid_layout(layout: Any, coll: "Collection") -> None:
    """TideError unless layout is a Layout that fits collection coll (tide_layout_validate:
    the geometry calls index the layout's stages by the collection's layers)."""
    if not isinstance(layout, Layout):
        raise _invalid("layout must be a tide.Layout, got %s" % type(layout).__name__)
    _check(L.lib().tide_layout_validate(layout._ptr, coll._ptr), "layout validate")


@dataclass(frozen=True)
class LayoutInfo:
    """A layout's shape (a snapshot; see tide_layout_t)."""
    dp: int
    tp: int
    pp: int
    num_layers: int
    micro_batches: int
    stage_start: Tuple[int, ...]
    workers: Tuple[int, ...]

    def stage_layers(self, p: int) -> range:
        """The layers stage p (0..pp-1) owns."""
        if not _is_int(p) or not 0 <= p < self.pp:
            raise TideError(Status.ERR_RANGE, "stage must be an int in 0..%d, got %r" % (self.pp - 1, p))
        return range(self.stage_start[p], self.stage_start[p + 1])


class Layout:
    """A layout of its own (tide_layout_t) for shard geometry outside the runtime."""

    def __init__(self, dp: int, tp: int, pp: int, num_layers: int, micro_batches: int = 1,
                 stage_start: Optional[Sequence[int]] = None) -> None:
        for k, v in (("dp", dp), ("tp", tp), ("pp", pp), ("num_layers", num_layers),
                     ("micro_batches", micro_batches)):
            if not _is_int(v) or not 1 <= v <= 1 << 20:
                raise _invalid("%s must be an int in 1..2^20, got %r" % (k, v))
        self._ptr = c_void_p()
        _check(L.lib().tide_layout_new(byref(self._ptr), dp, tp, pp, num_layers, micro_batches),
               "tide_layout_new")
        self.dp, self.tp, self.pp, self.num_layers = dp, tp, pp, num_layers
        if stage_start is not None:
            if isinstance(stage_start, (str, bytes)) or not isinstance(stage_start, Iterable):
                raise _invalid("stage_start must be %d ints, got %r" % (pp + 1, stage_start))
            st = list(stage_start)
            if len(st) != pp + 1 or not all(_is_int(s) for s in st):
                raise _invalid("stage_start must be %d ints" % (pp + 1))
            _check(L.lib().tide_layout_set_stages(self._ptr, (c_int * len(st))(*st)),
                   "tide_layout_set_stages")

    @classmethod
    def of(cls, info: LayoutInfo) -> "Layout":
        """A Layout of the shape of info (a view's layout), for the geometry calls."""
        if not isinstance(info, LayoutInfo):
            raise _invalid("Layout.of takes a tide.LayoutInfo (view.layout), got %s" % type(info).__name__)
        return cls(info.dp, info.tp, info.pp, info.num_layers, info.micro_batches, info.stage_start)

    def validate(self, coll: Collection) -> None:
        """TideError unless coll fits this layout (layers, tp and dp divisibility)."""
        if not isinstance(coll, Collection):
            raise _invalid("validate takes a tide.Collection, got %s" % type(coll).__name__)
        _check(L.lib().tide_layout_validate(self._ptr, coll._ptr), "layout validate")

    def _coord(self, c: Any) -> Tuple[int, int, int]:
        if (not isinstance(c, tuple) or len(c) != 3 or not all(_is_int(x) for x in c)
                or not (0 <= c[0] < self.pp and 0 <= c[1] < self.dp and 0 <= c[2] < self.tp)):
            raise _invalid("coordinate must be (p, d, t) inside (pp %d, dp %d, tp %d), got %r"
                           % (self.pp, self.dp, self.tp, c))
        return c

    def shard_bytes(self, coll: Collection, name: str, coord: Tuple[int, int, int]) -> int:
        """Bytes of tensor `name` that coordinate (p, d, t) holds in this layout (0: none)."""
        if not isinstance(coll, Collection):
            raise _invalid("shard_bytes takes a tide.Collection, got %s" % type(coll).__name__)
        _valid_layout(self, coll)
        i = coll.index(name)
        p, d, t = self._coord(coord)
        return int(L.lib().tide_shard_bytes(self._ptr, coll._ptr, i, p, d, t))

    def __del__(self) -> None:
        p = getattr(self, "_ptr", None)
        if p is not None and p.value:
            L.lib().tide_layout_destroy(byref(p))


@dataclass(frozen=True)
class View:
    """What this rank is in a layout (a snapshot of tide_view)."""
    generation: int
    layout: Optional[LayoutInfo]
    member: bool
    pp_rank: int
    dp_rank: int
    tp_rank: int
    step: int
    pp_prev: int
    pp_next: int

    @property
    def coord(self) -> Tuple[int, int, int]:
        return (self.pp_rank, self.dp_rank, self.tp_rank)


def _layout_info(lp: Any) -> Optional[LayoutInfo]:
    if not lp:
        return None
    l = lp.contents
    n = l.dp * l.tp * l.pp
    return LayoutInfo(l.dp, l.tp, l.pp, l.num_layers, l.micro_batches,
                      tuple(l.stage_start[i] for i in range(l.pp + 1)),
                      tuple(l.worker[i] for i in range(n)))


def _view(vp: Any) -> View:
    v = vp.contents
    return View(v.generation, _layout_info(v.layout), bool(v.member), v.pp_rank, v.dp_rank,
                v.tp_rank, v.step, v.pp_prev, v.pp_next)


def _disjoint(named: List[Tuple[str, Any]], what: str) -> None:
    """TideError when two of the tensors share memory (libtide writes each one whole)."""
    spans = sorted((x.data_ptr(), x.data_ptr() + x.numel() * x.element_size(), n)
                   for n, x in named if x.numel())
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise _invalid("%s: tensors %s and %s share memory" % (what, an, bn))


def _comm_handle(comm: Any) -> int:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise TideError(Status.ERR_UNSUPPORTED, "mpi4py is required: %s" % e) from None
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise _invalid("comm must be an mpi4py intracommunicator, got %r" % (comm,))
    if MPI.Query_thread() < MPI.THREAD_FUNNELED:
        raise TideError(Status.ERR_UNSUPPORTED,
                        "MPI was initialised below MPI_THREAD_FUNNELED: set "
                        "mpi4py.rc.thread_level = 'funneled' (or higher) before importing MPI")
    return MPI._handleof(comm)


TensorMap = Dict[str, Any]


def find_checkpoint(path: str) -> Tuple[str, int]:
    """(directory, step) of the newest complete checkpoint under path (a checkpoint root, or
    one step's directory); TideError(ERR_NOT_FOUND) when there is none."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise _invalid("checkpoint path must be a non-empty str, got %r" % (path,))
    buf = ctypes.create_string_buffer(4096)
    step = ctypes.c_int64()
    _check(L.lib().tide_checkpoint_find(path.encode(), buf, len(buf), byref(step)),
           "tide_checkpoint_find")
    return buf.value.decode(), int(step.value)


class Runtime:
    """One rank's tide runtime (tide_t): a context manager; close() leaves the pool.

    Collective over comm (default MPI.COMM_WORLD); blocks until every rank registered with
    tided. Keyword settings override the TIDE_* environment defaults (tide_options in
    tide.h); min_gpus, max_gpus and priority declare the job's elastic bounds and priority
    with its join (TIDE_MIN_GPUS, TIDE_MAX_GPUS, TIDE_PRIORITY). Every method must be
    called from the thread that created the runtime."""

    _ENDPOINTS = ("endpoint", "key_file", "server_key", "pool", "backend")
    _INTS = ("device", "mem_bytes", "register_timeout_ms", "join_timeout_ms",
             "switch_timeout_ms", "staging_cap", "min_gpus", "max_gpus", "priority")

    def __init__(self, comm: Any = None, **settings: Any) -> None:
        self._t = c_void_p()
        self._thread = threading.get_ident()
        self._coll: Optional[Collection] = None
        self._bufs: TensorMap = {}
        self.resumed: Optional[str] = None  # the checkpoint join's resume found
        self.last_reshard: Optional[Dict[str, float]] = None
        lib = L.lib()
        o = L.Options()
        lib.tide_options_init(byref(o))
        keep = []
        for k, v in settings.items():
            if k in self._ENDPOINTS:
                if not isinstance(v, str) or "\0" in v:
                    raise _invalid("%s must be a str" % k)
                keep.append(v.encode())
                setattr(o, k, keep[-1])
            elif k in self._INTS:
                hi = {"min_gpus": 1 << 20, "max_gpus": 1 << 20,
                      "priority": 100}.get(k, (1 << 62) - 1)
                if not _is_int(v) or v < (-1 if k == "device" else 0) or v > hi:
                    raise _invalid("%s must be an int in %d..%d, got %r"
                                   % (k, -1 if k == "device" else 0, hi, v))
                setattr(o, k, v)
            else:
                raise _invalid("unknown setting %r (known: %s)" % (k, ", ".join(self._ENDPOINTS + self._INTS)))
        h = _comm_handle(comm)
        _check(lib.tide_new(byref(self._t), byref(o), c_void_p(h)), "tide_new")
        self._lib = lib
        self._vp = lib.tide_view_get(self._t)
        self.backend: str = lib.tide_backend_name(self._t).decode()
        #: the rank's device index on its host, chosen by libtide (tide_device: TIDE_DEVICE,
        #: the `device` setting, else the rank's index among its host's ranks)
        self.device_index: int = int(lib.tide_device(self._t))
        #: "cuda" when the backend takes device memory (nccl), else "cpu" (mpi: host memory)
        self.device_type = "cuda" if lib.tide_buffer_kind(self._t) == 1 else "cpu"
        #: where every tensor handed to the runtime must live: torch.device("cuda", device_index)
        #: on nccl, torch.device("cpu") on mpi (None without PyTorch)
        self.device: Any = None
        self._red_dtypes: Optional[frozenset] = None  # tide_coll_comm_has_dtype's answers
        if torch is not None:
            if self.device_type == "cuda":
                self.device = torch.device("cuda", self.device_index)
            else:
                self.device = torch.device("cpu")
        if self.device_type == "cuda":
            if torch is None or not torch.cuda.is_available():
                self.close()
                raise TideError(Status.ERR_UNSUPPORTED, "the %s backend takes CUDA device memory and "
                                "this PyTorch %s" % (self.backend, "is missing" if torch is None
                                                     else "has no CUDA device"), "tide.Runtime")
            # libtide made its device current on this thread; PyTorch keeps its own notion
            torch.cuda.set_device(self.device)

    # ---- lifetime -------------------------------------------------------------------------

    def _live(self) -> ctypes.c_void_p:
        if not self._t or not self._t.value:
            raise _invalid("the runtime is closed")
        if threading.get_ident() != self._thread:
            raise _invalid("tide calls must come from the thread that created the runtime")
        return self._t

    def close(self) -> None:
        """Leaves the pool (tide_destroy); idempotent. Registered tensors are released."""
        if self._t and self._t.value:
            self._lib.tide_destroy(byref(self._t))
        self._bufs = {}

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def worker_id(self) -> int:
        """tided's id of this rank: the WORKER of `tidectl status`, drain, events, metrics."""
        return int(self._lib.tide_worker_id(self._live()))

    @property
    def pool_rank(self) -> int:
        """This rank in its pool: the ids a layout's worker map holds (view.layout)."""
        return int(self._lib.tide_pool_rank(self._live()))

    def pool_worker_id(self, rank: int) -> int:
        """tided's worker id of pool rank `rank` (-1 when out of range)."""
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise _invalid("pool_worker_id: rank must be an int, not %s" % type(rank).__name__)
        return int(self._lib.tide_pool_worker_id(self._live(), rank))

    @property
    def pool_size(self) -> int:
        return int(self._lib.tide_pool_size(self._live()))

    @property
    def collection(self) -> Collection:
        if self._coll is None:
            raise _invalid("join first: the runtime has no collection")
        return self._coll

    # ---- joining -----------------------------------------------------------------------

    def join(self, job: str, collection: Collection, dp: int = 1, tp: int = 1, pp: int = 1,
             micro_batches: int = 1, start_step: int = 0,
             fit: Optional[Sequence[Tuple[Any, ...]]] = None,
             resume: Optional[str] = None) -> View:
        """Joins online job `job` with its first layout (collective over the pool); returns
        the view. The collection is frozen from here on. fit: what layouts the program can
        run, as (degree, n) or (degree, n, what) tuples, degree "dp", "tp", "pp" or
        "dp_micro" (dp x micro-batches): that degree must divide n (e.g. ("dp_micro",
        global_batch, "the global batch")); tided refuses resizes that break one and recovers only to layouts that
        keep them all (tide_join_req.fit in tide.h). resume: a checkpoint root or one
        step's directory: the job starts at the step of the newest complete checkpoint there
        (start_step is then ignored) and load_checkpoint fills the state from it."""
        t = self._live()
        if self._coll is not None:
            raise _invalid("this runtime already joined a job")
        if not isinstance(job, str) or not 1 <= len(job.encode()) <= 127 or "\0" in job:
            raise _invalid("job must be a str of 1..127 chars [A-Za-z0-9._:-], got %r" % (job,))
        if not isinstance(collection, Collection) or len(collection) == 0:
            raise _invalid("collection must be a non-empty tide.Collection")
        for k, v in (("dp", dp), ("tp", tp), ("pp", pp), ("micro_batches", micro_batches)):
            if not _is_int(v) or not 1 <= v <= 1 << 20:
                raise _invalid("%s must be an int in 1..2^20, got %r" % (k, v))
        if not _is_int(start_step) or start_step < 0:
            raise _invalid("start_step must be an int >= 0")
        rules, n_rules = _fit_rules(fit)
        if resume is not None:
            self.resumed, start_step = find_checkpoint(resume)
        req = L.JoinReq(job.encode(), collection._ptr, dp, tp, pp, micro_batches, start_step,
                        rules, n_rules)
        collection.frozen = True
        _check(self._lib.tide_join(t, byref(req)), "tide_join")
        self._coll = collection
        return self.view

    @property
    def view(self) -> View:
        """The current layout and this rank's place in it."""
        return _view(self._lib.tide_view_get(self._live()))

    @property
    def next_view(self) -> Optional[View]:
        """After RECONFIGURE: the layout being switched to; None otherwise."""
        vp = self._lib.tide_view_next(self._live())
        return _view(vp) if vp else None

    # ---- state ------------------------------------------------------------------------------

    def _holdings(self, vp: Any) -> List[Tuple[int, int]]:
        c = self.collection
        v = vp.contents
        if not v.member:
            return []
        out = []
        for i in range(len(c)):
            nb = self._lib.tide_shard_bytes(v.layout, c._ptr, i, v.pp_rank, v.dp_rank, v.tp_rank)
            if nb:
                out.append((i, int(nb)))
        return out

    def _zeros(self, vp: Any) -> TensorMap:
        c = self.collection
        v = vp.contents
        out = {}
        for i, nb in self._holdings(vp):
            s = c.specs[i]
            out[s.name] = torch.zeros(c.local_shape(i, v.layout.contents.tp, v.layout.contents.dp, nb),
                                      dtype=s.dtype, device=self.device)
        return out

    def zeros(self) -> TensorMap:
        """Zero tensors for the tensors this rank holds in the current layout, by name, in
        the shard geometry (empty when not a member)."""
        self._live()
        _need_torch()
        return self._zeros(self._vp)

    def _ptrs(self, vp: Any, state: Mapping[str, Any]) -> Tuple[Any, TensorMap]:
        c = self.collection
        if not isinstance(state, Mapping):
            raise _invalid("state must be a mapping of tensor name -> torch.Tensor")
        held = self._holdings(vp)
        want = {c.specs[i].name for i, _ in held}
        extra = set(state) - want
        if extra:
            raise _invalid("state has tensors this rank does not hold here: %s" % ", ".join(sorted(map(str, extra))))
        missing = want - set(state)
        if missing:
            raise _invalid("state lacks tensors this rank holds: %s" % ", ".join(sorted(missing)))
        arr = (c_void_p * len(c))()
        keep: TensorMap = {}
        for i, nb in held:
            s = c.specs[i]
            x = state[s.name]
            _check_tensor(x, s.dtype, "tensor %r" % s.name, device=self.device, nbytes=nb,
                          whose=self._whose)
            arr[i] = x.data_ptr()
            keep[s.name] = x
        return arr, keep

    def set_buffers(self, state: Mapping[str, Any]) -> None:
        """Registers this rank's local tensors of the current layout (exactly the tensors it
        holds, each contiguous, of its dtype and shard size, on the runtime's device, no two
        sharing memory). The runtime keeps references to them until the next reshard."""
        t = self._live()
        arr, keep = self._ptrs(self._vp, state)
        _disjoint(list(keep.items()), "set_buffers")
        _check(self._lib.tide_set_buffers(t, arr), "tide_set_buffers")
        self._bufs = keep

    def load_checkpoint(self, state: Mapping[str, Any], path: Optional[str] = None) -> None:
        """Fills state (this rank's tensors of the current layout, as set_buffers takes them)
        from the checkpoint in path (default: the one join's resume found), saved in any
        layout; its step must be the view's (join with resume=, or start_step = its step).
        Every chunk read is checked; TideError naming the file otherwise. Blocking file I/O."""
        t = self._live()
        if path is None:
            path = self.resumed
        if path is None:
            raise _invalid("load_checkpoint: no path, and join had no resume")
        if not isinstance(path, str) or not path or "\0" in path:
            raise _invalid("checkpoint path must be a non-empty str, got %r" % (path,))
        arr, _ = self._ptrs(self._vp, state)
        self._sync()
        _check(self._lib.tide_checkpoint_load(t, path.encode(), arr), "tide_checkpoint_load")

    def checkpoint(self, root: str) -> None:
        """Saves the registered state as the checkpoint of the view's step under root
        (root/step-N/, docs/checkpoints.md), at a step boundary on every member;
        asynchronous: returns once this rank's part is copied (tide_checkpoint)."""
        t = self._live()
        if not isinstance(root, str) or not root or "\0" in root:
            raise _invalid("checkpoint root must be a non-empty str, got %r" % (root,))
        self._sync()
        _check(self._lib.tide_checkpoint(t, root.encode()), "tide_checkpoint")

    def checkpoint_every(self, root: str, every: int, keep: int = 0) -> None:
        """A checkpoint under root at the end of every every-th step (0: none); the newest
        keep complete ones are kept (0: all) (tide_checkpoint_every)."""
        t = self._live()
        if not isinstance(root, str) or not root or "\0" in root:
            raise _invalid("checkpoint root must be a non-empty str, got %r" % (root,))
        for k, v in (("every", every), ("keep", keep)):
            if not _is_int(v) or not 0 <= v < 1 << 31:
                raise _invalid("%s must be an int >= 0, got %r" % (k, v))
        _check(self._lib.tide_checkpoint_every(t, root.encode(), every, keep),
               "tide_checkpoint_every")

    def checkpoint_wait(self) -> None:
        """Waits until this rank's save being written is on disk; TideError if it failed."""
        _check(self._lib.tide_checkpoint_wait(self._live()), "tide_checkpoint_wait")

    # ---- steps ----------------------------------------------------------------------------

    def step_begin(self) -> Action:
        """Step boundary (tide_step_begin); idle ranks block here."""
        a = c_int()
        _check(self._lib.tide_step_begin(self._live(), byref(a)), "tide_step_begin")
        return Action(a.value)

    def step_end(self, error: Union[None, int, BaseException] = None) -> None:
        """Ends the step: error None counts it; a TideError (or a status) discards it."""
        if error is None:
            rc = 0
        elif isinstance(error, TideError):
            rc = int(error.status)
        elif _is_int(error) and error in Status.__members__.values():
            rc = int(error)
        elif isinstance(error, BaseException):
            rc = int(Status.ERR_INTERNAL)
        else:
            raise _invalid("step_end takes None, a TideError or a Status, got %r" % (error,))
        t = self._live()
        self._sync()  # a checkpoint due at this step snapshots the state: the step's work first
        _check(self._lib.tide_step_end(t, rc), "tide_step_end")

    def step_can_finish(self) -> None:
        """From here on this rank could complete the step alone (see tide_step_can_finish)."""
        self._lib.tide_step_can_finish(self._live())

    def finish(self) -> None:
        """The job is over (every member after its last step): releases idle ranks."""
        _check(self._lib.tide_finish(self._live()), "tide_finish")

    def reshard(self, new_state: Optional[Mapping[str, Any]] = None) -> TensorMap:
        """After RECONFIGURE: moves the registered state into the next layout and returns the
        new local tensors by name (zero-allocated unless new_state gives them); they are then
        registered. On failure the old state stays registered and TideError is raised."""
        t = self._live()
        vp = self._lib.tide_view_next(t)
        if not vp:
            raise _invalid("reshard outside a RECONFIGURE (no next layout)")
        if new_state is None:
            new_state = self._zeros(vp)
        arr, keep = self._ptrs(vp, new_state)
        _disjoint([("new " + n, x) for n, x in keep.items()] +
                  [("registered " + n, x) for n, x in self._bufs.items()],
                  "reshard: the new layout's tensors must be memory of their own (both layouts "
                  "are held during the switch)")
        self._sync()
        st = L.ReshardStats()
        _check(self._lib.tide_reshard(t, arr, byref(st)), "tide_reshard")
        self._bufs = keep
        self.last_reshard = {k: getattr(st, k) for k, _ in L.ReshardStats._fields_}
        return dict(keep)

    # ---- collectives --------------------------------------------------------------------

    def _comm(self, group: Group) -> int:
        self._live()
        if not isinstance(group, Group):
            raise _invalid("group must be a tide.Group, got %r" % (group,))
        v = self._vp.contents
        h = getattr(v, group.value)
        if not v.member or not h:
            raise _invalid("this rank has no %s communicator (not a member of the layout)" % group.value)
        return h

    def _whose(self) -> str:
        return " (the runtime's device: tide_device %d, %s backend)" % (self.device_index, self.backend)

    def _buf(self, x: Any, what: str) -> None:
        _check_tensor(x, None, what, device=self.device, whose=self._whose)

    def _stream(self) -> Optional[int]:
        """The stream the collectives run on: PyTorch's current stream of the runtime's
        device (ordered after the kernels that made their tensors); None on the host."""
        if self.device_type != "cuda":
            return None
        return torch.cuda.current_stream(self.device).cuda_stream

    def _sync(self) -> None:
        """Waits for PyTorch's queued work on the device (before libtide reads or writes
        tensors on streams of its own: reshard)."""
        if self.device_type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def group_size(self, group: Group) -> int:
        return int(self._lib.tide_coll_comm_size(self._comm(group)))

    def group_rank(self, group: Group) -> int:
        return int(self._lib.tide_coll_comm_rank(self._comm(group)))

    def allreduce(self, x: Any, group: Group = Group.DP, op: ReduceOp = ReduceOp.SUM) -> Any:
        """In-place allreduce of tensor x over group; returns x. Blocks."""
        h = self._comm(group)
        self._buf(x, "allreduce tensor")
        dt = _DTYPES.get(x.dtype)
        if self._red_dtypes is None:  # one backend per runtime: ask it once
            self._red_dtypes = frozenset(d for d in set(_DTYPES.values())
                                         if self._lib.tide_coll_comm_has_dtype(h, d))
        if dt not in self._red_dtypes:
            raise _invalid("allreduce dtype must be float32, float64, int32 or int64%s, got %s"
                           % (" or bfloat16" if 2 in self._red_dtypes else "", x.dtype))
        if not isinstance(op, ReduceOp):
            raise _invalid("op must be a tide.ReduceOp, got %r" % (op,))
        p = x.data_ptr()
        _check(self._lib.tide_coll_allreduce(h, p, p, x.numel(), dt, op.value, self._stream()),
               "allreduce")
        return x

    def broadcast(self, x: Any, root: int, group: Group = Group.DP) -> Any:
        """In-place broadcast of x from group rank root; returns x. Blocks."""
        h = self._comm(group)
        self._buf(x, "broadcast tensor")
        n = self._lib.tide_coll_comm_size(h)
        if not _is_int(root) or not 0 <= root < n:
            raise _invalid("root must be a rank in 0..%d, got %r" % (n - 1, root))
        _check(self._lib.tide_coll_broadcast(h, x.data_ptr(), x.numel() * x.element_size(), root,
                                             self._stream()), "broadcast")
        return x

    def allgather(self, x: Any, group: Group = Group.DP) -> Any:
        """A new tensor [group size, *x.shape] of every rank's x. Blocks."""
        h = self._comm(group)
        self._buf(x, "allgather tensor")
        out = torch.empty((self._lib.tide_coll_comm_size(h),) + tuple(x.shape), dtype=x.dtype,
                          device=x.device)
        _check(self._lib.tide_coll_allgather(h, x.data_ptr(), out.data_ptr(),
                                             x.numel() * x.element_size(), self._stream()), "allgather")
        return out

    def barrier(self, group: Group = Group.ALL) -> None:
        """Returns when every rank of group called it. Blocks."""
        _check(self._lib.tide_coll_barrier(self._comm(group), self._stream()), "barrier")

    def p2p(self, group: Group, sends: Iterable[Tuple[int, Any]] = (),
            recvs: Iterable[Tuple[int, Any]] = (), bubble: bool = True) -> None:
        """Sends and receives (peer rank in group, tensor) together and waits for all; with
        bubble the wait is pipeline bubble time (tide_bubble_wait) that offline work may
        fill. Blocks."""
        h = self._comm(group)
        n = self._lib.tide_coll_comm_size(h)
        if not isinstance(bubble, bool):
            raise _invalid("bubble must be a bool, got %r" % (bubble,))
        ops = []
        for kind, items in ((1, recvs), (0, sends)):
            if type(items) not in (list, tuple):  # the common case without abc checks (per step)
                if not isinstance(items, Iterable) or isinstance(items, (str, bytes, Mapping, torch.Tensor)):
                    raise _invalid("p2p %s must be a list of (peer, tensor) tuples, got %s"
                                   % ("recvs" if kind else "sends", type(items).__name__))
            for it in items:
                if not isinstance(it, tuple) or len(it) != 2:
                    raise _invalid("p2p entries must be (peer, tensor) tuples, got %r" % (it,))
                peer, x = it
                if not _is_int(peer) or not 0 <= peer < n:
                    raise _invalid("p2p peer must be a rank in 0..%d, got %r" % (n - 1, peer))
                self._buf(x, "p2p tensor")
                ops.append((kind, peer, x.data_ptr(), x.numel() * x.element_size()))
        if not ops:
            return
        arr = (L.P2POp * len(ops))(*[L.P2POp(k, p, b, nb, 0, 0) for k, p, b, nb in ops])
        req = c_void_p()
        _check(self._lib.tide_coll_p2p_start(h, arr, len(ops), self._stream(), byref(req)), "p2p start")
        try:
            if bubble:
                rc = self._lib.tide_bubble_wait(self._t, h, req)
            else:
                rc = self._lib.tide_coll_req_wait(h, req)
        finally:
            self._lib.tide_coll_req_free(h, byref(req))
        _check(rc, "p2p wait")

    def pp_exchange(self, send: Any = None, send_to: int = 0, recv: Any = None,
                    recv_from: int = 0) -> None:
        """Pipeline transfer with the neighbouring stages: send to the next (+1) or previous
        (-1) stage and/or receive from one, together; the wait counts as bubble. Blocks."""
        self._live()
        v = self._vp.contents
        sends, recvs = [], []
        for x, d, lst, what in ((send, send_to, sends, "send"), (recv, recv_from, recvs, "recv")):
            if x is None:
                continue
            if not _is_int(d) or d not in (-1, 1):
                raise _invalid("%s direction must be -1 (previous stage) or +1 (next stage)" % what)
            peer = v.pp_prev if d < 0 else v.pp_next
            if peer < 0:
                raise _invalid("stage %d has no %s stage to %s" % (
                    v.pp_rank, "previous" if d < 0 else "next", what))
            lst.append((peer, x))
        self.p2p(Group.PP, sends, recvs)

    def bubble_stats(self) -> Dict[str, Any]:
        s = L.BubbleStats()
        self._lib.tide_bubble_stats_get(self._live(), byref(s))
        return {"windows": s.windows, "bubble_ms": s.bubble_ms, "filled_ms": s.filled_ms,
                "task_steps": s.task_steps, "task": s.task.decode()}
