"""Checks for the SPMD test files (run under mpirun, every rank in lockstep).

A failed plain assert would stop one rank's test function while the other goes on into a
collective and hangs, so each test collects its failures in a Checks and asserts them
all at its end (both ranks reach every collective the test makes)."""
from __future__ import annotations

from typing import Any, Callable, List

import torch

from tide import Status, TideError


class Checks:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failed: List[str] = []
        self.passed = 0

    def ok(self, what: str, cond: Any) -> None:
        if cond:
            self.passed += 1
        else:
            self.failed.append(what)

    def expect(self, what: str, fn: Callable[[], Any], status: int = Status.ERR_INVALID,
               text: str = "") -> None:
        """fn() must raise TideError with status and text in its message."""
        try:
            fn()
        except TideError as e:
            if e.status == status and text in str(e):
                self.passed += 1
                return
            self.failed.append("%s: got %s (%s)" % (what, getattr(e.status, "name", e.status), e))
        except Exception as e:  # noqa: BLE001 - any other exception is a binding bug
            self.failed.append("%s: %s: %s" % (what, type(e).__name__, e))
        else:
            self.failed.append("%s: no exception" % what)

    def expect_invalid(self, what: str, fn: Callable[[], Any], text: str) -> None:
        self.expect(what, fn, Status.ERR_INVALID, text)

    def done(self) -> None:
        assert not self.failed, "rank %d: %d of %d checks failed:\n  %s" % (
            self.rank, len(self.failed), len(self.failed) + self.passed, "\n  ".join(self.failed))


class OnDevice(torch.Tensor):
    """A real tensor that says it lives on `fake`: what the binding's device check sees of
    a tensor on a device this machine may not have."""
    fake = None

    @property
    def device(self):  # type: ignore[override]
        return self.fake


def on(device: str, x: torch.Tensor) -> torch.Tensor:
    y = x.as_subclass(OnDevice)
    y.fake = torch.device(device)
    return y
