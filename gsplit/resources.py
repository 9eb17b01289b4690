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
