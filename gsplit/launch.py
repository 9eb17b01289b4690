"""Start one process per rank, set up ``torch.distributed``, collect results, and propagate failures.

``launch(fn, nprocs, args)`` runs ``fn(rank, world_size, *args)`` in ``nprocs`` fresh processes (the
``spawn`` start method, so CUDA works in them) and returns their return values in rank order. With
CUDA GPUs each rank owns one GPU and the ranks talk over NCCL; without, ranks are CPU processes over
gloo. When a rank fails, the other ranks may be stuck in a collective waiting for it, so the launcher
does not wait for them: it reports the failure, terminates (then kills) the rest, and raises
:class:`LaunchError` naming the failing rank and carrying its traceback.

Because ranks start with ``spawn``, ``fn`` and ``args`` must be picklable: ``fn`` a top-level function
of an importable module (not a lambda or a nested function), and a script that calls ``launch`` must
guard the call with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import datetime
import contextlib
import logging
import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait as mp_wait
from typing import Any, Callable, List, Optional, Sequence, Union

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

log = logging.getLogger(__name__)

__all__ = ["launch", "LaunchError", "RankFailure", "current_device", "resolve_device"]

# After the first failure, how long to keep listening for the other ranks' reports before killing them
# (lets a simultaneous, earlier root cause win over its follow-up communication errors).
_DRAIN_S = 0.5
# How long terminated ranks get to exit before SIGKILL.
_KILL_GRACE_S = 3.0
# How long ranks that delivered their results get to exit (destroy_process_group etc.) before SIGTERM.
_EXIT_GRACE_S = 30.0

_ENV_DEVICE = "GSPLIT_DEVICE"


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


def current_device() -> torch.device:
    """The device :func:`launch` assigned to the calling rank; in a rank torchrun started (``LOCAL_RANK``
    set), GPU ``LOCAL_RANK`` when CUDA is available; else ``cpu``.

    Example:
        >>> current_device()  # in the launching process itself
        device(type='cpu')
    """
    if _ENV_DEVICE in os.environ:
        return torch.device(os.environ[_ENV_DEVICE])
    if "LOCAL_RANK" in os.environ and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return torch.device("cpu")


def resolve_device(name: Union[str, torch.device] = "auto") -> torch.device:
    """The device a rank computes on, from a user's choice (the one rule; the trainer and CLI use it).

    ``"auto"``: in a rank started by :func:`launch`, the device it assigned (:func:`current_device`);
    elsewhere the first GPU when there is one, else the CPU. ``"cuda"``: this rank's GPU (an error
    without CUDA). Anything else is taken as a torch device name.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    name = str(name)
    if name == "auto":
        if _ENV_DEVICE in os.environ or "LOCAL_RANK" in os.environ:  # gsplit.launch or torchrun
            return current_device()
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' but CUDA is not available; use device='cpu' or 'auto'")
        dev = current_device()
        return dev if dev.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device(name)


def _resolve_devices(nprocs: int, backend: Optional[str], devices) -> List[torch.device]:
    if devices is None:
        want_cuda = backend in (None, "nccl") and torch.cuda.is_available() and torch.cuda.device_count() > 0
        if backend == "nccl" and not want_cuda:
            raise ValueError("backend='nccl' needs CUDA GPUs but none is available; use backend='gloo' for CPU ranks")
        devices = "cuda" if want_cuda else "cpu"
    if isinstance(devices, (str, torch.device)):
        dev = torch.device(devices)
        if dev.type == "cpu":
            return [torch.device("cpu")] * nprocs
        if dev.type != "cuda":
            raise ValueError(f"devices={devices!r}: only 'cpu', 'cuda' or a list of per-rank devices are supported")
        count = torch.cuda.device_count()
        if nprocs > count:
            raise ValueError(f"nprocs={nprocs} ranks need one GPU each but {count} CUDA GPU(s) are visible; "
                             f"lower nprocs or pass devices='cpu' to run CPU ranks over gloo")
        return [torch.device("cuda", r) for r in range(nprocs)]
    out = [torch.device(d) for d in devices]
    if len(out) != nprocs:
        raise ValueError(f"devices has {len(out)} entries but nprocs={nprocs}; pass one device per rank")
    return out


def _is_communication_error(exc: BaseException) -> bool:
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer", "NCCL", "ProcessGroupGloo",
                            "Socket Timeout", "Timed out", "gloo"))


