"""Loading libtide and declaring the C functions the binding calls (ctypes, no compiled code).

The library is found, in order, at $TIDE_LIB, next to this package (libtide.so copied in),
in $TIDE_BUILD_DIR/worker, in a build/worker folder above this file (a source checkout),
then where the dynamic loader finds libtide (ctypes.util.find_library, /usr/local/lib).
Only names declared in include/tide/ are used. The structs are mirrored by hand, so each
is checked against the library's own layout (tide_abi_sizeof / tide_abi_offsetof) when it
loads: a library of another version raises AbiError instead of corrupting memory.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_int, c_int32, c_int64,
                    c_size_t, c_uint64, c_void_p)
from typing import List, Optional, Sequence

MAX_DIMS = 4
NAME_MAX = 96


class Options(Structure):
    _c_name_ = "tide_options"
    _fields_ = [("endpoint", c_char_p), ("key_file", c_char_p), ("server_key", c_char_p),
                ("pool", c_char_p), ("backend", c_char_p), ("device", c_int),
                ("mem_bytes", c_uint64), ("register_timeout_ms", c_int),
                ("join_timeout_ms", c_int), ("switch_timeout_ms", c_int),
                ("staging_cap", c_uint64), ("mem_strict", c_int)]


class JoinReq(Structure):
    _c_name_ = "tide_join_req"
    _fields_ = [("job", c_char_p), ("collection", c_void_p), ("dp", c_int), ("tp", c_int),
                ("pp", c_int), ("micro_batches", c_int), ("start_step", c_int64)]


class LayoutS(Structure):
    _c_name_ = "tide_layout_t"
    _fields_ = [("dp", c_int), ("tp", c_int), ("pp", c_int), ("num_layers", c_int),
                ("micro_batches", c_int), ("stage_start", POINTER(c_int)),
                ("worker", POINTER(c_int32))]


class ViewS(Structure):
    _c_name_ = "tide_view"
    _fields_ = [("generation", c_uint64), ("layout", POINTER(LayoutS)), ("member", c_int),
                ("pp_rank", c_int), ("dp_rank", c_int), ("tp_rank", c_int), ("step", c_int64),
                ("all", c_void_p), ("tp", c_void_p), ("dp", c_void_p), ("pp", c_void_p),
                ("pp_prev", c_int), ("pp_next", c_int)]


class TensorDesc(Structure):
    _c_name_ = "tide_tensor_desc"
    _fields_ = [("name", c_char * NAME_MAX), ("dtype", c_int), ("ndim", c_int),
                ("shape", c_int64 * MAX_DIMS), ("layer", c_int), ("tp", c_int),
                ("tp_dim", c_int), ("tp_segments", c_int), ("dp", c_int)]


class P2POp(Structure):
    _c_name_ = "tide_p2p_op"
    _fields_ = [("kind", c_int), ("peer", c_int), ("buf", c_void_p), ("bytes", c_size_t),
                ("run", c_size_t), ("stride", c_size_t)]


class ReshardStats(Structure):
    _c_name_ = "tide_reshard_stats"
    _fields_ = [("bytes_sent", c_uint64), ("bytes_recv", c_uint64), ("bytes_local", c_uint64),
                ("plan_ms", c_double), ("move_ms", c_double), ("comm_ms", c_double),
                ("total_ms", c_double), ("wait_ms", c_double), ("sync_ms", c_double),
                ("groups_ms", c_double), ("teardown_ms", c_double), ("prepared", c_int),
                ("state_old", c_uint64), ("state_new", c_uint64), ("staging_cap", c_uint64),
                ("mem_limit", c_uint64), ("peak_extra", c_uint64), ("no_room", c_uint64),
                ("bytes_kept", c_uint64), ("bytes_shrunk", c_uint64), ("bytes_rebuilt", c_uint64),
                ("bytes_spilled", c_uint64), ("fresh_bytes", c_uint64), ("join_ms", c_double)]


class BubbleStats(Structure):
    _c_name_ = "tide_bubble_stats"
    _fields_ = [("windows", c_uint64), ("bubble_ms", c_double), ("filled_ms", c_double),
                ("task_steps", c_uint64), ("task", c_char * 128)]


# Every struct mirrored above, checked against the library's own layout at load time.
STRUCTS = (Options, JoinReq, LayoutS, ViewS, TensorDesc, P2POp, ReshardStats, BubbleStats)


class AbiError(OSError):
    """The loaded libtide lays out a struct differently from this binding (a library and a
    binding of different versions): calling it would corrupt memory."""


def check_abi(cdll: ctypes.CDLL, structs: Sequence[type] = STRUCTS, path: str = "libtide") -> None:
    """Raises AbiError naming the first struct whose size, or field whose offset, differs
    between the binding's mirror and the library (tide_abi_sizeof / tide_abi_offsetof)."""
    unknown = ctypes.c_size_t(-1).value
    for st in structs:
        name = st._c_name_
        want = cdll.tide_abi_sizeof(name.encode())
        if want == 0:
            raise AbiError("%s does not know struct %s, which the tide binding mirrors: the "
                           "library and the binding are from different versions" % (path, name))
        for field, _ in st._fields_:
            off = cdll.tide_abi_offsetof(name.encode(), field.encode())
            have = getattr(st, field).offset
            if off == unknown:
                raise AbiError("%s: %s has no field %s, which the tide binding mirrors: the "
                               "library and the binding are from different versions"
                               % (path, name, field))
            if off != have:
                raise AbiError("%s: %s.%s is at offset %d in the library, %d in the tide "
                               "binding: the library and the binding are from different versions"
                               % (path, name, field, off, have))
        if want != ctypes.sizeof(st):
            raise AbiError("%s: %s is %d bytes in the library, %d in the tide binding: the "
                           "library and the binding are from different versions"
                           % (path, name, want, ctypes.sizeof(st)))


