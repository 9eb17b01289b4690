"""A stand-in for CuPy's CUDA runtime calls that gsplit's pinning makes, for tests on machines without a GPU.

``FakeRuntime`` keeps the registered and allocated host ranges like the driver does (overlapping registrations
are refused, a pointer inside a registered range has a device address), and can be made slow (seconds per MiB
registered, modelling the stall that a page-by-page registration shows) or refuse registrations. Every call is
recorded in ``calls``. ``install(monkeypatch)`` puts it in ``sys.modules["cupy"]`` and makes torch and gsplit
believe that CUDA and the CuPy kernels work; ``Tensor.is_pinned`` then answers from the fake's ranges.

Example::

    runtime = FakeRuntime(seconds_per_mib=0.05)
    runtime.install(monkeypatch)
"""

from __future__ import annotations

import ctypes
import sys
import time
import types
from typing import Dict, List, Optional, Tuple

import torch

MIB = 1 << 20


class CUDARuntimeError(RuntimeError):
    """CuPy's ``cupy.cuda.runtime.CUDARuntimeError``."""


class FakeRuntime:
    """``cupy.cuda.runtime``'s registration, allocation and pointer calls, on plain host memory."""

    def __init__(self, seconds_per_mib: float = 0.0, refuse_after: Optional[int] = None, read_only: bool = True,
                 refuse_over: Optional[int] = None):
        self.seconds_per_mib = seconds_per_mib
        self.refuse_after = refuse_after
        """Refuse every registration after this many (None: never)."""
        self.refuse_over = refuse_over
        """Refuse a registration of more than this many bytes (a locked-memory limit; None: never)."""
        self.read_only = read_only
        """Whether the read-only registration flag is supported."""
        self.registered: Dict[int, int] = {}
        """Live registrations: address -> bytes."""
        self.allocated: Dict[int, Tuple[int, object]] = {}
        """Live ``hostAlloc`` buffers: address -> (bytes, the buffer)."""
        self.calls: List[tuple] = []
        self.CUDARuntimeError = CUDARuntimeError

    # ------------------------------------------------------------------ cupy.cuda.runtime
    def hostRegister(self, ptr: int, nbytes: int, flags: int) -> None:  # noqa: N802 - CuPy's names
        self.calls.append(("register", ptr, nbytes, flags))
        if flags & 8 and not self.read_only:
            raise CUDARuntimeError("cudaErrorNotSupported: operation not supported")
        if self.refuse_after is not None and len(self.registered) >= self.refuse_after:
            raise CUDARuntimeError("cudaErrorMemoryAllocation: out of memory")
        if self.refuse_over is not None and nbytes > self.refuse_over:
            raise CUDARuntimeError("cudaErrorMemoryAllocation: out of memory")
        if any(p < ptr + nbytes and ptr < p + n for p, n in self.registered.items()):
            raise CUDARuntimeError("cudaErrorHostMemoryAlreadyRegistered: part or all of the range is registered")
        time.sleep(self.seconds_per_mib * nbytes / MIB)
        self.registered[ptr] = nbytes

    def hostUnregister(self, ptr: int) -> None:  # noqa: N802
        self.calls.append(("unregister", ptr))
        if self.registered.pop(ptr, None) is None:
            raise CUDARuntimeError("cudaErrorHostMemoryNotRegistered")

    def hostAlloc(self, nbytes: int, flags: int) -> int:  # noqa: N802
        self.calls.append(("alloc", nbytes, flags))
        buf = ctypes.create_string_buffer(nbytes)
        ptr = ctypes.addressof(buf)
        self.allocated[ptr] = (nbytes, buf)
        return ptr

    def freeHost(self, ptr: int) -> None:  # noqa: N802
        self.calls.append(("free", ptr))
        self.allocated.pop(ptr)

    def pointerGetAttributes(self, ptr: int):  # noqa: N802
        for base, n in list(self.registered.items()) + [(p, n) for p, (n, _) in self.allocated.items()]:
            if base <= ptr < base + n:
                return types.SimpleNamespace(devicePointer=ptr, hostPointer=ptr, type=1)
        return types.SimpleNamespace(devicePointer=0, hostPointer=0, type=0)

    # ------------------------------------------------------------------ helpers
    def pinned(self, t: torch.Tensor) -> bool:
        """Whether the fake counts ``t``'s first byte as page-locked (what ``Tensor.is_pinned`` asks CUDA)."""
        return t.numel() > 0 and self.pointerGetAttributes(t.data_ptr()).devicePointer != 0

    def copyable(self, t: torch.Tensor) -> bool:
        """Whether a CUDA copy of all of ``t`` would be accepted: ONE registration or allocation covers its bytes.
        The driver refuses a copy whose host range spans two registrations (cudaErrorInvalidValue; seen on an
        H100: ``Tensor.to("cuda")`` of a table registered in two pieces)."""
        lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        ranges = list(self.registered.items()) + [(p, n) for p, (n, _) in self.allocated.items()]
        return any(p <= lo and hi <= p + n for p, n in ranges)

    def register_calls(self) -> List[tuple]:
        return [c for c in self.calls if c[0] == "register"]

    def install(self, monkeypatch) -> "FakeRuntime":
        """Make this the CUDA runtime of CuPy, torch and gsplit for one test."""
        from gsplit.ops import cuda

        module = types.ModuleType("cupy")
        module.cuda = types.SimpleNamespace(runtime=self)
        monkeypatch.setitem(sys.modules, "cupy", module)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "cupy_available", lambda: True)
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t, device=None: self.pinned(t))
        return self