def _child_main(rank: int, world_size: int, fn: Callable, args: tuple, device: str, backend: str,
                port: int, timeout: float, conn) -> None:
    """Entry point of a rank's process: set up, run ``fn``, send back ``("ok", result)`` or an error."""
    try:
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                           "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size), _ENV_DEVICE: device})
        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        elif "OMP_NUM_THREADS" not in os.environ:
            # CPU ranks share the host's cores; torch's default (all cores each) oversubscribes them.
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            torch.set_num_threads(max(1, cores // world_size))
        # The parent hosts the rendezvous store, so the port cannot be taken between choosing and listening.
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        result = fn(rank, world_size, *args)
        try:
            payload = pickle.dumps(("ok", result), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise TypeError(f"the return value of fn on rank {rank} cannot be pickled to send it back to the "
                            f"launching process ({type(result).__name__}: {e}); return plain data or CPU tensors") from e
    except BaseException as e:  # noqa: BLE001 - every failure, also SystemExit, must reach the parent
        report = ("error", type(e).__name__, str(e), traceback.format_exc(), time.time(), _is_communication_error(e))
        try:
            conn.send_bytes(pickle.dumps(report))
            conn.close()
        finally:
            # Exit at once: interpreter shutdown could block on backend threads, and peers waiting in a
            # collective learn of the failure sooner from the closed connection.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
    conn.send_bytes(payload)
    conn.close()
    if dist.is_initialized():  # fn may have destroyed it itself
        # Tear down together: a rank that closes its connections while a peer's gloo threads still
        # serve them made that peer abort ("terminate called without an active exception") in about
        # 1 of 10 exits. The result is already with the parent, so a failure here changes nothing.
        try:
            dist.barrier()
        except Exception:  # noqa: BLE001
            pass
        dist.destroy_process_group()
    # Skip interpreter teardown: destructors of backend objects (stores, transport threads) running at
    # exit were the other source of those aborts, and there is nothing left to clean up.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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


def _stop(procs, grace: float) -> None:
    """Terminate every live process, then kill those still alive after ``grace`` seconds."""
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            log.warning("rank process pid %s ignored SIGTERM; killing it", p.pid)
            p.kill()
            p.join(grace)


def _pick_root_cause(failures: List[RankFailure]) -> List[RankFailure]:
    # Backend errors are usually echoes of another rank's death; prefer the first failure that is not one.
    return sorted(failures, key=lambda f: (f.communication, f.when))


@contextlib.contextmanager
def _child_environment(cpu_ranks: bool):
    """Environment the spawned ranks start with (read by OpenMP when they import torch).

    CPU ranks share the host's cores and block in collectives; OpenMP's default of spinning idle
    threads made ranks 5-30x slower on a busy 2-core machine, so they sleep instead, unless the user
    chose a policy. The parent's environment is restored once the ranks have started.
    """
    saved = os.environ.get("OMP_WAIT_POLICY")
    if cpu_ranks and saved is None:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("OMP_WAIT_POLICY", None)


def launch(fn: Callable[..., Any], nprocs: int, args: tuple = (), backend: Optional[str] = None,
           devices: Union[None, str, Sequence[Union[str, torch.device]]] = None, timeout: float = 60,
           master_port: Optional[int] = None, spawn: bool = True) -> List[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``nprocs`` ranks and return their results in rank order.

    Each rank is a spawned process in which ``torch.distributed`` is initialised (rendezvous through a
    TCP store that this process hosts on 127.0.0.1 at ``master_port``, by default a port the OS picks;
    env ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` are set as torchrun
    sets them), the rank's GPU is made current, ``fn`` runs, its return value is pickled back, and the
    process group is destroyed. CPU ranks get ``torch.set_num_threads(cores // nprocs)`` unless
    ``OMP_NUM_THREADS`` is set.

    Args:
        fn: top-level (picklable) function called as ``fn(rank, world_size, *args)``; its return value
            must be picklable (CPU tensors are fine).
        nprocs: number of ranks (world size).
        args: extra picklable positional arguments for ``fn`` (CPU tensors travel through shared memory).
        backend: ``"nccl"``, ``"gloo"`` or ``None``: NCCL when the ranks run on GPUs, else gloo.
        devices: ``None`` (one GPU per rank when CUDA GPUs exist and backend is not gloo, else CPU),
            ``"cpu"``, ``"cuda"``, or one device per rank. :func:`current_device` returns it in the rank.
        timeout: seconds a collective (and the rendezvous) may wait before the backend gives up.
        master_port: rendezvous port; ``None`` lets the OS pick a free one.
        spawn: ``False`` runs ``fn(0, 1, *args)`` in the calling process, without processes or a
            process group, so a debugger and exceptions work as usual; only for ``nprocs == 1``.

    Raises:
        LaunchError: a rank raised or died; the message names the rank and holds its traceback.
            The other ranks are terminated, also when they are stuck in a collective.

    Example:
        >>> def work(rank, world_size, x):          # in an importable module
        ...     t = torch.tensor([rank + x]); torch.distributed.all_reduce(t); return t.item()
        >>> launch(work, 2, args=(10,), devices="cpu")  # doctest: +SKIP
        [21, 21]
    """
    nprocs = int(nprocs)
    if nprocs < 1:
        raise ValueError(f"nprocs={nprocs}; launch needs at least one rank")
    if not spawn:
        if nprocs != 1:
            raise ValueError(f"spawn=False runs in-process and supports only nprocs=1, got nprocs={nprocs}")
        return [fn(0, 1, *args)]
    devs = _resolve_devices(nprocs, backend, devices)
    if backend is None:
        backend = "nccl" if all(d.type == "cuda" for d in devs) else "gloo"
    if backend == "nccl" and any(d.type != "cuda" for d in devs):
        raise ValueError(f"backend='nccl' needs a CUDA device for every rank, got devices {[str(d) for d in devs]}; "
                         f"use backend='gloo' for CPU ranks")
    try:  # only fn: args may be large (they travel once, at start, through shared memory)
        pickle.dumps(fn)
    except Exception as e:
        raise TypeError(f"launch starts ranks with the spawn method, so fn must be picklable: a top-level function "
                        f"of an importable module, not a lambda or nested function ({type(e).__name__}: {e})") from e
    try:
        # Hosting the store here on port 0 (the OS picks a free one and we keep it) avoids the race of
        # "find a free port, release it, hope rank 0 gets it" when several launches start at once.
        store = dist.TCPStore("127.0.0.1", int(master_port or 0), nprocs, is_master=True,
                              timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
    except Exception as e:
        raise RuntimeError(f"cannot host the rendezvous store on 127.0.0.1:{master_port or 0} ({e}); "
                           f"pass another master_port or leave it None to let the OS choose") from e
    port = store.port

    ctx = tmp.get_context("spawn")
    procs, conns = [], []
    failures: List[RankFailure] = []
    results: List[Any] = [None] * nprocs
    done = [False] * nprocs          # result or failure received
    try:
        with _child_environment(cpu_ranks=all(d.type == "cpu" for d in devs)):
            for rank in range(nprocs):
                reader, writer = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child_main, name=f"gsplit-rank{rank}",
                                args=(rank, nprocs, fn, tuple(args), str(devs[rank]), backend, port, float(timeout),
                                      writer))
                p.start()
                writer.close()  # the child holds the only write end: EOF on reader means the child is gone
                procs.append(p)
                conns.append(reader)
        log.debug("launched %d ranks (backend %s, port %d)", nprocs, backend, port)

        drain_until = None
        while not all(done):
            # Wait on the result pipes and on the process sentinels: a rank whose fork-started helpers
            # (e.g. DataLoader workers) inherited its pipe would otherwise hide its own death.
            waiting = {}
            for r in range(nprocs):
                if not done[r]:
                    waiting[conns[r]] = r
                    waiting[procs[r].sentinel] = r
            wait_s = None if drain_until is None else max(0.0, drain_until - time.monotonic())
            ready_ranks = sorted({waiting[x] for x in mp_wait(list(waiting), timeout=wait_s)})
            for r in ready_ranks:
                c = conns[r]
                if not c.poll():  # sentinel fired and nothing was sent: the process died silently
                    msg = None
                else:
                    try:
                        msg = pickle.loads(c.recv_bytes())
                    except EOFError:
                        msg = None
                    except Exception as e:  # e.g. a CUDA tensor result in a process without CUDA
                        msg = ("error", type(e).__name__, f"the launching process cannot unpickle the result of "
                               f"rank {r}: {e}; return plain data or CPU tensors", "", time.time(), False)
                done[r] = True
                if msg is None:
                    procs[r].join(_KILL_GRACE_S)
                    failures.append(RankFailure(r, procs[r].exitcode, None, _death_message(procs[r].exitcode), "",
                                                time.time(), False))
                elif msg[0] == "ok":
                    results[r] = msg[1]
                else:
                    _, exc_type, text, tb, when, comm = msg
                    failures.append(RankFailure(r, None, exc_type, text, tb, when, comm))
            if failures and drain_until is None:
                drain_until = time.monotonic() + _DRAIN_S
            if drain_until is not None and time.monotonic() >= drain_until:
                break
    finally:
        if failures or not all(done):
            _stop(procs, _KILL_GRACE_S)
        else:
            deadline = time.monotonic() + _EXIT_GRACE_S
            for p in procs:
                p.join(max(0.0, deadline - time.monotonic()))
            stuck = [r for r, p in enumerate(procs) if p.is_alive()]
            if stuck:
                log.warning("ranks %s delivered results but did not exit within %.0f s; terminating them",
                            stuck, _EXIT_GRACE_S)
                _stop(procs, _KILL_GRACE_S)
            for r, p in enumerate(procs):
                if p.exitcode not in (0, None) and r not in stuck:
                    log.warning("rank %d delivered its result but exited with code %s", r, p.exitcode)
        for c in conns:
            c.close()
        del store

    if failures:
        exitcodes = {r: p.exitcode for r, p in enumerate(procs)}
        failures = [f if f.exitcode is not None else RankFailure(f.rank, exitcodes[f.rank], f.exc_type, f.message,
                                                                 f.traceback, f.when, f.communication)
                    for f in failures]
        ordered = _pick_root_cause(failures)
        root = ordered[0]
        text = f"{nprocs}-rank launch of {getattr(fn, '__qualname__', fn)!r} failed: " + root.describe()
        others = [f"rank {f.rank}: " + (f"{f.exc_type}: {f.message}" if f.exc_type else f.message) for f in ordered[1:]]
        if others:
            text += "\nother ranks failed too (often a consequence):\n  " + "\n  ".join(others)
        raise LaunchError(text, root.rank, ordered)
    return results
