"""The CUDA kernels in ``kernels/``, run through CuPy: whether they work here, loading and launching them,
page-locked host memory they read, relabelling and the feature gather. The sampler on a graph is
:mod:`gsplit.ops.sample_cuda` (this module knows no :class:`~gsplit.data.graph.Graph`, so that the graph's
``pin_memory`` may use it).

The kernels pick exactly the edges the torch sampler picks (same counter-based arithmetic, see
:mod:`gsplit.ops.counter_rng`), so a rank may sample on its GPU and still reproduce the
single-process mini-batch. CuPy only compiles (NVRTC, once per process and device) and launches
them: every buffer is a torch tensor, handed over as a raw device pointer and used on torch's current
stream, so nothing is copied and torch's caching allocator stays in charge of memory.

Callers do not import this module: they call :mod:`gsplit.ops`, which decides per call whether these
kernels apply (CUDA inputs, CuPy present) or the plain-torch versions in :mod:`gsplit.ops.torch_ops` run.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.resources
import logging
import time
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from gsplit.ops import pinning

log = logging.getLogger(__name__)

_BLOCK = 256
"""Threads per block; a multiple of 32 because ``gsplit_sample_all`` gives each vertex one warp."""
_MAX_BLOCKS = 1 << 16
"""Grid-size cap; the kernels loop with a grid stride over whatever is left."""


# ---------------------------------------------------------------------------------------- loading
_PROBE = r"""extern "C" __global__ void gsplit_probe(long long* out) { out[threadIdx.x] = threadIdx.x + 1; }"""


@functools.lru_cache(maxsize=None)
def cupy_available() -> bool:
    """True when CuPy can compile AND launch a kernel on this machine (checked once per process).

    Counting devices is not enough: CuPy may import while NVRTC cannot load, and the first real launch
    would then crash instead of falling back. So the probe compiles and runs a 4-thread kernel and
    checks its output. A machine with CUDA on which the probe fails logs a WARNING (the GPU path then
    runs plain torch); one without CUDA logs at DEBUG.

    Example:
        >>> isinstance(cupy_available(), bool)
        True
    """
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
        out = cupy.zeros(4, dtype=cupy.int64)
        cupy.RawKernel(_PROBE, "gsplit_probe")((1,), (4,), (out,))
        if out.get().tolist() != [1, 2, 3, 4]:
            raise RuntimeError(f"the probe kernel wrote {out.get().tolist()}, expected [1, 2, 3, 4]")
        return True
    except Exception as exc:  # noqa: BLE001 - ImportError, NVRTC, driver: all mean "no CuPy kernels"
        level = logging.WARNING if torch.cuda.is_available() else logging.DEBUG
        log.log(level, "CuPy kernels unavailable (%s: %s); the GPU path runs plain torch. %s", type(exc).__name__,
                exc, cupy_install_hint(torch.version.cuda, driver_cuda_version(), installed_cupy()))
        return False


_CUPY_FOR_CUDA = {12: ("gpu-cuda12", "cupy-cuda12x", 525), 13: ("gpu-cuda13", "cupy-cuda13x", 580)}
"""CUDA major -> (gsplit extra, CuPy package, oldest NVIDIA driver for that major)."""


def cupy_install_hint(torch_cuda: Optional[str], driver_cuda: Optional[int], installed: Sequence[str]) -> str:
    """What to install so CuPy matches this machine: CuPy's CUDA major must be torch's (``torch.version.cuda``)
    and the driver must support it (``driver_cuda``: ``cudaDriverGetVersion``, e.g. 12040; None if unknown).

    Example:
        >>> cupy_install_hint("12.4", 12040, ["cupy-cuda13x"])  # doctest: +ELLIPSIS
        'torch here is built for CUDA 12.4 ... pip uninstall cupy-cuda13x && pip install "cupy-cuda12x>=13" ...'
    """
    if not torch_cuda:
        return ("torch here has no CUDA build: install a CUDA build of torch first, then the CuPy of its CUDA "
                "(cupy-cuda12x or cupy-cuda13x: gsplit's gpu-cuda12 / gpu-cuda13 extras)")
    major = int(str(torch_cuda).split(".")[0])
    driver = f"the driver supports CUDA {driver_cuda // 1000}.{driver_cuda % 1000 // 10}" if driver_cuda else \
        "the driver's CUDA version is unknown"
    if major not in _CUPY_FOR_CUDA:
        return (f"torch here is built for CUDA {torch_cuda} ({driver}); install the CuPy package for CUDA {major} "
                f"(see CuPy's installation guide)")
    extra, package, min_driver = _CUPY_FOR_CUDA[major]
    wrong = [p for p in installed if p != package]
    hint = f"torch here is built for CUDA {torch_cuda} ({driver}), so CuPy must be {package}: "
    hint += (f"pip uninstall {' '.join(wrong)} && " if wrong else "") + f'pip install "{package}>=13"'
    hint += f" (needs NVIDIA driver {min_driver} or newer and CUDA {major}'s NVRTC, e.g. a CUDA {major} toolkit)"
    if driver_cuda and driver_cuda // 1000 < major:
        hint += (f"; this driver is too old for CUDA {major}: upgrade it to {min_driver}+ or use a torch built for "
                 f"CUDA {driver_cuda // 1000} with that CUDA's CuPy")
    return hint


def driver_cuda_version() -> Optional[int]:
    """The CUDA version the installed driver supports (``cuDriverGetVersion``, e.g. 12040 for 12.4), or None
    without a driver library. Needs no GPU context.

    Example:
        >>> v = driver_cuda_version()
        >>> v is None or v >= 10000
        True
    """
    try:
        import ctypes

        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            return version.value
    except (OSError, AttributeError):
        pass  # no driver library: the hint says the version is unknown
    return None


def installed_cupy() -> List[str]:
    """Names of the CuPy distributions installed (a mismatched one must be uninstalled first).

    Example:
        >>> set(installed_cupy()) <= {"cupy", "cupy-cuda11x", "cupy-cuda12x", "cupy-cuda13x"}
        True
    """
    from importlib import metadata

    names = ("cupy", "cupy-cuda11x", "cupy-cuda12x", "cupy-cuda13x")
    found = []
    for name in names:
        try:
            metadata.version(name)
            found.append(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def kernel_source_path(name: str) -> Path:
    """Path of the kernel source ``name`` (e.g. ``"sample.cu"``) shipped with this copy of gsplit.

    Looks next to the imported package first: ``gsplit/_kernels`` of an installed wheel, then
    ``<repo>/kernels`` of a source tree (also an editable install, whose import hook would otherwise
    name the installed checkout's files when another checkout is imported); then the package data
    ``gsplit._kernels`` wherever importlib finds it.
    """
    here = Path(__file__).resolve().parents[1]
    for path in (here / "_kernels" / name, here.parent / "kernels" / name):
        if path.is_file():
            return path
    try:
        res = importlib.resources.files("gsplit._kernels").joinpath(name)
        if res.is_file():
            return Path(str(res))
    except ModuleNotFoundError:
        pass
    raise FileNotFoundError(
        f"kernel source {name!r} is neither next to gsplit ({here / '_kernels'}, {here.parent / 'kernels'}) nor "
        "in the package gsplit._kernels; reinstall gsplit (the kernel sources ship as package data) or run from "
        "a full source checkout"
    )


def kernel_source(name: str) -> str:
    """Text of the CUDA source ``name`` (e.g. ``"sample.cu"``) shipped with gsplit.

    Example:
        >>> "gsplit_sample_fill" in kernel_source("sample.cu")
        True
    """
    return kernel_source_path(name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def _module(name: str):
    """The CuPy RawModule of one source file; CuPy compiles it lazily per device and caches the binary."""
    import cupy

    return cupy.RawModule(code=kernel_source(name), options=("-std=c++17",))


def _function(module: str, kernel: str):
    """The kernel loaded on CuPy's current device (inside :func:`_torch_stream`: the kernel's device)."""
    import cupy

    return _function_on(module, kernel, cupy.cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _function_on(module: str, kernel: str, device_index: int):
    # a loaded function belongs to one device's context: a loader on cuda:1 must not launch cuda:0's
    return _module(module).get_function(kernel)


KERNEL_MODULES = {"sample.cu": "gsplit_sample_all", "relabel.cu": "gsplit_relabel_lookup",
                  "gather.cu": "gsplit_gather_rows_16"}
"""Every CUDA source gsplit launches from, with one of its kernels (loading it compiles the whole file)."""


def compile_kernels(device: torch.device) -> dict:
    """Compile (or load from CuPy's on-disk cache) every gsplit kernel module for ``device`` now; seconds per file.

    The first launch of each file's kernels pays this otherwise, inside the first iteration. NVRTC compiles a
    file once per machine and CuPy keeps the binary in ``CUPY_CACHE_DIR`` (``~/.cupy/kernel_cache``), so a
    second process loads it instead. Needs CuPy (:func:`cupy_available`).

    Example:
        >>> compile_kernels(torch.device("cuda", 0))                # doctest: +SKIP
        {'sample.cu': 0.62, 'relabel.cu': 0.41, 'gather.cu': 0.35}
    """
    seconds = {}
    for name, kernel in KERNEL_MODULES.items():
        t0 = time.perf_counter()
        with _torch_stream(device):
            _function(name, kernel)
        seconds[name] = time.perf_counter() - t0
    return seconds


@contextlib.contextmanager
def _torch_stream(device: torch.device) -> Iterator[None]:
    """Make CuPy launch on ``device`` and on torch's current stream there, so launches and torch ops
    on the same tensors stay ordered without synchronising. Inside, ``device`` is the current device of
    the thread (``cupy.cuda.Device`` sets it), so take kernel arguments (:func:`_ptr`) in here: their
    device check compares with it, and the process's current device may be another GPU."""
    import cupy

    with cupy.cuda.Device(device.index), _cupy_stream(cupy, torch.cuda.current_stream(device), device.index):
        yield


def _cupy_stream(cupy, stream, device_index: int):
    """torch's ``stream`` as a CuPy stream: through the CUDA stream protocol (``Stream.from_external``, CuPy 14+,
    with a torch whose streams have ``__cuda_stream__``), which CuPy 14 asks for: its ``ExternalStream`` warns
    (DeprecationWarning) at every launch. Older CuPy or torch: ``ExternalStream`` on the raw handle."""
    from_external = getattr(getattr(cupy.cuda, "Stream", None), "from_external", None)
    if from_external is not None and hasattr(stream, "__cuda_stream__"):
        return from_external(stream)
    return cupy.cuda.ExternalStream(stream.cuda_stream, device_index)


def _launch(module: str, kernel: str, threads: int, args: tuple) -> None:
    blocks = min(max(1, -(-threads // _BLOCK)), _MAX_BLOCKS)
    _function(module, kernel)((blocks,), (_BLOCK,), args)


def _ptr(t: torch.Tensor) -> np.uint64:
    """Device-side address of a contiguous CUDA or pinned-host tensor, as a kernel argument.

    CuPy passes a numpy scalar by value, so an 8-byte unsigned integer is exactly a pointer argument.
    """
    if t.numel() == 0:
        return np.uint64(0)  # never dereferenced: the kernels read nothing past a zero count
    if t.is_cuda:
        if t.device.index != torch.cuda.current_device():
            raise ValueError(f"a kernel argument is on {t.device} but kernels launch on cuda:{torch.cuda.current_device()}; "
                             "keep the graph, ids and features of one rank on that rank's GPU")
        return np.uint64(t.data_ptr())
    # Pinned host memory is mapped into the GPU's address space (unified virtual addressing); ask
    # CUDA for the device-side address rather than assuming it equals the host one.
    ptr = _device_pointer(t)
    if not ptr:
        raise RuntimeError(
            "a pinned host tensor has no device-side address, so the GPU cannot read it; "
            "move the graph to the GPU with graph.to(device) instead of pinning it"
        )
    return np.uint64(ptr)


# ---------------------------------------------------------------------------------------- relabel
def relabel(dst_nodes: torch.Tensor, src: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`gsplit.ops.torch_ops.relabel` with a GPU hash table: ``src_nodes = dst_nodes ++ sorted(new ids)``.

    Returns ``(src_nodes, src_local)`` with ``src_nodes[src_local] == src``. ``dst_nodes`` must be
    unique and all ids non-negative; both tensors on one GPU, CuPy installed.

    Example:
        >>> relabel(torch.tensor([5, 2], device="cuda"), torch.tensor([9, 2, 7, 9], device="cuda"))  # doctest: +SKIP
        (tensor([5, 2, 7, 9], device='cuda:0'), tensor([3, 1, 2, 3], device='cuda:0'))
    """
    return _relabel_kernel(dst_nodes.to(torch.int64).contiguous(), src.to(torch.int64).contiguous())


def _relabel_kernel(dst_nodes: torch.Tensor, src: torch.Tensor):
    device = dst_nodes.device
    nd, ne = dst_nodes.numel(), src.numel()
    if ne == 0:
        return dst_nodes.clone(), torch.empty(0, dtype=torch.int64, device=device)
    # At most half full: nd + ne bounds the number of distinct keys.
    capacity = max(2, 1 << (2 * (nd + ne) - 1).bit_length())
    mask, shift = capacity - 1, 65 - capacity.bit_length()
    keys = torch.full((capacity,), -1, dtype=torch.int64, device=device)  # all bits set = empty slot
    vals = torch.empty(capacity, dtype=torch.int64, device=device)
    new_ids = torch.empty(ne, dtype=torch.int64, device=device)
    num_new = torch.zeros(1, dtype=torch.int64, device=device)
    with _torch_stream(device):  # the kernel arguments are checked against the launch device: take them inside
        table = (_ptr(keys), _ptr(vals), np.int64(mask), np.int32(shift))
        if nd:
            _launch("relabel.cu", "gsplit_relabel_insert_dst", nd, table + (_ptr(dst_nodes), np.int64(nd)))
        _launch("relabel.cu", "gsplit_relabel_insert_src", ne, (
            _ptr(keys), np.int64(mask), np.int32(shift), _ptr(src), np.int64(ne), _ptr(new_ids), _ptr(num_new)))
    negative = (src.min() < 0) | (dst_nodes.min() < 0) if nd else src.min() < 0
    k, has_negative = torch.stack([num_new[0], negative.to(torch.int64)]).tolist()
    if has_negative:
        raise ValueError("relabel got negative vertex ids; pass global ids in [0, num_nodes)")
    new_sorted = torch.sort(new_ids[:k]).values
    src_local = torch.empty(ne, dtype=torch.int64, device=device)
    with _torch_stream(device):
        if k:
            _launch("relabel.cu", "gsplit_relabel_assign", k, table + (_ptr(new_sorted), np.int64(k), np.int64(nd)))
        _launch("relabel.cu", "gsplit_relabel_lookup", ne, table + (_ptr(src), np.int64(ne), _ptr(src_local)))
    return torch.cat([dst_nodes, new_sorted]), src_local


# ---------------------------------------------------------------------------------------- feature gather
def pin_in_place(t: torch.Tensor, what: str = "host feature tensor") -> bool:
    """Page-lock ``t``'s memory where it is (``cudaHostRegister``) and map it for the GPU; ``False`` if impossible.

    :func:`gsplit.ops.pinning.register_in_place` with the policy of the environment: one range after a timed
    probe, read-only where supported, undone when ``t``'s storage dies, never for a memory-mapped file, given
    up when it would take longer than its budget; a failure is logged as a WARNING with its reason. Callers that
    may use a pinned copy instead call :func:`gsplit.ops.pinning.make_host_readable`. Needs CuPy.
    """
    if t.is_pinned():
        # torch's own pinned memory (cudaHostAlloc), or a range registered here whose storage is still alive (a
        # freed one was unregistered by its finalizer): mapped either way
        return _device_pointer(t) is not None
    ok, why = pinning.register_in_place(t)
    if not ok:
        log.warning("cannot pin the %.2f GiB %s in place (%s); the CPU reads it instead",
                    t.numel() * t.element_size() / 2**30, what, why)
    return ok


_device_pointer = pinning.device_pointer


def _word_size(row_bytes: int, *tensors: torch.Tensor) -> int:
    """Widest word (16, 8, 4 or 1 bytes) that divides the row size and aligns every base address."""
    for width in (16, 8, 4):
        if row_bytes % width == 0 and all(t.numel() == 0 or t.data_ptr() % width == 0 for t in tensors):
            return width
    return 1


def gather_rows(cache: torch.Tensor, host: torch.Tensor, slots: torch.Tensor, ids: torch.Tensor,
                       out: torch.Tensor) -> None:
    """``out[i] = cache[slots[i]] if slots[i] >= 0 else host[ids[i]]`` with the ``kernels/gather.cu`` kernel.

    ``cache`` and ``out`` are on one GPU, ``host`` is pinned host memory (or on that GPU), ``slots`` and
    ``ids`` are int64 on the GPU; every tensor is contiguous with rows of the same shape and dtype, and
    every ``ids[i]`` with ``slots[i] < 0`` is a valid row of ``host`` (the kernel does not check).
    Runs on torch's current stream.
    """
    n = ids.numel()
    if n == 0:
        return
    row_bytes = out.numel() // n * out.element_size()
    if row_bytes == 0:
        return
    width = _word_size(row_bytes, cache, host, out)
    words = row_bytes // width
    with _torch_stream(out.device):
        _launch("gather.cu", f"gsplit_gather_rows_{width}", n * words, (
            _ptr(cache), _ptr(host), _ptr(slots), _ptr(ids), np.int64(n), np.int64(words),
            _ptr(out)))
