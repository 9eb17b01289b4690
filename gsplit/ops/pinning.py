"""Make a host table readable by the GPU: registered where it is, or a pinned copy, or (neither) not at all.

The CUDA kernels read a host table (feature rows, a ``--uva`` graph) through unified virtual addressing, which
needs page-locked ("pinned") memory. :func:`make_host_readable` is the one way gsplit gets it, for features and
graph arrays alike, in this order:

1. **In place** (``cudaHostRegister``), for anonymous and shared memory (an in-memory dataset, the shared-memory
   copy that :func:`gsplit.launch` gives its ranks): no copy, one copy per host. A first 16 MiB is
   registered, timed and undone; when it projects the whole beyond the budget (:class:`PinPolicy`: a few
   seconds per GiB), step 2 runs instead, else the whole range is registered in one call (CUDA copies refuse a
   range that spans two registrations).
2. **A pinned copy** (``cudaHostAlloc``, filled in chunks with progress), when the host has the memory for one
   per rank of the host (:func:`ranks_on_host`).
   A memory-mapped file (a prepared dataset folder) always takes this step: it is never registered in place.
   The NVIDIA driver pins with ``FOLL_LONGTERM`` (``os_lock_user_pages`` in its open kernel modules); for a
   *private* (copy-on-write) file mapping, which ``np.load(mmap_mode="c")`` makes, Linux then breaks
   copy-on-write on every page before pinning it (``gup_must_unshare`` in ``mm/internal.h``: a read-only
   long-term pin of a page-cache page in a COW mapping unshares it), i.e. allocates and copies a private page
   per 4 KiB, one fault at a time, inside one uninterruptible driver call; for a *shared* file mapping, the
   driver marks every page-cache page dirty when it unpins (``os_unlock_user_pages``), so the dataset's files
   would be written back. A copy costs the same memory as the unshared pages and takes a fraction of a second
   per GiB.
3. **Not at all**: the CPU gathers the rows and copies them (the feature store's ``host-gather`` mode, a graph
   sampled on the CPU), with one WARNING line saying why.

Every registration and copy is undone when the tensor's storage dies. ``GSPLIT_PIN`` picks the strategy
(``auto``, ``register``, ``copy``, ``off``) and ``GSPLIT_PIN_SECONDS_PER_GIB`` / ``GSPLIT_PIN_MIN_SECONDS`` the
budget (:meth:`PinPolicy.from_env`). Needs CuPy (callers check :func:`gsplit.ops.cuda.cupy_available` first).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import time
import weakref
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from gsplit.runtime.resources import available_memory
from gsplit.runtime.timing import SetupStep, timed_step

log = logging.getLogger(__name__)

GIB = float(1 << 30)
_REGISTER_PORTABLE, _REGISTER_MAPPED, _REGISTER_READ_ONLY = 1, 2, 8
"""``cudaHostRegister`` flags; read-only needs CUDA >= 11.1 and ``cudaDevAttrHostRegisterReadOnlySupported``."""
_ALLOC_PORTABLE, _ALLOC_MAPPED = 1, 2
"""``cudaHostAlloc`` flags."""
MODES = ("auto", "register", "copy", "off")


@dataclass(frozen=True)
class PinPolicy:
    """How hard :func:`make_host_readable` tries, and how long registering in place may take."""

    mode: str = "auto"
    """``auto``: in place for anonymous / shared memory, else (or when that is slow or refused) a pinned copy;
    ``register``: in place only; ``copy``: always a pinned copy; ``off``: never (the CPU gathers)."""
    seconds_per_gib: float = 3.0
    """Registering in place may take this long per GiB (normally it takes well under 0.5 s per GiB)."""
    min_seconds: float = 3.0
    """... and at least this long for any size."""
    first_chunk_bytes: int = 16 << 20
    """The timed first registration is this small, so a slow one is seen early (then undone)."""
    chunk_bytes: int = 256 << 20
    """Every step of a pinned copy is this large."""
    copy_fraction: float = 0.5
    """A pinned copy may take at most this share of the host's available memory (``MemAvailable``)."""

    @classmethod
    def from_env(cls) -> "PinPolicy":
        """The policy set by ``GSPLIT_PIN``, ``GSPLIT_PIN_SECONDS_PER_GIB`` and ``GSPLIT_PIN_MIN_SECONDS``.

        Example:
            >>> PinPolicy.from_env().mode in MODES
            True
        """
        mode = os.environ.get("GSPLIT_PIN", "auto").strip().lower() or "auto"
        if mode not in MODES:
            raise ValueError(f"GSPLIT_PIN={mode!r}; set it to one of {', '.join(MODES)} (or leave it unset)")
        return cls(mode=mode, seconds_per_gib=_env_float("GSPLIT_PIN_SECONDS_PER_GIB", cls.seconds_per_gib),
                   min_seconds=_env_float("GSPLIT_PIN_MIN_SECONDS", cls.min_seconds))

    def budget(self, nbytes: int) -> float:
        """Seconds that registering ``nbytes`` in place may take.

        Example:
            >>> PinPolicy().budget(4 << 30)
            12.0
        """
        return max(self.min_seconds, self.seconds_per_gib * nbytes / GIB)


