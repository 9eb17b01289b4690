"""How rank processes start: ``spawn`` (a fresh interpreter per rank) or ``forkserver`` (forked from one server).

A spawned rank imports torch and gsplit anew: 2-4 s of CPU per rank, all of it at once when a job starts. The
fork server imports them once per launching process and forks every later rank from there, which counts
where cores are few (this project's 2-core CI launches some 250 ranks in its test suite; 40 % of the suite's
time was those imports). Either way ``fn`` is pickled by reference and the rank sees the launcher as it is
at the call: :class:`LauncherState` carries the environment and stdout/stderr, which a forked rank would
otherwise take from the server as it was when the server started (under an earlier launch).

The server starts once per launching process, inside the launch's environment (:func:`start_fork_server`):
OpenMP reads its settings (``OMP_WAIT_POLICY``) when torch loads, there, so they are those of the first
launch. It never touches CUDA, so GPU ranks initialise CUDA themselves, as spawned ones do.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from dataclasses import dataclass
from multiprocessing import forkserver, reduction
from typing import List, Optional

import torch.multiprocessing as tmp

from gsplit.launcher.watch import _killed_with_parent

START_METHODS = ("spawn", "forkserver")
ENV_START_METHOD = "GSPLIT_START_METHOD"
_ENV_SERVER_PARENT = "GSPLIT_FORK_SERVER_PARENT"  # set only while this process starts the server
_STDIO = (1, 2)
SERVER_PRELOAD = ("__main__", "torch", "gsplit", __name__)
"""What the fork server imports before it forks (``__main__``: multiprocessing's own default; this module: the
server then ends with the launcher, :func:`_end_with_the_launcher`). None of it may initialise CUDA."""


def start_context(start_method: Optional[str]):
    """The multiprocessing context that starts the ranks: ``start_method``, else ``GSPLIT_START_METHOD``, else spawn.

    Example:
        >>> start_context("spawn").get_start_method()
        'spawn'
    """
    method = start_method if start_method is not None else os.environ.get(ENV_START_METHOD) or "spawn"
    usable = [m for m in START_METHODS if m in multiprocessing.get_all_start_methods()]
    if method not in usable:
        where = "start_method" if start_method is not None else ENV_START_METHOD
        raise ValueError(f"{where}={method!r} is not a start method gsplit can use here; use one of {usable}")
    return tmp.get_context(method)


def start_fork_server(ctx) -> None:
    """Start multiprocessing's fork server, with torch and gsplit imported in it, unless it runs already."""
    ctx.set_forkserver_preload(list(SERVER_PRELOAD))
    os.environ[_ENV_SERVER_PARENT] = str(os.getpid())
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(_ENV_SERVER_PARENT, None)


def _end_with_the_launcher() -> None:
    """In the fork server (whose preload imports this module): die the moment the launcher does.

    multiprocessing ends the server only once it reads EOF on its liveness pipe, and then through Python's
    shutdown; ranks, which die with their parent, the server, meanwhile trained on: a run killed outright
    wrote one more checkpoint after its launcher was gone. Spawned ranks die with the launcher at once
    (their own PR_SET_PDEATHSIG); with this, forked ones do too.
    """
    # A launcher gone already (the server re-parented) is left to the pipe's EOF.
    if os.environ.pop(_ENV_SERVER_PARENT, None) == str(os.getppid()):
        _killed_with_parent()


def leave_the_fork_server() -> None:
    """In a forked rank: close this process's copy of the fork server's liveness pipe.

    multiprocessing hands every process it forks that pipe's write end, and the server exits only when the
    pipe reaches EOF: while ranks held it, a launcher killed outright left the server, and with it the ranks
    (which end with their parent, the server), running. Without it the server follows the launcher and the
    ranks follow the server. Best effort: the attribute is multiprocessing's own.
    """
    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


@dataclass
class LauncherState:
    """The launcher's environment and stdout/stderr at the call, for a rank to take over (:meth:`adopt`).

    Pickled into the rank's arguments: the file descriptors travel as multiprocessing sends descriptors to a
    new process (nothing changes for a spawned rank, which inherits them anyway).
    """

    environ: dict
    """The environment variables (``os.environ``) to run with."""
    fds: List[Optional[int]]
    """The descriptors that this process's stdout and stderr (fds 1 and 2) should write to (``None``: leave it)."""

    @classmethod
    def now(cls) -> "LauncherState":
        """This process's state: its environment, and its stdout/stderr where they are open."""
        return cls(dict(os.environ), [fd if _is_open(fd) else None for fd in _STDIO])

    def __reduce__(self):
        # Runs while multiprocessing pickles the rank's arguments, the only time DupFd can register a descriptor.
        sent = [None if fd is None else reduction.DupFd(fd) for fd in self.fds]
        return (LauncherState._received, (self.environ, sent))

    @staticmethod
    def _received(environ: dict, sent: list) -> "LauncherState":
        return LauncherState(environ, [None if d is None else d.detach() for d in sent])

    def adopt(self) -> None:
        """Make this process's environment and stdout/stderr the launcher's."""
        if os.environ != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        for target, fd, stream in zip(_STDIO, self.fds, (sys.stdout, sys.stderr)):
            if fd is None or fd == target:
                continue
            with contextlib.suppress(Exception):
                stream.flush()
            os.dup2(fd, target)
            os.close(fd)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


_end_with_the_launcher()  # a no-op anywhere but in a fork server a launcher is starting
