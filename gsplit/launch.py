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

Two calling conventions, two names, so that the difference cannot be missed: :func:`launch` passes the
world size after the rank, ``fn(rank, world_size, *args)``; :func:`spawn` takes the arguments of
``torch.multiprocessing.spawn`` and calls ``fn(rank, *args)`` as it does (the world size is then
:func:`world_size`). Both check ``fn``'s signature against the arguments before starting any process.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import inspect
import ipaddress
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait as mp_wait
from typing import Any, Callable, List, Optional, Sequence, Union

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from gsplit import resources
from gsplit.comm import teardown, waits

log = logging.getLogger(__name__)

__all__ = ["launch", "spawn", "LaunchError", "LaunchInterrupted", "RankFailure", "current_device", "report_progress",
           "resolve_device", "world_size"]

# After the first failure, how long to keep listening for the other ranks' reports before killing them
# (lets a simultaneous, earlier root cause win over its follow-up communication errors).
_DRAIN_S = 0.5
# How long terminated ranks get to exit before SIGKILL.
_KILL_GRACE_S = 3.0
# How long ranks that delivered their results get to exit (barrier, destroy_process_group) before SIGTERM,
# counted from the last result: nothing is left to wait for but teardown (well under a second on CPU ranks).
# A rank also ends itself that long after its barrier (gsplit.comm.teardown), without needing the GIL.
_EXIT_GRACE_S = 5.0

_ENV_DEVICE = "GSPLIT_DEVICE"
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


