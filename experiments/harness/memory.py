"""Resident memory of this process, or of a process and its descendants, sampled by a thread.

Standard library at import time (psutil loads with the first :class:`ProcessTree`): the DGL peers use
:class:`PeakRSS` too. Linux only (``/proc``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Dict, Optional


def proc_status_kb(path: str = "/proc/self/status") -> Dict[str, int]:
    """Every ``kB`` figure of a process's status file (``VmRSS``, ``VmHWM``, ``RssAnon``, ...), in kB."""
    out = {}
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 3 and fields[2] == "kB":
                out[fields[0].rstrip(":")] = int(fields[1])
    return out


def status_kb(field: str) -> int:
    """One figure of this process's ``/proc/self/status`` in kB (``VmRSS``, ``VmHWM``, ...)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def vm_hwm() -> int:
    """This process's peak RSS in bytes (``VmHWM``). Not ``getrusage``'s ``ru_maxrss``: Linux keeps that across
    ``execve``, so a spawned rank would report its launcher's RSS at the moment it was forked."""
    return status_kb("VmHWM") * 1024


class PeakRSS:
    """This process's resident set size, sampled by a thread every ``interval_s``: ``now()``, and the peak since
    ``reset()`` (or since it started); ``stop()`` ends the sampling and returns the peak."""

    def __init__(self, interval_s: float = 0.002):
        self.interval_s = interval_s
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        """Resident bytes now (``/proc/self/statm``)."""
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(self.interval_s)

    def reset(self) -> int:
        """Start a new peak at the resident bytes now; returns them."""
        self.peak = self.now()
        return self.peak

    def stop(self) -> int:
        """Stop sampling; the peak since the last reset, the last reading included."""
        self._stop.set()
        self._thread.join()
        return max(self.peak, self.now())


class ProcessTree:
    """Peak RSS / PSS / USS of a process (default: this one) and its descendants, and the peak of their summed
    PSS (the host's memory without double counting shared pages), sampled every ``interval`` seconds with psutil
    while the ``with`` block runs.

    ``peak[pid]`` holds ``rss``, ``pss``, ``uss`` (bytes), ``cmd`` (its command line, shortened) and ``root``
    (whether it is the watched process); ``peak_host_pss`` the summed peak; ``samples`` how many were taken.
    Processes that end between two samples keep their peaks; the sampling ends when the watched process does.
    """

    def __init__(self, pid: Optional[int] = None, interval: float = 0.5):
        import psutil

        self._psutil = psutil
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak: Dict[int, Dict[str, object]] = {}
        self.peak_host_pss = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        ps = self._psutil
        while not self._stop.is_set():
            try:
                procs = [self.root] + self.root.children(recursive=True)
            except ps.NoSuchProcess:
                return
            total = 0
            for proc in procs:
                try:
                    info = proc.memory_full_info()
                    if proc.pid not in self.peak:
                        self.peak[proc.pid] = {"rss": 0, "pss": 0, "uss": 0, "cmd": " ".join(proc.cmdline())[:200],
                                               "root": proc.pid == self.root.pid}
                except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                    continue
                total += info.pss
                peak = self.peak[proc.pid]
                for k in ("rss", "pss", "uss"):
                    peak[k] = max(peak[k], getattr(info, k))
            self.peak_host_pss = max(self.peak_host_pss, total)
            self.samples += 1
            self._stop.wait(self.interval)

    def start(self) -> "ProcessTree":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> "ProcessTree":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def root_peak(self) -> dict:
        """The watched process's peaks (empty if it was never sampled)."""
        return next((v for v in self.peak.values() if v["root"]), {})
