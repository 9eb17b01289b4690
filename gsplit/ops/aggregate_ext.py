"""The compiled CPU extension of ``kernels/aggregate_cpu.cpp`` (aggregations and row copies): loading it once
per process and choosing it per call. :mod:`gsplit.ops.aggregate` and :mod:`gsplit.ops.rows` both run it; it
lives here so that neither imports the other for it.
"""

from __future__ import annotations

import functools
import os

import torch

from gsplit.ops import cpu_ext

__all__ = ["EXT_NAME", "EXT_SOURCES", "extension_available"]

EXT_NAME = "gsplit_aggregate"
EXT_SOURCES = ("aggregate_cpu.cpp",)


@functools.lru_cache(maxsize=None)
def _cached_extension():
    # Cached here, None included: a failed build is tried once per process, not once per call.
    return cpu_ext.load(EXT_NAME, list(EXT_SOURCES))


def _extension():
    """The compiled module, or ``None`` (disabled by ``GSPLIT_NO_EXTENSIONS`` or not buildable)."""
    # Checked per call so that setting the variable in a running process takes effect (tests compare).
    return None if os.environ.get("GSPLIT_NO_EXTENSIONS") else _cached_extension()


def extension_available() -> bool:
    """Whether the compiled CPU kernels are in use in this process (builds them on the first call).

    Example:
        >>> isinstance(extension_available(), bool)
        True
    """
    return _extension() is not None


def _use_extension(*tensors: torch.Tensor):
    """The extension module when every tensor is a CPU float32/float64 tensor of one dtype, else None."""
    dtype = tensors[0].dtype
    if dtype not in (torch.float32, torch.float64):
        return None
    if any(t.device.type != "cpu" or t.dtype != dtype for t in tensors):
        return None
    return _extension()
