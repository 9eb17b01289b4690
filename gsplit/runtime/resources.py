"""Host memory checks: refuse, before allocating, work whose estimated peak exceeds the memory available.

A graph of hundreds of millions of edges that does not fit fails late and badly (the kernel's OOM killer,
or swap for an hour). The generators and ``prepare`` estimate their peak from their own data structures
(measured by ``experiments/scale.py``) and call :func:`require_memory` first, which raises
:class:`InsufficientMemoryError` (a ``ValueError``: the CLI prints it as one ``gsplit: error:`` line and
exits 2) saying how much is needed and how much is available.
"""

from __future__ import annotations

import os
from typing import Optional

GIB = 1 << 30


class InsufficientMemoryError(ValueError):
    """The estimated peak memory of a piece of work exceeds the host memory available now."""


def process_status_kb(field: str) -> int:
    """A ``kB`` field of this process's ``/proc/self/status`` (``VmRSS``, ``VmHWM``), or -1 where it cannot be
    read (not Linux).

    Example:
        >>> process_status_kb("VmRSS") != 0
        True
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def peak_rss_bytes() -> Optional[int]:
    """This process's peak resident set size (``VmHWM`` of ``/proc/self/status``), or None off Linux.

    Example:
        >>> (peak_rss_bytes() or 1) > 0
        True
    """
    kb = process_status_kb("VmHWM")
    return None if kb < 0 else kb * 1024


def minor_page_faults() -> Optional[int]:
    """Minor page faults of this process so far (pages the kernel had to map in: first touches of fresh memory),
    or None where ``resource`` is missing. A fresh training rank faults its heap in over its first iterations
    (GAT on 1M vertices: ~40k pages an iteration, ~10 us each on a VM); the trainer logs the count per iteration.

    Example:
        >>> (minor_page_faults() or 0) >= 0
        True
    """
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's threads plus its waited-for children (e.g. the forked
    METIS process, whose time ``time.process_time()`` leaves out).

    Example:
        >>> cpu_seconds() > 0
        True
    """
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def available_memory() -> int:
    """Bytes of host memory available to a new allocation without swapping (``MemAvailable``).

    Example:
        >>> available_memory() > 0
        True
    """
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    # not Linux: free physical pages, which undercounts (page cache is reclaimable) and so errs on the safe side
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def require_memory(needed_bytes: int, what: str, hint: str = "") -> None:
    """Raise :class:`InsufficientMemoryError` when ``needed_bytes`` exceed :func:`available_memory`.

    Set ``GSPLIT_SKIP_MEMORY_CHECK=1`` to go ahead anyway (e.g. when the estimate is known to be pessimistic
    for an input, or swap is acceptable).

    Example:
        >>> require_memory(1 << 20, "a 1 MiB table")   # fits: returns None
    """
    if os.environ.get("GSPLIT_SKIP_MEMORY_CHECK") == "1":
        return
    available = available_memory()
    if needed_bytes > available:
        raise InsufficientMemoryError(
            f"{what} needs about {needed_bytes / GIB:.1f} GiB of host memory at its peak, but only "
            f"{available / GIB:.1f} GiB is available; {hint + '; ' if hint else ''}free memory, use a larger host, "
            "or set GSPLIT_SKIP_MEMORY_CHECK=1 to try anyway")


def _glibc():
    """The C library when it is glibc (``malloc_trim`` / ``mallopt``), else None (macOS, musl, Windows)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def return_freed_heap() -> None:
    """Give the C heap's freed pages back to the OS (glibc ``malloc_trim``; nothing elsewhere).

    Freed numpy/torch temporaries below glibc's mmap threshold stay resident in this process's heap; a
    process about to fork a large child (METIS) or to run for long (a launcher) should return them first,
    or the fork's pages are held for nothing (measured at 1M vertices: 118 MB freed before METIS's fork).

    Example:
        >>> return_freed_heap()   # returns None; safe to call anywhere, any number of times
    """
    libc = _glibc()
    if libc is not None:  # not glibc: nothing to do
        libc.malloc_trim(0)


def smaps_rollup_kb(pid: int) -> Optional[dict]:
    """The ``kB`` fields of ``/proc/<pid>/smaps_rollup`` (``Rss``, ``Pss``, ``Private_Dirty``, ``Anonymous``...),
    or None where they cannot be read (the process is gone, not Linux, Linux < 4.14).

    Example:
        >>> (smaps_rollup_kb(os.getpid()) or {"Pss": 1})["Pss"] > 0
        True
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = {}
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    fields[parts[0].rstrip(":")] = int(parts[1])
            return fields or None
    except (OSError, ValueError):
        return None


def descendants(pid: int) -> list:
    """Process ids of ``pid``'s children, grandchildren... (``/proc/<pid>/task/*/children``; [] off Linux).

    Example:
        >>> os.getpid() in descendants(os.getppid())   # this process is its parent's child (on Linux)
        True
    """
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                continue
            found.extend(kids)
            todo.extend(kids)
    return found


