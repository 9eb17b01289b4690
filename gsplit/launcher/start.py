"""Start one process per rank, set up ``torch.distributed``, collect results, and propagate failures.

``launch(fn, nprocs, args)`` runs ``fn(rank, world_size, *args)`` in ``nprocs`` fresh processes (the
``spawn`` start method, so CUDA works in them) and returns their return values in rank order. With
CUDA GPUs each rank owns one GPU and the ranks talk over NCCL; without, ranks are CPU processes over
gloo. When a rank fails, the other ranks may be stuck in a collective waiting for it, so the launcher
does not wait for them: it reports the failure, terminates (then kills) the rest, and raises
:class:`LaunchError` naming the failing rank and carrying its traceback.

Because ranks start with ``spawn``, ``fn`` and ``args`` must be picklable: ``fn`` a top-level function
of an importable module (not a lambda or a nested function), and a script that calls ``launch`` must
guard the call with ``if __name__ == "__main__":``. ``start_method="forkserver"`` (or the environment
variable ``GSPLIT_START_METHOD=forkserver``) forks the ranks from one server process that imported torch
and gsplit once, instead of each rank importing them anew (2-4 s of CPU per rank): the same rules, ranks
that start sooner where cores are few.

Two calling conventions, two names, so that the difference cannot be missed: :func:`launch` passes the
world size after the rank, ``fn(rank, world_size, *args)``; :func:`spawn` takes the arguments of
``torch.multiprocessing.spawn`` and calls ``fn(rank, *args)`` as it does (the world size is then
:func:`world_size`). Both check ``fn``'s signature against the arguments before starting any process.
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import wait as mp_wait
from typing import Any, Callable, List, Optional, Sequence, Union

import torch
import torch.distributed as dist

from gsplit.runtime import resources
from gsplit.comm import teardown, waits
from gsplit.launcher.failures import (LaunchError, LaunchInterrupted, RankFailure, _death_message,
                                    _is_communication_error, _pick_root_cause)
from gsplit.launcher.rank import _ENV_DEVICE, init_process_group, limit_threads
from gsplit.launcher.rendezvous import _bind_to_loopback, _listen_socket
from gsplit.launcher.start_method import LauncherState, leave_the_fork_server, start_context, start_fork_server
from gsplit.launcher.watch import _POLL_S, _SLOTS, _die_with_parent, _stop_on_signals, _watch_rank, _Watchdog

log = logging.getLogger(__name__)

# After the first failure, how long to keep listening for the other ranks' reports before killing them
# (lets a simultaneous, earlier root cause win over its follow-up communication errors).
_DRAIN_S = 0.5
# How long terminated ranks get to exit before SIGKILL.
_KILL_GRACE_S = 3.0
# How long ranks that delivered their results get to exit (barrier, destroy_process_group) before SIGTERM,
# counted from the last result: nothing is left to wait for but teardown (well under a second on CPU ranks).
# A rank also ends itself that long after its barrier (gsplit.comm.teardown), without needing the GIL.
_EXIT_GRACE_S = 5.0


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
                master_addr: str, port: int, timeout: float, conn, parent_pid: Optional[int], slots,
                launcher: LauncherState) -> None:
    """Entry point of a rank's process: set up, run ``fn``, send back ``("ok", result)`` or an error.

    ``parent_pid``: the launching process, or ``None`` when the fork server forked the rank (then its parent is
    the server, which ends once the launcher has); ``launcher``: the launcher's environment and stdout/stderr.
    """
    launcher.adopt()
    if parent_pid is None:
        leave_the_fork_server()
        parent_pid = os.getppid()
    watch = _watch_rank(slots, rank)
    waits.mark_work_waits()  # user code's Work.wait() (async_op=True) shows as waiting for peers too
    teardown.guard_destroy()  # user code's destroy_process_group() lets gloo's workers free their tensors first
    _die_with_parent(parent_pid, watch)
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


def launch(fn: Callable[..., Any], nprocs: int, args: tuple = (), backend: Optional[str] = None,
           devices: Union[None, str, Sequence[Union[str, torch.device]]] = None, timeout: float = 1800,
           master_port: Optional[int] = None, spawn: bool = True, progress_timeout: float = 600,
           heartbeat_timeout: float = 120, master_addr: str = "127.0.0.1",
           start_method: Optional[str] = None) -> List[Any]:
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
        start_method: ``"spawn"`` (each rank a fresh interpreter, as ``torch.multiprocessing.spawn``) or
            ``"forkserver"`` (ranks forked from a server that imported torch and gsplit once per launching
            process: each rank starts 2-4 s of CPU sooner, which counts on a host with few cores; OpenMP's
            settings are those of the launch that started the server). ``None``: the environment variable
            ``GSPLIT_START_METHOD``, else ``"spawn"``. Either way ``fn`` is pickled by reference and the
            ranks see this process's environment as it is at the call.

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
    ctx = start_context(start_method)
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
            forked = ctx.get_start_method() == "forkserver"
            if forked:
                start_fork_server(ctx)
            launcher = LauncherState.now()
            for rank in range(nprocs):
                reader, writer = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_child_main, name=f"gsplit-rank{rank}",
                                args=(rank, nprocs, fn, tuple(args), str(devs[rank]), backend, master_addr, port,
                                      float(timeout), writer, None if forked else os.getpid(), slots, launcher))
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
