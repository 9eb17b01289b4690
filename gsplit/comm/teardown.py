"""Ending a rank's process groups without the exit hanging.

A rank whose result is already with the launcher must still exit. Destroying a gloo process group
joins its worker threads from the calling thread, which holds the GIL while it waits; a worker that has
just finished a collective may still hold the last reference to one of its tensors, and freeing a tensor
that Python created needs the GIL. When the destroy comes within a few milliseconds of the last
collective (nothing in between releases the GIL: a ``print`` to a pipe, an accuracy, a return), the
two wait for each other forever: a rank of the DGL port stayed alive 4.5 minutes after its test
accuracy, its native stack in ``destroy_process_group`` joining a gloo worker that waited for the GIL.

So every destroy in a launched rank first lets the workers finish (:func:`settle`: a short sleep that
releases the GIL), the user's own ``torch.distributed.destroy_process_group()`` included
(:func:`guard_destroy`), and gsplit's teardown after the result (:func:`end_process_groups`) arms a
deadline that needs no GIL: ``SIGALRM`` with its default action, so the kernel ends the process if the
teardown still hangs (the result is already delivered; the launcher says so in one line).
"""

from __future__ import annotations

import functools
import math
import signal
import threading
import time

import torch.distributed as dist

__all__ = ["settle", "guard_destroy", "end_process_groups", "hard_deadline", "DEADLINE_SIGNAL"]

SETTLE_S = 0.05
"""How long the GIL is left free before a destroy: gloo workers need microseconds to drop their last work."""

DEADLINE_SIGNAL = getattr(signal, "SIGALRM", None)
"""The signal that ends a rank whose teardown outlived :func:`hard_deadline` (None where there is none)."""


def settle() -> None:
    """Release the GIL for a moment so that collective backends' threads can free what they still hold.

    Example:
        >>> settle()
    """
    time.sleep(SETTLE_S)


def guard_destroy() -> None:
    """Make ``torch.distributed.destroy_process_group`` :func:`settle` first, in this process (idempotent).

    :func:`gsplit.launch` installs it in its ranks, where user code (DGL's examples end with it) may
    destroy the groups right after its last collective.

    Example:
        >>> guard_destroy(); guard_destroy()
        >>> getattr(dist.destroy_process_group, "_gsplit_settles", False)
        True
    """
    original = dist.destroy_process_group
    if getattr(original, "_gsplit_settles", False):
        return

    @functools.wraps(original)
    def destroy_process_group(*args, **kwargs):
        settle()
        return original(*args, **kwargs)

    destroy_process_group._gsplit_settles = True
    dist.destroy_process_group = destroy_process_group


def hard_deadline(seconds: float) -> bool:
    """End this process with :data:`DEADLINE_SIGNAL` in ``seconds`` unless it has exited by then.

    The signal keeps its default action (terminate), which the kernel carries out: it works while a
    thread holds the GIL in native code, where no Python handler or watchdog thread could run. Only
    the main thread can arm it (and only where ``SIGALRM`` exists); returns whether it was armed.

    Example:
        >>> hard_deadline(60) and hard_deadline(0)   # armed, then disarmed (0 cancels)
        True
    """
    if DEADLINE_SIGNAL is None or threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(DEADLINE_SIGNAL, signal.SIG_DFL)
    signal.alarm(max(0, math.ceil(seconds)) if seconds > 0 else 0)
    return True


def end_process_groups(deadline_s: float) -> None:
    """Tear down this rank's process groups after its result was delivered; never blocks past ``deadline_s``.

    The ranks meet in a barrier first (one that closes its connections while a peer's gloo threads still
    serve them made that peer abort in about 1 of 10 exits), then :func:`settle`, then destroy under
    :func:`hard_deadline`. Errors are ignored: the result is already with the launcher.
    """
    if not dist.is_initialized():  # fn may have destroyed it itself
        return
    try:
        dist.barrier()
    except Exception:  # noqa: BLE001 - a peer already gone: nothing to wait for
        pass
    hard_deadline(deadline_s)
    settle()
    try:
        getattr(dist.destroy_process_group, "__wrapped__", dist.destroy_process_group)()
    except Exception:  # noqa: BLE001 - see above
        pass
