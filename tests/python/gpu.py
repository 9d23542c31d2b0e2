"""Whether the GPU path can run here: the skips of the C GPU tests (tests/gpu_test.h) and of
the old test_python.sh, as pytest skips. Only a missing device or a missing dependency
skips (said so); an NVIDIA device that PyTorch cannot use fails."""
from __future__ import annotations

import glob
import os

import pytest


def require_cuda() -> int:
    """The number of GPUs PyTorch sees, or a module-level skip/fail with the reason."""
    import torch
    nodes = glob.glob(os.environ.get("TIDE_TEST_NVIDIA_NODES", "/dev/nvidia[0-9]*"))
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not nodes and n == 0:
        pytest.skip("no CUDA device on this machine (no /dev/nvidia* node)", allow_module_level=True)
    if n == 0 and cvd is not None and (cvd == "" or cvd.startswith("-")):
        pytest.skip("CUDA_VISIBLE_DEVICES=%r hides every device" % cvd, allow_module_level=True)
    if not torch.version.cuda:
        pytest.skip("this PyTorch is built without CUDA (torch.version.cuda is None): install a "
                    "CUDA build of PyTorch (TIDE_PYTHON names the interpreter)",
                    allow_module_level=True)
    if os.environ.get("TIDE_TEST_HAVE_NCCL", "1") not in ("1", "ON"):
        pytest.skip("this build of libtide has no nccl backend (configure with CUDA and NCCL)",
                    allow_module_level=True)
    if n == 0:
        pytest.fail("an NVIDIA device is present but PyTorch cannot use it "
                    "(torch.cuda.is_available() is False; CUDA %s)" % torch.version.cuda,
                    pytrace=False)
    return n