def world_size(group=None) -> int:
    """Number of ranks in the job (or in ``group``): ``torch.distributed.get_world_size()``, 1 without a process group.

    Ranks started by :func:`spawn` get ``fn(rank, *args)`` like ``torch.multiprocessing.spawn``; this
    is where they read how many there are.

    Example:
        >>> world_size()  # the launching process itself has no process group
        1
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


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
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if backend == "nccl" and gpus < nprocs:
            raise ValueError(f"backend='nccl' needs one CUDA GPU per rank: nprocs={nprocs} but {gpus} GPU(s) are "
                             f"visible; lower nprocs, or use backend='gloo' for CPU ranks")
        want_cuda = backend in (None, "nccl") and gpus >= nprocs
        if backend is None and 0 < gpus < nprocs:
            # The first GPU run found the suite failing here: launch(fn, 2) on a one-GPU host used to raise.
            # CPU ranks still run the job (as on a machine without a GPU); the warning says how to use the GPU.
            log.warning("launch: %d ranks but %d CUDA GPU(s): running CPU ranks over gloo. Pass nprocs=%d for one "
                        "rank per GPU, or devices=['cuda:0'] * %d with backend='gloo' for ranks that share a GPU",
                        nprocs, gpus, gpus, nprocs)
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


def _die_with_parent(parent_pid: int, watch: Optional[_RankWatch]) -> None:
    """Make sure this rank ends when the launching process does, however that one ends.

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` makes the kernel kill this process when its parent dies,
    also by SIGKILL, which no handler in the parent can catch. Elsewhere (and as a second line on Linux)
    a daemon thread polls the parent pid: once the process is re-parented, the launcher is gone.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
                log.debug("prctl(PR_SET_PDEATHSIG) failed with errno %d", ctypes.get_errno())
        except (OSError, AttributeError) as e:  # no libc symbol: the watchdog thread below still works
            log.debug("prctl unavailable (%s); relying on the watchdog thread", e)
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


def _thread_lock_for_tqdm() -> None:
    """Give tqdm a thread lock in a rank. Its default lock holds a multiprocessing semaphore, which a rank
    leaving with os._exit (below) never unlinks, so the resource tracker warned of leaked semaphores at
    shutdown whenever user code showed a progress bar; ranks are separate processes that never share a
    bar's lock, so a thread lock is all tqdm needs there."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def _child_main(rank: int, world_size: int, fn: Callable, args: tuple, device: str, backend: str,
                master_addr: str, port: int, timeout: float, conn, parent_pid: int, slots) -> None:
    """Entry point of a rank's process: set up, run ``fn``, send back ``("ok", result)`` or an error."""
    global _WATCH
    _WATCH = _RankWatch(slots, rank)
    waits.mark_work_waits()  # user code's Work.wait() (async_op=True) shows as waiting for peers too
    teardown.guard_destroy()  # user code's destroy_process_group() lets gloo's workers free their tensors first
    _die_with_parent(parent_pid, _WATCH)
    _thread_lock_for_tqdm()
    try:
        os.environ.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(port), "RANK": str(rank),
                           "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size), _ENV_DEVICE: device})
        _bind_to_loopback(master_addr, os.environ)
        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        limit_threads(world_size)
        # The parent hosts the rendezvous store, so the port cannot be taken between choosing and listening.
        store = dist.TCPStore(master_addr, port, world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout))
        init_process_group(backend, dev, store=store, rank=rank, world_size=world_size,
                           timeout=datetime.timedelta(seconds=timeout))
        if dev.type == "cpu":  # a CPU rank's step allocates the same large temporaries every iteration
            resources.keep_freed_heap()
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
    waits.forget_in_flight()  # the heartbeat thread must not query collectives of a group being destroyed
    # Barrier, then destroy under a deadline that needs no GIL: the result is with the parent already.
    teardown.end_process_groups(_EXIT_GRACE_S - 1.0)
    # Skip interpreter teardown: destructors of backend objects (stores, transport threads) running at
    # exit were the other source of those aborts, and there is nothing left to clean up.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def limit_threads(ranks_on_host: int) -> Optional[int]:
    """Give this rank its share of the host's cores for torch's CPU threads, unless ``OMP_NUM_THREADS`` is set.

    Every rank of a host runs CPU work, GPU ranks too (host-side sampling and gathers, the CPU parts of
    evaluation, the prefetch thread); torch's default of all cores per rank oversubscribes the host
    ``ranks_on_host`` times. Returns the thread count set, ``None`` when the user's setting stands.

    Example:
        >>> limit_threads(1) is None or torch.get_num_threads() >= 1
        True
    """
    if "OMP_NUM_THREADS" in os.environ:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // max(1, int(ranks_on_host)))
    torch.set_num_threads(threads)
    return threads


def init_process_group(backend: Optional[str], device: torch.device, **options) -> None:
    """``torch.distributed.init_process_group`` for a rank computing on ``device``.

    A CUDA rank passes its GPU as ``device_id`` where torch supports it (2.3+): the NCCL communicator is
    then created here, by every rank at once, instead of lazily inside the first collective while the
    first mini-batch is in flight (and later groups split from it). torch 2.2 has no ``device_id``.

    Example:
        >>> init_process_group("nccl", torch.device("cuda", 1), store=store, rank=1, world_size=8)  # doctest: +SKIP
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is not None and _accepts_device_id():
        options["device_id"] = device
    dist.init_process_group(backend, **options)


def _accepts_device_id() -> bool:
    try:
        return "device_id" in inspect.signature(dist.init_process_group).parameters
    except (TypeError, ValueError):
        return False


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
        if hasattr(signal, "SIGCONT"):  # a stopped (frozen) rank handles SIGTERM only once continued
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGCONT)
    deadline = time.monotonic() + grace
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            log.warning("rank process pid %s ignored SIGTERM; killing it", p.pid)
            p.kill()
            p.join(grace)


def _join_finished(procs) -> None:
    """Wait for ranks that delivered their results to exit; terminate those that do not."""
    deadline = time.monotonic() + _EXIT_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    stuck = [r for r, p in enumerate(procs) if p.is_alive()]
    if stuck:
        log.warning("ranks %s delivered results but did not exit within %.0f s; terminating them",
                    stuck, _EXIT_GRACE_S)
        _stop(procs, _KILL_GRACE_S)
    for r, p in enumerate(procs):
        if teardown.DEADLINE_SIGNAL is not None and p.exitcode == -teardown.DEADLINE_SIGNAL:
            log.warning("rank %d delivered its result but its process-group teardown hung; it ended itself after "
                        "%.0f s (the result is kept)", r, _EXIT_GRACE_S - 1.0)
        elif p.exitcode not in (0, None) and r not in stuck:
            log.warning("rank %d delivered its result but exited with code %s", r, p.exitcode)


def _pick_root_cause(failures: List[RankFailure]) -> List[RankFailure]:
    # Backend errors are usually echoes of another rank's death; prefer the first failure that is not one.
    return sorted(failures, key=lambda f: (f.communication, f.when))


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


def _check_number(name: str, value, minimum: float, allow_zero: bool) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}") from None
    if not (v > minimum or (allow_zero and v == 0)) or v != v or v == float("inf"):
        what = "positive" + (" (0 disables it)" if allow_zero else "")
        raise ValueError(f"{name} must be {what} and finite, got {value!r}")
    return v


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


def _loopback_interface() -> str:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        names = []
    return next((n for n in names if n in ("lo", "lo0")), next((n for n in names if n.startswith("lo")), "lo"))


def _is_loopback_address(addr: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(addr) if addr == "localhost" else addr).is_loopback
    except (ValueError, OSError):
        return False


def _bind_to_loopback(master_addr: str, env) -> None:
    """Make gloo's and NCCL's listening sockets of a single-host job use the loopback interface.

    Without this, gloo binds the address the host name resolves to (a LAN address on most servers),
    so the ranks' sockets were reachable from the network although the rendezvous store is local. A
    rendezvous on a loopback ``master_addr`` means every rank is on this host; with another address
    (several hosts) the user's ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` choose the interface.
    """
    if not _is_loopback_address(master_addr):
        return
    lo = _loopback_interface()
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if env.get(var) not in (None, "", lo):
            log.warning("%s=%s ignored: the ranks of a single-host job listen on the loopback interface %s only",
                        var, env[var], lo)
        env[var] = lo


def _listen_socket(addr: str, port: int) -> socket.socket:
    """A listening TCP socket bound to ``addr`` only (torch's TCPStore would bind every interface)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    if os.name == "posix":  # as servers do (and TCPStore does): connections in TIME_WAIT must not block a rebind
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def launch(fn: Callable[..., Any], nprocs: int, args: tuple = (), backend: Optional[str] = None,
           devices: Union[None, str, Sequence[Union[str, torch.device]]] = None, timeout: float = 1800,
           master_port: Optional[int] = None, spawn: bool = True, progress_timeout: float = 600,
           heartbeat_timeout: float = 120, master_addr: str = "127.0.0.1") -> List[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``nprocs`` ranks and return their results in rank order.

    For ``torch.multiprocessing.spawn``'s convention, ``fn(rank, *args)``, use :func:`spawn`.

    Each rank is a spawned process in which ``torch.distributed`` is initialised (rendezvous through a
    TCP store that this process hosts on ``master_addr`` (127.0.0.1) at ``master_port``, by default a
    port the OS picks; env ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
    are set as torchrun sets them), the rank's GPU is made current, ``fn`` runs, its return value is
    pickled back, and the process group is destroyed. Every rank, CPU or GPU, gets ``torch.set_num_threads(cores //
    nprocs)`` unless ``OMP_NUM_THREADS`` is set; a GPU rank creates its NCCL communicator at start (``device_id``).

    Faults: a rank that raises or dies stops the job at once (:class:`LaunchError` names it). A rank
    whose process freezes is found by its heartbeat (``heartbeat_timeout``); a job whose ranks stopped
    calling :func:`report_progress` is stopped after ``progress_timeout`` and the error names the rank
    that hung, not the ones waiting for it; ``timeout`` is the backend's last resort for a collective.
    SIGTERM/SIGHUP to this process stop every rank and raise :class:`LaunchInterrupted`; Ctrl-C raises
    KeyboardInterrupt after stopping them; if this process is killed outright, the ranks die with it.

    Args:
        fn: top-level (picklable) function called as ``fn(rank, world_size, *args)``; its return
            value must be picklable (CPU tensors are fine). A ``fn`` that cannot take those arguments
            is refused before any process starts.
        nprocs: number of ranks (world size).
        args: extra picklable positional arguments for ``fn`` (CPU tensors travel through shared memory).
        backend: ``"nccl"``, ``"gloo"`` or ``None``: NCCL when the ranks run on GPUs, else gloo.
        devices: ``None`` (one GPU per rank when there are at least ``nprocs`` CUDA GPUs and backend is not
            gloo, else CPU ranks, with a warning when some but too few GPUs exist),
            ``"cpu"``, ``"cuda"``, or one device per rank. :func:`current_device` returns it in the rank.
        timeout: seconds a collective (and the rendezvous) may wait before the backend gives up; the
            default, 30 min as DDP's, lets long GPU epochs and evaluations pass.
        master_port: rendezvous port; ``None`` lets the OS pick a free one.
        spawn: ``False`` runs ``fn(0, 1, *args)`` in the calling process, without processes or a
            process group, so a debugger and exceptions work as usual; only for ``nprocs == 1``.
        progress_timeout: stop the job when a rank's last :func:`report_progress` is this many seconds
            old while it runs outside any collective and other ranks wait in one (for it). 0 disables;
            armed only once some rank has reported progress, so a ``fn`` that never reports is never
            stopped by it; ranks that all compute (a long evaluation) are not stopped either.
        heartbeat_timeout: stop the job when a rank's watchdog thread has not run for this many seconds
            (a frozen process; 0 disables). A rank busy in a long step or collective still beats.
        master_addr: the address the rendezvous store listens on; only local ranks connect to it.

    Raises:
        LaunchError: a rank raised, died, froze or hung; the message names that rank and holds its
            traceback. The other ranks are terminated, also when they are stuck in a collective.
        LaunchInterrupted: this process received SIGTERM or SIGHUP (a ``SystemExit`` with code 128 + signum).

    Example:
        >>> def work(rank, world_size, x):          # in an importable module
        ...     t = torch.tensor([rank + x]); torch.distributed.all_reduce(t); return t.item()
        >>> launch(work, 2, args=(10,), devices="cpu")  # doctest: +SKIP
        [21, 21]
    """
    nprocs = int(nprocs)
    if nprocs < 1:
        raise ValueError(f"nprocs={nprocs}; launch needs at least one rank")
    timeout = _check_number("timeout", timeout, 0, allow_zero=False)
    progress_timeout = _check_number("progress_timeout", progress_timeout, 0, allow_zero=True)
    heartbeat_timeout = _check_number("heartbeat_timeout", heartbeat_timeout, 0, allow_zero=True)
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
    _check_signature(fn, 2, args, "launch calls fn(rank, world_size, *args)",
                     "for torch.multiprocessing.spawn's fn(rank, *args) use gsplit.spawn(fn, args=..., nprocs=...)")
    try:
        # Hosting the store here on port 0 (the OS picks a free one and we keep it) avoids the race of
        # "find a free port, release it, hope rank 0 gets it" when several launches start at once.
        # TCPStore binds every interface when it opens the port itself; a socket bound to master_addr
        # and handed over (the store owns the descriptor from then on) keeps it local.
        sock = _listen_socket(master_addr, int(master_port or 0))
        port = sock.getsockname()[1]
        try:
            store = dist.TCPStore(master_addr, port, nprocs, is_master=True,
                                  timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False,
                                  master_listen_fd=sock.fileno())
        except BaseException:
            sock.close()
            raise
        sock.detach()
    except Exception as e:
        raise RuntimeError(f"cannot host the rendezvous store on {master_addr}:{master_port or 0} ({e}); "
                           f"pass another master_port or leave it None to let the OS choose") from e

    ctx = tmp.get_context("spawn")
    # Written by the ranks (heartbeat thread, report_progress), read by the watchdog below; lock-free:
    # each slot has one writer, and a torn read of a timestamp cannot happen for aligned doubles.
    slots = ctx.RawArray("d", nprocs * _SLOTS)
    watchdog = _Watchdog(slots, nprocs, heartbeat_timeout, progress_timeout)
    procs, conns = [], []
    failures: List[RankFailure] = []
    results: List[Any] = [None] * nprocs
    done = [False] * nprocs          # result or failure received
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(_stop_on_signals())
        with _child_environment(cpu_ranks=all(d.type == "cpu" for d in devs)):
            for rank in range(nprocs):
                reader, writer = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child_main, name=f"gsplit-rank{rank}",
                                args=(rank, nprocs, fn, tuple(args), str(devs[rank]), backend, master_addr, port,
                                      float(timeout), writer, os.getpid(), slots))
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
            wait_s = _POLL_S if drain_until is None else max(0.0, min(_POLL_S, drain_until - time.monotonic()))
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
            if drain_until is None:
                stalled = watchdog.check([r for r in range(nprocs) if not done[r]])
                if stalled is not None:
                    log.error("rank %d %s; stopping the job", stalled.rank, stalled.message)
                    done[stalled.rank] = True
                    failures.append(stalled)
            if failures and drain_until is None:
                drain_until = time.monotonic() + _DRAIN_S
            if drain_until is not None and time.monotonic() >= drain_until:
                hung = watchdog.blame_hang(failures, [r for r in range(nprocs) if not done[r]])
                if hung is not None:
                    failures.append(hung)
                break
    finally:
        try:
            if failures or not all(done):
                _stop(procs, _KILL_GRACE_S)
            else:
                _join_finished(procs)
        except LaunchInterrupted:  # the signal came while the ranks were exiting: stop them, then report it
            _stop(procs, _KILL_GRACE_S)
            raise
        finally:
            for c in conns:
                c.close()
            del store
            stack.close()

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


def _check_signature(fn: Callable, leading: int, args: tuple, convention: str, instead: str) -> None:
    """Refuse, before any process starts, a ``fn`` that cannot take ``leading`` ints plus ``args``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some callables have none: let the call decide
        return
    try:
        sig.bind(*range(leading), *args)
    except TypeError as e:
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(f"{convention}, but {name}{sig} cannot take {leading} + {len(args)} positional "
                        f"arguments ({e}); {instead}") from None


class _RankFirst:
    """``fn(rank, *args)`` from :func:`launch`'s ``(rank, world_size, *args)``; picklable when ``fn`` is."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.__qualname__ = getattr(fn, "__qualname__", repr(fn))  # failures name the user's function

    def __call__(self, rank: int, world_size: int, *args):
        return self.fn(rank, *args)


def spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1, join: bool = True, **launch_options) -> List[Any]:
    """``torch.multiprocessing.spawn``'s signature and calling convention, with gsplit's set-up.

    Runs ``fn(rank, *args)`` on ``nprocs`` ranks exactly as ``mp.spawn(fn, args=args, nprocs=nprocs)``
    would, after :func:`launch`'s set-up (process group, the rank's device, error propagation, no orphans);
    the world size is :func:`world_size` in the rank. Returns the ranks' return values (``mp.spawn``
    returns nothing). ``launch_options`` are :func:`launch`'s (``backend``, ``devices``, ``timeout``, ...).
    Only ``join=True`` is supported: the call returns when every rank is done.

    Example:
        >>> def run(rank, x):                      # in an importable module
        ...     return rank + x
        >>> spawn(run, args=(10,), nprocs=2, devices="cpu")  # doctest: +SKIP
        [10, 11]
    """
    if not join:
        raise ValueError("gsplit.spawn supports join=True only (it returns when every rank is done); "
                         "run it in a thread of your own to wait elsewhere")
    _check_signature(fn, 1, tuple(args), "spawn calls fn(rank, *args) as torch.multiprocessing.spawn does",
                     "for fn(rank, world_size, *args) use gsplit.launch(fn, nprocs, args=...)")
    return launch(_RankFirst(fn), nprocs, tuple(args), **launch_options)