def _env_float(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds; set a number such as 3 or unset it") from None
    if not value >= 0:
        raise ValueError(f"{name}={text!r} is negative; set a number of seconds >= 0 or unset it")
    return value


# ---------------------------------------------------------------------------------------- what backs a range
@dataclass(frozen=True)
class Backing:
    """What memory backs an address range, from ``/proc/self/maps``."""

    kind: str
    """``anonymous`` (heap, ``malloc``), ``shared-memory`` (``/dev/shm``, memfd, shared anonymous), ``file``
    (a memory-mapped file) or ``unknown`` (no ``/proc``, or the range is not mapped)."""
    path: str = ""
    """The mapped file, for ``file``."""
    private: bool = False
    """A private (copy-on-write) mapping, for ``file``."""


def backing(ptr: int, nbytes: int) -> Backing:
    """What backs ``[ptr, ptr + nbytes)``: a file if any part of it is a mapped file, else the first mapping's kind.

    Example:
        >>> t = torch.zeros(1 << 20)
        >>> backing(t.data_ptr(), 4 << 20).kind in ("anonymous", "unknown")
        True
    """
    end = ptr + max(1, nbytes)
    found: Optional[Backing] = None
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if hi <= ptr or lo >= end:
                    continue
                path = fields[5].strip() if len(fields) > 5 else ""
                shared = fields[1][3:4] == "s"
                if path.startswith("/dev/shm/") or path.startswith("/memfd:") or path.startswith("/SYSV") \
                        or (shared and (not path or path.startswith("/dev/zero"))):
                    kind = Backing("shared-memory", path)
                elif path.startswith("/"):
                    return Backing("file", path.removesuffix(" (deleted)"), private=not shared)
                else:
                    kind = Backing("anonymous", path)
                found = found or kind
    except OSError:
        return Backing("unknown")
    return found or Backing("unknown")


# ---------------------------------------------------------------------------------------- CUDA calls
def _runtime():
    import cupy

    return cupy.cuda.runtime


def device_pointer(t: torch.Tensor) -> Optional[int]:
    """The GPU-side address of host tensor ``t`` (pinned, mapped), or None when the GPU cannot read it."""
    rt = _runtime()
    try:
        ptr = rt.pointerGetAttributes(t.data_ptr()).devicePointer
    except rt.CUDARuntimeError:
        return None
    return ptr or None


def _unregister(ptr: int) -> None:
    try:
        _runtime().hostUnregister(ptr)
    except Exception:  # noqa: BLE001 - at interpreter exit CUDA may already be gone; nothing to undo then
        pass


def _free_host(ptr: int) -> None:
    try:
        _runtime().freeHost(ptr)
    except Exception:  # noqa: BLE001 - as _unregister
        pass


def _probe_bytes(ptr: int, nbytes: int, policy: PinPolicy) -> int:
    """Bytes of the timed first registration: ``first_chunk_bytes`` rounded up to a page boundary, or all."""
    page = mmap.PAGESIZE
    stop = -(-(ptr + max(policy.first_chunk_bytes, page)) // page) * page
    return min(nbytes, stop - ptr)


# ---------------------------------------------------------------------------------------- the strategies
def register_in_place(t: torch.Tensor, policy: Optional[PinPolicy] = None, step: Optional[SetupStep] = None,
                      where: Optional[Backing] = None) -> Tuple[bool, str]:
    """Page-lock ``t`` where it is (``cudaHostRegister``, mapped, read-only where supported), as ONE range.

    A first small registration (``policy.first_chunk_bytes``) is timed and undone; when it projects the whole
    within ``policy.budget``, the whole range is registered in one call. One call, not pieces: CUDA copies
    (``t.to("cuda")``, ``copy_``) refuse a host range that spans two registrations (``cudaErrorInvalidValue``,
    seen on an H100 when a graph pinned for ``--uva`` was later copied to the GPU), while the kernels would
    read pieces fine. Returns ``(True, "")``, or ``(False, why)`` with nothing left registered: ``t`` is a
    memory-mapped file (never registered, see the module's docstring), a registration was refused, the timed
    first one projects the whole beyond the budget, or CUDA gives the range no device-side address. The
    registration is undone when ``t``'s storage dies. ``where``: what backs ``t``, when the caller has read it
    (:func:`backing`).
    """
    policy = policy or PinPolicy.from_env()
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return True, ""
    ptr = t.data_ptr()
    where = where or backing(ptr, nbytes)
    if where.kind == "file":
        return False, (f"it is a {'private (copy-on-write)' if where.private else 'shared'} mapping of the file "
                       f"{where.path}, which is never registered in place")
    rt = _runtime()
    budget = policy.budget(nbytes)
    flags = None
    probe = _probe_bytes(ptr, nbytes, policy)
    if probe < nbytes:
        t0 = time.monotonic()
        try:
            flags = _register(rt, ptr, probe, None)
        except rt.CUDARuntimeError as exc:
            return False, f"cudaHostRegister refused it ({exc})"
        elapsed = time.monotonic() - t0
        _unregister(ptr)
        projected = elapsed * nbytes / probe
        if projected > budget:
            return False, (f"registering it in place would take about {projected:.0f} s ({elapsed:.2f} s for the "
                           f"first {probe / GIB:.3f} GiB), over its budget of {budget:.0f} s "
                           "(GSPLIT_PIN_SECONDS_PER_GIB)")
    try:
        _register(rt, ptr, nbytes, flags)
    except rt.CUDARuntimeError as exc:
        return False, f"cudaHostRegister refused it ({exc})"
    if step is not None:
        step.update(nbytes, nbytes)
    if device_pointer(t) is None:
        _unregister(ptr)
        return False, "CUDA gives the registered range no device-side address"
    weakref.finalize(t.untyped_storage(), _unregister, ptr)  # the storage, not this view, owns the memory
    return True, ""


def _register(rt, ptr: int, nbytes: int, flags: Optional[int]) -> int:
    """Register one range with ``flags``, or (``None``) read-only, else writable; returns the flags used."""
    if flags is not None:
        rt.hostRegister(ptr, nbytes, flags)
        return flags
    base = _REGISTER_PORTABLE | _REGISTER_MAPPED
    try:
        # gsplit only reads pinned tables: a read-only registration never writes a page
        rt.hostRegister(ptr, nbytes, base | _REGISTER_READ_ONLY)
        return base | _REGISTER_READ_ONLY
    except rt.CUDARuntimeError:
        rt.hostRegister(ptr, nbytes, base)  # anonymous or shared memory: writable pinning copies nothing
        return base


def ranks_on_host() -> int:
    """Ranks of this job on this host, each of which may make its own pinned copy at the same time:
    ``LOCAL_WORLD_SIZE`` (torchrun), else ``WORLD_SIZE`` in a rank that :func:`gsplit.launch` started (one host),
    else 1.

    Example:
        >>> ranks_on_host() >= 1
        True
    """
    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE" if "LOCAL_RANK" in os.environ else ""):
        try:
            if name and int(os.environ.get(name, "0")) > 0:
                return int(os.environ[name])
        except ValueError:
            pass  # not a number: not set by a launcher
    return 1


def pinned_copy(t: torch.Tensor, policy: Optional[PinPolicy] = None,
                step: Optional[SetupStep] = None) -> Tuple[Optional[torch.Tensor], str]:
    """A copy of ``t`` in pinned, mapped host memory (``cudaHostAlloc``), filled in chunks; ``(None, why)`` when
    the host lacks the memory or CUDA refuses. Exact size (torch's pinned allocator would round up to a power
    of two and keep the memory after use); freed when the copy's storage dies."""
    policy = policy or PinPolicy.from_env()
    nbytes = t.numel() * t.element_size()
    available, ranks = available_memory(), ranks_on_host()
    if nbytes * ranks > policy.copy_fraction * available:
        each = f", for each of the host's {ranks} ranks," if ranks > 1 else ""
        return None, (f"a pinned copy needs {nbytes / GIB:.2f} GiB{each} and the host has {available / GIB:.2f} GiB "
                      f"available (the copies may take {policy.copy_fraction:.0%} of it)")
    rt = _runtime()
    try:
        ptr = rt.hostAlloc(nbytes, _ALLOC_PORTABLE | _ALLOC_MAPPED)
    except rt.CUDARuntimeError as exc:
        return None, f"cudaHostAlloc refused {nbytes / GIB:.2f} GiB ({exc})"
    raw = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)
    weakref.finalize(raw.untyped_storage(), _free_host, ptr)
    copy = raw.view(t.dtype).view(t.shape)
    src, dst = t.contiguous().reshape(-1), copy.reshape(-1)
    per_chunk = max(1, policy.chunk_bytes // max(1, t.element_size()))
    for start in range(0, src.numel(), per_chunk):
        dst[start:start + per_chunk].copy_(src[start:start + per_chunk])
        if step is not None:
            step.update(min(src.numel(), start + per_chunk) * t.element_size(), nbytes)
    if device_pointer(copy) is None:
        return None, "CUDA gives the pinned copy no device-side address"
    return copy, ""


@dataclass
class HostReadable:
    """What :func:`make_host_readable` did with a host table."""

    tensor: Optional[torch.Tensor]
    """The tensor the GPU reads, with the table's rows: the table itself (registered in place or already
    pinned) or a pinned copy; ``None``: the GPU cannot read it (the CPU gathers)."""
    how: str
    """``pinned`` (it already was), ``registered`` (in place), ``copied``, ``empty`` or ``host-gather``."""
    seconds: float
    """Time it took."""
    reason: str = ""
    """Why it was not registered in place (``copied``) or not made readable at all (``host-gather``)."""


def make_host_readable(t: torch.Tensor, what: str) -> HostReadable:
    """Make host table ``t`` readable by the GPU: in place, else a pinned copy, else not (see the module docs).

    Logs the step's time at INFO, progress while it runs long, and ONE WARNING line when it falls back from a
    registration that was slow or refused, or to the CPU gather. Needs CuPy.

    Example:
        >>> r = make_host_readable(feats, "host feature table")              # doctest: +SKIP
        >>> r.how, r.tensor.is_pinned()                                       # doctest: +SKIP
        ('copied', True)
    """
    policy = PinPolicy.from_env()
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return HostReadable(t, "empty", 0.0)
    if t.is_pinned() and device_pointer(t) is not None:
        return HostReadable(t, "pinned", 0.0)
    size = f"{nbytes / GIB:.2f} GiB"
    reasons = []
    with timed_step(f"making the {size} {what} readable by the GPU", logger=log) as step:
        where = backing(t.data_ptr(), nbytes)
        if policy.mode == "off":
            reasons.append("GSPLIT_PIN=off")
        elif policy.mode == "copy":
            reasons.append("GSPLIT_PIN=copy")
        elif where.kind == "file" and policy.mode == "auto":
            reasons.append(f"it is a memory-mapped file ({where.path}), which is never registered in place")
        else:
            ok, why = register_in_place(t, policy, step, where)
            if ok:
                step.note = "registered in place"
                return HostReadable(t, "registered", step.seconds)
            reasons.append(why)
        expected = policy.mode == "copy" or where.kind == "file"
        if policy.mode in ("auto", "copy"):
            copy, why = pinned_copy(t, policy, step)
            if copy is not None:
                step.note = f"a pinned copy: {reasons[0]}"
                if not expected:
                    log.warning("the %s %s is not pinned in place (%s); the GPU reads a pinned copy instead "
                                "(%s more host memory)", size, what, reasons[0], size)
                return HostReadable(copy, "copied", step.seconds, reasons[0])
            reasons.append(why)
        step.note = "not readable by the GPU"
    log.warning("the %s %s is not readable by the GPU (%s); the CPU gathers what is needed and copies it, "
                "which is slower", size, what, "; ".join(reasons))
    return HostReadable(None, "host-gather", step.seconds, "; ".join(reasons))
