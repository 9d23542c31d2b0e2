"""Loading libtide and declaring the C functions the binding calls (ctypes, no compiled code).

Where libtide.so is looked for, in this order (the first that loads is used; library_path()
says which; when none does, OSError lists every place tried and why it failed):
  1. $TIDE_LIB: that file, and nothing else;
  2. this package's folder (a libtide.so copied in next to __init__.py);
  3. a source checkout's build: $TIDE_BUILD_DIR/worker, then build/worker in each of the
     four folders above this package;
  4. an installed tide (`cmake --install build --prefix P`), its prefix found from
     a. $TIDE_PREFIX,
     b. pkg-config's tide.pc (`pkg-config --variable=libdir tide`, so PKG_CONFIG_PATH
        counts, as for a C program built against tide),
     c. the tided on $PATH (P/bin/tided: P),
     d. the prefix this package is installed in (P/lib/pythonX.Y/site-packages/tide, or
        P/local/lib/... where Debian's pip puts `pip install --prefix P`), and the venv
        this Python runs in (sys.prefix),
     each prefix's lib, lib64 and lib/<multiarch> folders;
  5. the dynamic loader's own search (ctypes.util.find_library: ldconfig's cache,
     LD_LIBRARY_PATH);
  6. the standard prefixes' lib folders: /usr/local then /usr (lib, lib64, lib/<multiarch>).
Only names declared in include/tide/ are used. The structs are mirrored by hand, so each
is checked against the library's own layout (tide_abi_sizeof / tide_abi_offsetof) when it
loads: a library of another version raises AbiError instead of corrupting memory.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import sys
import sysconfig
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_int, c_int32, c_int64,
                    c_size_t, c_uint64, c_void_p)
from typing import List, Optional, Sequence, Tuple

MAX_DIMS = 4
NAME_MAX = 96


class Options(Structure):
    _c_name_ = "tide_options"
    _fields_ = [("endpoint", c_char_p), ("key_file", c_char_p), ("server_key", c_char_p),
                ("pool", c_char_p), ("backend", c_char_p), ("device", c_int),
                ("mem_bytes", c_uint64), ("register_timeout_ms", c_int),
                ("join_timeout_ms", c_int), ("switch_timeout_ms", c_int),
                ("staging_cap", c_uint64), ("mem_strict", c_int),
                ("heartbeat_aggregate", c_int), ("min_gpus", c_int), ("max_gpus", c_int),
                ("priority", c_int)]


FIT_WHAT_MAX = 96
FIT_RULES_MAX = 32


class FitRule(Structure):
    _c_name_ = "tide_fit_rule"
    _fields_ = [("degree", c_int), ("n", c_int64), ("what", c_char * FIT_WHAT_MAX)]


class JoinReq(Structure):
    _c_name_ = "tide_join_req"
    _fields_ = [("job", c_char_p), ("collection", c_void_p), ("dp", c_int), ("tp", c_int),
                ("pp", c_int), ("micro_batches", c_int), ("start_step", c_int64),
                ("fit", POINTER(FitRule)), ("n_fit", c_int)]


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
STRUCTS = (Options, FitRule, JoinReq, LayoutS, ViewS, TensorDesc, P2POp, ReshardStats, BubbleStats)


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
        # a trailing field padding hides from the size: the counts differ
        nf = cdll.tide_abi_nfields(name.encode())
        if nf != len(st._fields_):
            raise AbiError("%s: %s has %d fields in the library, %d in the tide binding: the "
                           "library and the binding are from different versions"
                           % (path, name, nf, len(st._fields_)))


# name: (restype, argtypes). Every C symbol the binding calls is listed here and nowhere else.
_PROTOS = {
    # include/tide/tide.h: the layout of the structs above, checked before any other call
    "tide_abi_sizeof": (c_size_t, [c_char_p]),
    "tide_abi_offsetof": (c_size_t, [c_char_p, c_char_p]),
    "tide_abi_nfields": (c_size_t, [c_char_p]),
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
    "tide_checkpoint": (c_int, [c_void_p, c_char_p]),
    "tide_checkpoint_every": (c_int, [c_void_p, c_char_p, c_int, c_int]),
    "tide_checkpoint_wait": (c_int, [c_void_p]),
    "tide_checkpoint_find": (c_int, [c_char_p, c_char_p, c_size_t, POINTER(c_int64)]),
    "tide_checkpoint_load": (c_int, [c_void_p, c_char_p, POINTER(c_void_p)]),
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


LIBNAME = "libtide.so"


def _lib_dirs(prefix: str) -> List[str]:
    """The folders of an installed prefix where GNUInstallDirs may put libtide."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [os.path.join(prefix, "lib"), os.path.join(prefix, "lib64")]
    if multiarch:
        dirs.append(os.path.join(prefix, "lib", multiarch))
    return dirs