# name: (restype, argtypes). Every C symbol the binding calls is listed here and nowhere else.
_PROTOS = {
    # include/tide/tide.h: the layout of the structs above, checked before any other call
    "tide_abi_sizeof": (c_size_t, [c_char_p]),
    "tide_abi_offsetof": (c_size_t, [c_char_p, c_char_p]),
    # include/tide/status.h
    "tide_strerror": (c_char_p, [c_int]),
    "tide_last_error": (c_char_p, []),
    # include/tide/tide.h
    "tide_options_init": (None, [POINTER(Options)]),
    "tide_new": (c_int, [POINTER(c_void_p), POINTER(Options), c_void_p]),
    "tide_destroy": (None, [POINTER(c_void_p)]),
    "tide_worker_id": (c_int32, [c_void_p]),
    "tide_pool_rank": (c_int, [c_void_p]),
    "tide_pool_worker_id": (c_int32, [c_void_p, c_int]),
    "tide_pool_size": (c_int, [c_void_p]),
    "tide_backend_name": (c_char_p, [c_void_p]),
    "tide_buffer_kind": (c_int, [c_void_p]),
    "tide_device": (c_int, [c_void_p]),
    "tide_join": (c_int, [c_void_p, POINTER(JoinReq)]),
    "tide_view_get": (POINTER(ViewS), [c_void_p]),
    "tide_view_next": (POINTER(ViewS), [c_void_p]),
    "tide_set_buffers": (c_int, [c_void_p, POINTER(c_void_p)]),
    "tide_step_begin": (c_int, [c_void_p, POINTER(c_int)]),
    "tide_step_end": (c_int, [c_void_p, c_int]),
    "tide_step_can_finish": (None, [c_void_p]),
    "tide_bubble_wait": (c_int, [c_void_p, c_void_p, c_void_p]),
    "tide_bubble_stats_get": (None, [c_void_p, POINTER(BubbleStats)]),
    "tide_reshard": (c_int, [c_void_p, POINTER(c_void_p), POINTER(ReshardStats)]),
    "tide_finish": (c_int, [c_void_p]),
    # include/tide/collection.h: collection, layout, shard geometry
    "tide_collection_new": (c_int, [POINTER(c_void_p), c_int]),
    "tide_collection_add": (c_int, [c_void_p, POINTER(TensorDesc)]),
    "tide_collection_destroy": (None, [POINTER(c_void_p)]),
    "tide_layout_new": (c_int, [POINTER(c_void_p), c_int, c_int, c_int, c_int, c_int]),
    "tide_layout_set_stages": (c_int, [c_void_p, POINTER(c_int)]),
    "tide_layout_validate": (c_int, [c_void_p, c_void_p]),
    "tide_layout_destroy": (None, [POINTER(c_void_p)]),
    "tide_shard_bytes": (c_uint64, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int]),
    "tide_shard_extract": (None, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, c_void_p,
                                  c_void_p]),
    "tide_shard_insert": (None, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, c_void_p,
                                 c_void_p]),
    # include/tide/comm.h: operations on the view's communicators
    "tide_coll_comm_rank": (c_int, [c_void_p]),
    "tide_coll_comm_size": (c_int, [c_void_p]),
    "tide_coll_comm_has_dtype": (c_int, [c_void_p, c_int]),
    "tide_coll_allreduce": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_int, c_int,
                                    c_void_p]),
    "tide_coll_broadcast": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_void_p]),
    "tide_coll_allgather": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t, c_void_p]),
    "tide_coll_barrier": (c_int, [c_void_p, c_void_p]),
    "tide_coll_p2p_start": (c_int, [c_void_p, POINTER(P2POp), c_size_t, c_void_p,
                                    POINTER(c_void_p)]),
    "tide_coll_req_wait": (c_int, [c_void_p, c_void_p]),
    "tide_coll_req_free": (None, [c_void_p, POINTER(c_void_p)]),
}

SYMBOLS: List[str] = sorted(_PROTOS)


def _candidates() -> List[str]:
    out: List[str] = []
    env = os.environ.get("TIDE_LIB")
    if env:
        return [env]  # explicit: nothing else is tried
    here = os.path.dirname(os.path.abspath(__file__))
    out.append(os.path.join(here, "libtide.so"))
    bd = os.environ.get("TIDE_BUILD_DIR")
    if bd:
        out.append(os.path.join(bd, "worker", "libtide.so"))
    d = here
    for _ in range(4):
        d = os.path.dirname(d)
        out.append(os.path.join(d, "build", "worker", "libtide.so"))
    found = ctypes.util.find_library("tide")
    if found:
        out.append(found)
    out += ["/usr/local/lib/libtide.so", "/usr/lib/libtide.so"]
    return out


_lib: Optional[ctypes.CDLL] = None


def lib() -> ctypes.CDLL:
    """The loaded libtide with every prototype declared; raises OSError when not found."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            cdll = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        missing = [n for n in _PROTOS if not hasattr(cdll, n)]
        if missing:
            raise OSError("%s lacks symbols the tide binding needs: %s" % (path, ", ".join(missing)))
        for name, (res, args) in _PROTOS.items():
            f = getattr(cdll, name)
            f.restype = res
            f.argtypes = args
        check_abi(cdll, STRUCTS, path)
        _lib = cdll
        return cdll
    raise OSError("libtide.so not found; set TIDE_LIB to its path. Tried: " + "; ".join(tried))