class HostMemoryMeter:
    """The host memory that this process and its descendants (e.g. the forked METIS process) hold at their
    peak, measured while the meter runs.

    A thread samples, every ``interval_s`` (or, where reading is slow, no more than a fifth of its time),
    the **sum of PSS** over the processes (``/proc/<pid>/smaps_rollup``): a page shared by several of them
    (inherited by a fork, or a file's page cache they all map) is split among them, so counted once in
    the sum. Summing RSS instead would count a forked child's inherited pages twice; this process's
    ``VmHWM`` alone would miss the child. Sampling can miss a peak shorter than the interval, so
    :attr:`peak_bytes` is the larger of the sampled peak and this process's own ``VmHWM`` over the same
    time (both are lower bounds of the memory the host gave these processes). :attr:`children_peak` keeps
    each child's largest PSS and private memory (``Private_Clean + Private_Dirty``: pages only it maps).

    Example:
        >>> with HostMemoryMeter() as meter:
        ...     block = bytearray(64 << 20)
        >>> meter.peak_bytes >= 64 << 20
        True
    """

    def __init__(self, interval_s: float = 0.025):
        import threading

        if interval_s <= 0:
            raise ValueError(f"interval_s={interval_s}; pass a positive sampling interval in seconds")
        self.interval_s = float(interval_s)
        self.sampled_peak_bytes = 0
        """The largest sum of PSS seen (bytes)."""
        self.own_peak_bytes = 0
        """This process's ``VmHWM`` at :meth:`stop` (bytes; its peak since it started, or since the last
        reset of the high-water mark)."""
        self.children_peak: dict = {}
        """Per child pid: ``{"pss": bytes, "private": bytes}``, each the largest sampled."""
        self.samples = 0
        """How many times the processes were sampled."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gsplit-host-memory", daemon=True)

    @property
    def peak_bytes(self) -> int:
        """The host's peak for these processes: the larger of the sampled PSS sum and this process's VmHWM."""
        return max(self.sampled_peak_bytes, self.own_peak_bytes)

    def sample(self) -> int:
        """Sample once now; returns the sum of PSS in bytes (0 where nothing could be read)."""
        me = os.getpid()
        total = 0
        for pid in [me] + descendants(me):
            fields = smaps_rollup_kb(pid)
            if fields is None:
                continue
            pss = fields.get("Pss", 0) * 1024
            total += pss
            if pid != me:
                private = (fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)) * 1024
                peak = self.children_peak.setdefault(pid, {"pss": 0, "private": 0})
                peak["pss"], peak["private"] = max(peak["pss"], pss), max(peak["private"], private)
        self.samples += 1
        self.sampled_peak_bytes = max(self.sampled_peak_bytes, total)
        return total

    def _run(self) -> None:
        import time

        while True:
            t = time.perf_counter()
            self.sample()
            spent = time.perf_counter() - t
            if self._stop.wait(max(self.interval_s, 4 * spent)):
                return

    def start(self) -> "HostMemoryMeter":
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop sampling (one last sample first); returns :attr:`peak_bytes`."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
        self.sample()
        self.own_peak_bytes = max(self.own_peak_bytes, peak_rss_bytes() or 0)
        return self.peak_bytes

    def __enter__(self) -> "HostMemoryMeter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP_BYTES = 2**31 - 1  # mallopt takes an int: the largest value it accepts


def keep_freed_heap() -> bool:
    """Let this process reuse the pages of freed large temporaries instead of returning them to the OS.

    glibc serves every allocation above its mmap threshold (at most 32 MB, usually far less) with a fresh
    ``mmap`` and unmaps it when freed, so each training step's large temporaries (a layer's source rows,
    gradients, shuffle buffers: tens of MB each) fault in every page again: measured here, a
    ``torch.zeros(26000, 256)`` plus a 41 MB buffer took 32 ms per step by default and 7.6 ms with the heap
    kept. A CPU training rank reuses the same sizes every iteration, so its heap stays at the step's
    working set (its peak does not grow; it is not returned between steps). Called by
    :func:`gsplit.launch` for CPU ranks and by ``gsplit train`` on a CPU; ``GSPLIT_KEEP_HEAP=0`` leaves
    glibc's defaults. Returns whether the setting was applied (False elsewhere than glibc).

    Example:
        >>> keep_freed_heap() in (True, False)
        True
    """
    if os.environ.get("GSPLIT_KEEP_HEAP", "1") == "0":
        return False
    libc = _glibc()
    if libc is None:  # not glibc: its allocator's defaults stand
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES))


def keep_freed_heap_env() -> dict:
    """The environment variables that give a child process :func:`keep_freed_heap`'s setting from its start
    (glibc reads them at its first allocation): for a program that does not call it, such as a peer framework
    in a benchmark run with the same allocator setting as gsplit's ranks.

    Example:
        >>> sorted(keep_freed_heap_env())
        ['MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_']
    """
    return {"MALLOC_MMAP_THRESHOLD_": str(_KEEP_BYTES), "MALLOC_TRIM_THRESHOLD_": str(_KEEP_BYTES)}
