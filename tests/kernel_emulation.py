"""Run the CUDA kernels in kernels/ on the CPU, serially, for tests on machines without a GPU.

The kernels use only threadIdx/blockIdx/blockDim/gridDim (.x), plus atomics that a caller's shim
provides, and no thread waits for another, so running every (block, thread) in turn is one legal
schedule. The kernels are compiled with g++ against a tiny shim for the CUDA built-ins into a shared
library; ``SerialKernel`` then stands in for a CuPy RawKernel under gsplit.ops.cuda's own wrappers.

Example::

    lib = build_emulation_lib(tmp_dir, make_shim(["gather.cu"]), "libgather_emu.so")
    patch_gpu_launches(monkeypatch, lib)
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import pytest

from gsplit import ops
from gsplit.ops import cuda as gpu

KERNEL_DIR = Path(__file__).resolve().parents[1] / "kernels"

SHIM_PRELUDE = r"""
struct GsDim3 { unsigned x, y, z; };
static GsDim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
"""
"""CUDA built-in variables and qualifiers the kernels use, as plain C++."""

SHIM_SET_THREAD = r"""
extern "C" void emu_set_thread(unsigned grid, unsigned block, unsigned b, unsigned t) {
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    blockIdx = {b, 0, 0};
    threadIdx = {t, 0, 0};
}
"""
"""Sets the built-in variables before each serial thread runs; ``SerialKernel`` calls it."""

CTYPES = {np.uint64: ctypes.c_uint64, np.int64: ctypes.c_int64, np.int32: ctypes.c_int32}
"""ctypes type for each numpy scalar type gsplit.ops.cuda passes as a kernel argument."""


def make_shim(cu_files: Sequence[str], extra: str = "") -> str:
    """C++ source that includes ``cu_files`` (from KERNEL_DIR) after the shim and ``extra`` definitions.

    Example: ``make_shim(["sample.cu"], extra=ATOMICS)``.
    """
    includes = "".join(f'#include "{name}"\n' for name in cu_files)
    return SHIM_PRELUDE + extra + "\n" + includes + SHIM_SET_THREAD


class SerialKernel:
    """Stands in for a CuPy RawKernel: ``kernel(grid, block, args)`` runs every thread in turn.

    When ``launched`` is a list, each launch appends the kernel's name to it.
    """

    def __init__(self, lib: ctypes.CDLL, name: str, launched: Optional[List[str]] = None):
        self._fn, self._set, self._name, self._launched = getattr(lib, name), lib.emu_set_thread, name, launched
        self._fn.restype = None

    def __call__(self, grid, block, args):
        if self._launched is not None:
            self._launched.append(self._name)
        cargs = [CTYPES[type(a)](int(a)) for a in args]
        for b in range(grid[0]):
            for t in range(block[0]):
                self._set(grid[0], block[0], b, t)
                self._fn(*cargs)


def build_emulation_lib(tmp_dir: Path, shim_source: str, lib_name: str) -> ctypes.CDLL:
    """Compile ``shim_source`` (with KERNEL_DIR on the include path) into ``tmp_dir/lib_name`` and load it.

    Skips the test when there is no C++ compiler; fails with the compiler's stderr when the build fails.
    Example: ``build_emulation_lib(tmp_path_factory.mktemp("emu"), make_shim(["gather.cu"]), "libg.so")``.
    """
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) to run the kernels on the CPU")
    tmp_dir = Path(tmp_dir)
    (tmp_dir / "shim.cpp").write_text(shim_source)
    lib = tmp_dir / lib_name
    res = subprocess.run(
        [cxx, "-std=c++17", "-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-I", str(KERNEL_DIR),
         "-o", str(lib), str(tmp_dir / "shim.cpp")],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, f"host build of {lib_name} failed:\n{res.stderr}"
    return ctypes.CDLL(str(lib))


def patch_gpu_launches(monkeypatch, lib: ctypes.CDLL, launched: Optional[List[str]] = None) -> None:
    """Replace gsplit.ops.cuda's CuPy launches with serial CPU runs of the kernels in ``lib``.

    Two blocks at most, so that every grid-stride loop goes round more than once. Pointers are host
    addresses; an empty tensor passes 0, as gsplit.ops.cuda._ptr does.
    """
    monkeypatch.setattr(gpu, "_function", lambda module, kernel: SerialKernel(lib, kernel, launched))
    monkeypatch.setattr(gpu, "_torch_stream", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(gpu, "_ptr", lambda t: np.uint64(t.data_ptr() if t.numel() else 0))
    monkeypatch.setattr(gpu, "_MAX_BLOCKS", 2)
