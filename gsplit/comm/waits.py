"""What this process is waiting for: other ranks, or another of its own threads.

The launcher's progress watchdog (:mod:`gsplit.launch`) tells the rank that hangs from the ranks that
wait for it by asking each rank whether it waits for peers. A thread cannot be seen to wait from its
Python frame alone: under NCCL a collective returns at once and the host blocks later, in a read of
device data or in ``Work.wait()``, and with prefetch the training thread blocks in a queue of its own
process. So the places where gsplit blocks say so here:

- :func:`waiting_for_peers` around a call that blocks until other ranks take part (a collective on
  gloo, ``Work.wait()``; :func:`mark_work_waits` wraps ``Work.wait`` for code that is not gsplit's);
- :func:`waiting_for_thread` around a wait for another thread of the process (the prefetch queue),
  which waits for peers exactly when that thread does;
- :func:`track_in_flight` for a collective that was issued and has not completed (NCCL): the rank then
  depends on its peers, wherever its host happens to block on the device.

The registry is per process by nature (the launcher asks about the process, and the blocking points
sit deep in library code that does not carry the launcher's state), so it is one module-level object,
written under a lock; costs a dict update per blocking call.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
from typing import Deque, Dict, Iterator, Optional, Tuple

import torch.distributed as dist

_MAX_IN_FLIGHT = 64
"""Collectives kept for :func:`in_flight` at most (the oldest are dropped; newer ones complete later)."""


class _Waits:
    """Threads blocked on peers or on another thread, and collectives in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.blocked: Dict[int, Tuple[str, Optional[int]]] = {}
        """Thread ident -> ``("peers", None)`` or ``("thread", ident of the thread it waits for)``."""
        self.in_flight: Deque = collections.deque(maxlen=_MAX_IN_FLIGHT)
        """``torch.distributed`` Work objects issued and not known to be complete."""

    def drop_completed(self) -> None:
        """Forget the collectives that completed (call with ``lock`` held)."""
        pending = [w for w in self.in_flight if not _completed(w)]
        self.in_flight.clear()
        self.in_flight.extend(pending)

    @contextlib.contextmanager
    def mark(self, kind: str, target: Optional[int]) -> Iterator[None]:
        me = threading.get_ident()
        with self.lock:
            previous = self.blocked.get(me)
            self.blocked[me] = (kind, target)
        try:
            yield
        finally:
            with self.lock:
                if previous is None:
                    self.blocked.pop(me, None)
                else:
                    self.blocked[me] = previous


_WAITS = _Waits()


def waiting_for_peers() -> contextlib.AbstractContextManager:
    """Mark the calling thread as blocked until other ranks take part (a collective, ``Work.wait()``).

    Example:
        >>> with waiting_for_peers():
        ...     thread_waits_for_peers(threading.get_ident())
        True
    """
    return _WAITS.mark("peers", None)


def waiting_for_thread(thread: threading.Thread) -> contextlib.AbstractContextManager:
    """Mark the calling thread as blocked on ``thread`` (e.g. the prefetch queue): it waits for peers when
    ``thread`` does.

    Example:
        >>> with waiting_for_thread(threading.main_thread()):
        ...     thread_waits_for_peers(threading.get_ident())
        False
    """
    return _WAITS.mark("thread", thread.ident)


def track_in_flight(work) -> None:
    """Remember a collective that was issued but may not have completed (``work.is_completed()`` False).

    NCCL collectives return before they run; the host then blocks wherever it next reads device data.
    Completed collectives are dropped here, so only the ones still in flight keep their buffers alive.

    Example:
        >>> track_in_flight(None)   # nothing to track
        >>> in_flight()
        False
    """
    if work is None:
        return
    with _WAITS.lock:
        _WAITS.drop_completed()
        if not _completed(work):
            _WAITS.in_flight.append(work)


def in_flight() -> bool:
    """Whether a collective this process issued (and tracked) has not completed: the rank waits for peers.

    Asks each Work object, as NCCL's own watchdog thread does (``is_completed`` queries a CUDA event;
    it does not block and is safe from any thread).
    """
    with _WAITS.lock:
        _WAITS.drop_completed()  # also frees their buffers once nothing else holds them
        return bool(_WAITS.in_flight)


def forget_in_flight() -> None:
    """Stop tracking every collective (before the process group is destroyed: its Work objects must not be
    asked about a communicator that is gone)."""
    with _WAITS.lock:
        _WAITS.in_flight.clear()


def _completed(work) -> bool:
    try:
        return bool(work.is_completed())
    except RuntimeError:  # the collective failed: it waits for nothing any more; its error surfaces in its caller
        return True


def thread_waits_for_peers(ident: Optional[int]) -> bool:
    """Whether thread ``ident`` is blocked waiting for other ranks, directly or through the thread it waits on."""
    seen = set()
    with _WAITS.lock:
        while ident is not None and ident not in seen:
            seen.add(ident)
            entry = _WAITS.blocked.get(ident)
            if entry is None:
                return False
            kind, target = entry
            if kind == "peers":
                return True
            ident = target
    return False


def waits_for_peers(ident: Optional[int]) -> bool:
    """Whether the process waits for peers while thread ``ident`` (its training thread) is where it is:
    that thread is blocked on peers (directly or through another thread), or a collective is in flight."""
    return thread_waits_for_peers(ident) or in_flight()


def mark_work_waits() -> None:
    """Make every ``Work.wait()`` of this process mark its thread as waiting for peers (idempotent).

    ``torch.distributed`` calls ``Work.wait()`` itself for synchronous collectives, and user code calls
    it after ``async_op=True``; both then show as waiting. :func:`gsplit.launch` installs it in its ranks.

    Example:
        >>> mark_work_waits()
    """
    work_cls = getattr(dist, "Work", None)
    if work_cls is None:  # torch.distributed without c10d (e.g. some macOS builds): nothing waits
        return
    original = work_cls.wait
    if getattr(original, "_gsplit_marks_peer_wait", False):
        return

    @functools.wraps(original)
    def wait(self, *args, **kwargs):
        with waiting_for_peers():
            return original(self, *args, **kwargs)

    wait._gsplit_marks_peer_wait = True
    work_cls.wait = wait