def _pkg_config_libdir() -> Optional[str]:
    """libdir of the tide.pc that pkg-config finds (None without pkg-config or tide.pc)."""
    exe = shutil.which("pkg-config")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "--variable=libdir", "tide"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    out = r.stdout.strip()
    return os.path.normpath(out) if r.returncode == 0 and out else None


def _package_prefixes(here: str) -> List[str]:
    """P when this package lies in P/lib*/pythonX.Y/{site,dist}-packages/tide; Debian's pip
    puts `pip install --prefix P` under P/local/lib/...: then P/local and P."""
    parts = here.split(os.sep)
    for i in range(len(parts) - 1, 1, -1):
        if parts[i] in ("site-packages", "dist-packages") and parts[i - 1].startswith("python") \
                and parts[i - 2].startswith("lib"):
            prefix = os.sep.join(parts[:i - 2]) or os.sep
            if os.path.basename(prefix) == "local":
                return [prefix, os.path.dirname(prefix)]
            return [prefix]
    return []


def candidates() -> List[Tuple[str, str]]:
    """(path, where it comes from) of every libtide the loader tries, in order (see the
    module's docstring); a bare name is left to the dynamic loader."""
    env = os.environ.get("TIDE_LIB")
    if env:
        return [(env, "$TIDE_LIB")]  # explicit: nothing else is tried
    out: List[Tuple[str, str]] = []
    here = os.path.dirname(os.path.abspath(__file__))
    out.append((os.path.join(here, LIBNAME), "the package's folder"))
    bd = os.environ.get("TIDE_BUILD_DIR")
    if bd:
        out.append((os.path.join(bd, "worker", LIBNAME), "$TIDE_BUILD_DIR"))
    d = here
    for _ in range(4):
        d = os.path.dirname(d)
        out.append((os.path.join(d, "build", "worker", LIBNAME), "a source checkout's build"))
    dirs: List[Tuple[str, str]] = []  # (folder, why): an installed tide's lib folders
    if os.environ.get("TIDE_PREFIX"):
        dirs += [(ld, "$TIDE_PREFIX") for ld in _lib_dirs(os.environ["TIDE_PREFIX"])]
    pc = _pkg_config_libdir()
    if pc:
        dirs.append((pc, "pkg-config tide"))
    tided = shutil.which("tided")
    if tided:
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(tided)))
        dirs += [(ld, "the prefix of %s" % tided) for ld in _lib_dirs(prefix)]
    for pp in _package_prefixes(here):
        dirs += [(ld, "the package's install prefix") for ld in _lib_dirs(pp)]
    if sys.prefix != sys.base_prefix:
        dirs += [(ld, "the venv (sys.prefix)") for ld in _lib_dirs(sys.prefix)]
    out += [(os.path.join(ld, LIBNAME), why) for ld, why in dirs]
    found = ctypes.util.find_library("tide")
    if found:
        out.append((found, "the dynamic loader's search"))
    for prefix in ("/usr/local", "/usr"):
        for ld in _lib_dirs(prefix):
            out.append((os.path.join(ld, LIBNAME), "a standard prefix"))
    seen, uniq = set(), []
    for path, why in out:
        key = os.path.normpath(path) if os.sep in path else path
        if key not in seen:
            seen.add(key)
            uniq.append((path, why))
    return uniq


_lib: Optional[ctypes.CDLL] = None


_lib_path: Optional[str] = None


def library_path() -> str:
    """The file of the libtide this binding loaded (loading it first)."""
    lib()
    assert _lib_path is not None
    return _lib_path


def lib() -> ctypes.CDLL:
    """The loaded libtide with every prototype declared; raises OSError when none is found
    (listing every place tried) and AbiError when its structs differ from the binding's."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    tried = []
    for path, why in candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append("%s [%s]: absent" % (path, why))
            continue
        try:
            cdll = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append("%s [%s]: %s" % (path, why, e))
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
        _lib_path = os.path.realpath(path) if os.path.sep in path else path
        return cdll
    raise OSError("libtide.so not found. Set TIDE_LIB to its file or TIDE_PREFIX to the prefix "
                  "tide was installed to (cmake --install --prefix), or put that prefix's bin "
                  "on PATH or its lib/pkgconfig on PKG_CONFIG_PATH. Looked in, in order:\n  "
                  + "\n  ".join(tried))
