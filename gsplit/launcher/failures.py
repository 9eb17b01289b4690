"""How a launch fails: a rank's failure (:class:`RankFailure`), the error that names the root cause
(:class:`LaunchError`), a stop by signal (:class:`LaunchInterrupted`), and how the root cause is picked."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch.distributed as dist


@dataclass(frozen=True)
class RankFailure:
    """How one rank failed."""

    rank: int
    """The rank that failed."""
    exitcode: Optional[int]
    """The process exit code (negative: killed by that signal); ``None`` if it was still running."""
    exc_type: Optional[str]
    """Name of the exception ``fn`` (or the rank's setup) raised; ``None`` if the process died without one."""
    message: str
    """One-line description: the exception text, or how the process died."""
    traceback: str
    """The child's formatted traceback; empty if the process died without a Python exception."""
    when: float
    """``time.time()`` of the failure (raised in the child, or death noticed by the parent)."""
    communication: bool
    """True for errors of the collective backend, usually a consequence of another rank's failure."""

    def describe(self) -> str:
        head = f"rank {self.rank} " + (f"raised {self.exc_type}: {self.message}" if self.exc_type else self.message)
        return head + (f"\n--- traceback of rank {self.rank} ---\n{self.traceback.rstrip()}" if self.traceback else "")


class LaunchError(RuntimeError):
    """A rank started by :func:`launch` failed. ``rank``/``failures`` say which and how."""

    def __init__(self, message: str, rank: int, failures: Sequence[RankFailure]):
        super().__init__(message)
        self.rank = rank
        """The rank whose failure is taken as the root cause."""
        self.failures = list(failures)
        """Every failure observed, root cause first."""

    def __reduce__(self):
        return (LaunchError, (str(self), self.rank, self.failures))

    @property
    def exitcode(self) -> Optional[int]:
        return self.failures[0].exitcode

    @property
    def child_traceback(self) -> str:
        return self.failures[0].traceback


class LaunchInterrupted(SystemExit):
    """The launching process received SIGTERM or SIGHUP during :func:`launch`; every rank was stopped.

    A ``SystemExit`` with code ``128 + signum`` (the shell's convention for "killed by a signal"), so a
    script that does not catch it exits quietly with 143 for SIGTERM and 129 for SIGHUP, and
    ``except Exception`` blocks do not swallow it.
    """

    def __init__(self, signum: int):
        super().__init__(128 + int(signum))
        self.signum = int(signum)
        """The signal received."""

    def __reduce__(self):
        return (LaunchInterrupted, (self.signum,))

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}; all ranks were stopped"


def _is_communication_error(exc: BaseException) -> bool:
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer", "NCCL", "ProcessGroupGloo",
                            "Socket Timeout", "Timed out", "gloo"))


def _death_message(exitcode: Optional[int]) -> str:
    if exitcode is None:
        return "closed its result pipe without reporting a result"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"died from {name} (exit code {exitcode}) without a Python exception"
    # Also what a rank shows when it fails before fn runs, e.g. spawn cannot import fn's module or the
    # launching script (a script must guard launch() with `if __name__ == "__main__":`).
    return (f"exited with code {exitcode} without a Python exception or a result (if it failed while starting, "
            f"its stderr above says why)")


def _pick_root_cause(failures: List[RankFailure]) -> List[RankFailure]:
    # Backend errors are usually echoes of another rank's death; prefer the first failure that is not one.
    return sorted(failures, key=lambda f: (f.communication, f.when))
