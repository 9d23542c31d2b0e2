"""tide for Python: make a PyTorch training loop elastic on tide's C runtime (libtide).

    from mpi4py import MPI
    import tide
    coll = tide.Collection(num_layers=4)
    coll.add("w", (1024,), torch.float32, layer=tide.ALL)
    with tide.Runtime(MPI.COMM_WORLD) as rt:
        rt.join("job", coll, dp=2)
        state = rt.zeros() if rt.view.member else {}
        rt.set_buffers(state)
        while True:
            a = rt.step_begin()
            ...

Every call runs on the thread that created the Runtime (the MPI thread); errors are
TideError exceptions carrying tide's status, its message and the C library's detail.
Tensors handed to the runtime live on rt.device (cpu on the mpi backend, cuda:<tide_device>
on nccl). libtide is found as tide._lib's docstring says; library_path() names the one used.
"""
from ._lib import SYMBOLS, library_path
from .core import (ALL, POST, PRE, Action, Collection, Group, Layout, LayoutInfo, ReduceOp,
                   Runtime, Status, TensorSpec, TideError, View, find_checkpoint)

__all__ = ["ALL", "POST", "PRE", "Action", "Collection", "Group", "Layout", "LayoutInfo",
           "ReduceOp", "Runtime", "Status", "TensorSpec", "TideError", "View", "SYMBOLS",
           "find_checkpoint", "library_path"]
