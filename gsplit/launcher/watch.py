"""Watching the ranks of a launch: heartbeats, progress reports, the parent-death watch and stop signals.

Each rank writes a few slots of one shared array (:class:`_RankWatch`): its heartbeat (from a daemon
thread that also ends the rank when the launching process is gone), its last :func:`report_progress`
and whether it waits for its peers. The launcher reads them (:class:`_Watchdog`) to stop a frozen rank
or a job that stopped making progress, naming the rank that hangs rather than the ones waiting for it.
SIGTERM/SIGHUP to the launching process become :class:`~gsplit.launcher.failures.LaunchInterrupted`
while ranks run (:func:`_stop_on_signals`), so that the launcher stops them before it exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from gsplit.comm import waits
from gsplit.launcher.failures import LaunchInterrupted, RankFailure

log = logging.getLogger(__name__)


# How often a rank's watchdog thread checks that the launching process is still there.
_WATCHDOG_INTERVAL_S = 0.5
# How often the launcher checks the ranks' heartbeats and progress.
_POLL_S = 0.5
# Per-rank slots of the shared watch array: heartbeat time, last progress time, progress count, and
# whether the rank waited for its peers at the last heartbeat (see _waits_for_peers).
_HEARTBEAT, _PROGRESS_T, _PROGRESS_N, _IN_COLLECTIVE = range(4)
_SLOTS = 4
_DIST_DIR = os.path.join("torch", "distributed") + os.sep

# Signals that stop a launch cleanly (what `kill`, `timeout`, Slurm and a closing terminal send); SIGINT
# needs no handler: it reaches every rank of the foreground process group and Python raises KeyboardInterrupt.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


@dataclass
class _RankWatch:
    """What a launched rank writes for the launcher's watchdog: its slots of the shared array."""

    slots: Any
    """The launch's shared ``double`` array (``multiprocessing`` RawArray), ``_SLOTS`` entries per rank."""
    rank: int
    """This process's rank."""

    def set(self, slot: int, value: float) -> None:
        self.slots[self.rank * _SLOTS + slot] = value

    def get(self, slot: int) -> float:
        return self.slots[self.rank * _SLOTS + slot]


# Set once in each rank's process by _child_main (None elsewhere): report_progress() is called from
# deep inside training loops that should not have to carry the launcher's shared memory around.
_WATCH: Optional[_RankWatch] = None


def _watch_rank(slots, rank: int) -> _RankWatch:
    """This process is rank ``rank`` of a launch: its slots of ``slots`` are what :func:`report_progress` writes."""
    global _WATCH
    _WATCH = _RankWatch(slots, rank)
    return _WATCH


def report_progress(iteration: Optional[int] = None) -> None:
    """Tell the launcher that this rank made progress; call it once per training iteration.

    The launcher's progress watchdog (``launch(progress_timeout=...)``) stops a job whose ranks stopped
    making progress and names the rank whose last report is oldest (the one that hung, while the others
    wait for it in a collective). ``iteration`` is the number to show in that message (default: the
    count of reports so far). Costs two stores to shared memory; a no-op outside a launched rank, so
    library code can call it unconditionally.

    Example:
        >>> report_progress()  # in the launching process itself: nothing to report to
    """
    watch = _WATCH
    if watch is None:
        return
    watch.set(_PROGRESS_N, watch.get(_PROGRESS_N) + 1 if iteration is None else float(iteration))
    watch.set(_PROGRESS_T, time.monotonic())


def _in_collective(thread_id: int) -> bool:
    """Whether thread ``thread_id`` currently runs Python code of ``torch.distributed`` (e.g. a store wait
    while groups are created): the fallback for blocking calls that go through no ``Work.wait()``."""
    frame = sys._current_frames().get(thread_id)
    return frame is not None and _DIST_DIR in frame.f_code.co_filename


def _waits_for_peers(thread_id: int) -> bool:
    """Whether this rank, with its training thread ``thread_id`` where it is, waits for other ranks.

    The blocking points say so themselves (:mod:`gsplit.comm.waits`): a collective or ``Work.wait()``
    in that thread or in the thread it waits on (the prefetch queue), or a collective still in flight
    (NCCL returns at once; the host then blocks in ``.tolist()``, ``.cpu()``, ``synchronize``).
    """
    return waits.waits_for_peers(thread_id) or _in_collective(thread_id)


def _killed_with_parent() -> None:
    """Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill this process the moment its parent
    dies, also by SIGKILL, which no handler in the parent can catch. Elsewhere it does nothing."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
                log.debug("prctl(PR_SET_PDEATHSIG) failed with errno %d", ctypes.get_errno())
        except (OSError, AttributeError) as e:  # no libc symbol: the caller's other means still work
            log.debug("prctl unavailable (%s)", e)


def _die_with_parent(parent_pid: int, watch: Optional[_RankWatch]) -> None:
    """Make sure this rank ends when the launching process does, however that one ends.

    Linux: :func:`_killed_with_parent`. Elsewhere (and as a second line on Linux) a daemon thread polls the
    parent pid: once the process is re-parented, the launcher is gone.
    """
    _killed_with_parent()
    # The parent may have died before prctl took effect: then nobody would ever send the signal.
    if os.getppid() != parent_pid:
        os._exit(1)

    main_id = threading.main_thread().ident

    def watch_parent() -> None:
        # Also the rank's heartbeat: a live thread proves the process runs and gets the GIL, and it notes
        # whether the main thread waits in a collective (tells a rank that hangs from ranks waiting for it).
        while os.getppid() == parent_pid:
            if watch is not None:
                watch.set(_IN_COLLECTIVE, float(_waits_for_peers(main_id)))
                watch.set(_HEARTBEAT, time.monotonic())
            time.sleep(_WATCHDOG_INTERVAL_S)
        sys.stderr.write(f"gsplit rank (pid {os.getpid()}): the launching process {parent_pid} is gone; exiting\n")
        sys.stderr.flush()
        os._exit(1)

    threading.Thread(target=watch_parent, name="gsplit-watchdog", daemon=True).start()


@contextlib.contextmanager
def _stop_on_signals():
    """Turn SIGTERM/SIGHUP into :class:`LaunchInterrupted` while ranks run, so ``launch``'s cleanup stops them.

    Only the main thread can install handlers; elsewhere the signals keep their default action (the
    process dies and the ranks follow it through their parent-death watch). A second signal during the
    cleanup is ignored so the cleanup itself is not cut short.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: List[int] = []

    def handler(signum, frame):
        if not received:
            received.append(signum)
            raise LaunchInterrupted(signum)
        log.warning("received %s again while stopping the ranks; still stopping", signal.Signals(signum).name)

    previous = {}
    for s in _STOP_SIGNALS:
        try:
            previous[s] = signal.signal(s, handler)
        except (ValueError, OSError):  # e.g. an embedded interpreter that forbids it
            pass
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class _Watchdog:
    """The launcher's view of the ranks' heartbeats and progress reports (the shared watch array)."""

    def __init__(self, slots, nprocs: int, heartbeat_timeout: float, progress_timeout: float):
        self.slots, self.nprocs = slots, nprocs
        self.heartbeat_timeout, self.progress_timeout = heartbeat_timeout, progress_timeout
        self.start = time.monotonic()

    def get(self, rank: int, slot: int) -> float:
        return self.slots[rank * _SLOTS + slot]

    def progress(self, rank: int):
        """``(reports, seconds since the last one, waiting in a collective)``; the launch start counts as a report."""
        n, t = self.get(rank, _PROGRESS_N), self.get(rank, _PROGRESS_T)
        return int(n), time.monotonic() - (t or self.start), bool(self.get(rank, _IN_COLLECTIVE))

    def suspect(self, ranks: Sequence[int]) -> int:
        """The rank most likely to hold the others up: not in a collective, fewest reports, oldest report."""
        def key(r):
            n, age, waiting = self.progress(r)
            return (waiting, n, -age)
        return min(ranks, key=key)

    def describe_progress(self, rank: int) -> str:
        n, age, _ = self.progress(rank)
        return f"last at iteration {n}" if n else "none reported yet"

    def check(self, running: Sequence[int]) -> Optional[RankFailure]:
        """A failure for a frozen rank or a job that stopped making progress, else None."""
        now = time.monotonic()
        if self.heartbeat_timeout:
            for r in running:
                beat = self.get(r, _HEARTBEAT)
                if beat and now - beat > self.heartbeat_timeout:  # 0: still starting up
                    return RankFailure(r, None, None, f"stopped responding: no heartbeat for {now - beat:.0f} s "
                                       f"(the process is frozen: stopped, swapping, or in native code that holds "
                                       f"the GIL)", "", time.time(), False)
        armed = any(self.get(r, _PROGRESS_N) for r in range(self.nprocs))  # fn reports progress at all
        if not (self.progress_timeout and armed and running):
            return None
        r = self.suspect(running)
        n, age, waiting = self.progress(r)
        waiting_others = [o for o in running if o != r and self.progress(o)[2]]
        # A hang is one rank outside any collective while others wait in one for it. All ranks computing
        # (a long evaluation) or all in collectives (left to the backend's timeout) is not called a hang.
        if age <= self.progress_timeout or waiting or not waiting_others:
            return None
        text = (f"made no progress for {age:.0f} s ({self.describe_progress(r)}; progress_timeout "
                f"{self.progress_timeout:g} s); rank{'s' if len(waiting_others) > 1 else ''} "
                f"{', '.join(map(str, waiting_others))} {'are' if len(waiting_others) > 1 else 'is'} waiting "
                f"in a collective (" + ", ".join(f"rank {o} {self.describe_progress(o)}" for o in waiting_others) + ")")
        return RankFailure(r, None, None, text, "", time.time(), False)

    def blame_hang(self, failures: List[RankFailure], running: Sequence[int]) -> Optional[RankFailure]:
        """When ranks only timed out in collectives, the still-running rank they waited for is the root cause."""
        if not failures or not running or not all(f.communication for f in failures):
            return None
        r = self.suspect(running)
        n, age, waiting = self.progress(r)
        failed = ", ".join(str(f.rank) for f in failures)
        return RankFailure(r, None, None,
                           f"hung: rank{'s' if len(failures) > 1 else ''} {failed} failed in a collective "
                           f"waiting for it while it was still running ({'in a collective too' if waiting else 'not in a collective'}"
                           f"; progress {self.describe_progress(r)}, {age:.0f} s ago)", "", time.time(), False)
