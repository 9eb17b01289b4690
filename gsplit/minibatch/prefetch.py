"""Prefetching: a background thread prepares the next mini-batches while the current one trains.

The consumer *grants* batches and the thread prepares exactly the granted ones, in order. Credits, not
timing, decide how much is prepared, so on every rank the thread runs the same collectives even when
the consumer stops early. On CUDA the thread works on a side stream and hands each batch over with an
event. The preparing function must use a process group of its own (see :mod:`gsplit.minibatch.loader`).

NCCL (``exclusive_collectives``): issuing operations on two NCCL communicators of one GPU from two
threads at once is not safe, and collectives of different groups must be issued in the same order on
every rank (NCCL's "Using multiple NCCL communicators concurrently"; the warning on
``torch.distributed.new_group``). So the thread then prepares only while the consumer waits in
:meth:`Producer.get`, and ``get`` returns once every granted batch is prepared: on every rank the order
is "sampling collectives of the granted batches, then the consumer's step", and no two threads issue
at once. The overlap stays where it matters on a GPU: the thread's host work and its side stream run
while the GPU still executes the step the consumer issued before (a step that does not wait on the
device in between, see :class:`gsplit.runtime.timing.StepTimer`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch

from gsplit.comm.waits import waiting_for_thread

log = logging.getLogger(__name__)

PREFETCH_DEPTH = 1
"""Mini-batches the background thread prepares ahead of the one being trained on."""


@dataclass
class _Failure:
    """An exception raised in the prefetching thread, to re-raise in the consumer."""

    exc: BaseException


_END = object()


class Producer:
    """The prefetching thread of one pass: prepares item ``j`` once the consumer has granted it.

    ``batches(epoch)`` yields the items of the pass (e.g. a loader's macrobatches of ``(iteration, seeds)``
    pairs) and ``prepare(epoch, item)`` makes one ready; the result gets a ``ready`` event on CUDA.
    The consumer grants items (``grant``); the thread prepares exactly the granted ones, in order,
    and puts them into a bounded queue. ``stop`` lets it finish what was granted (its collectives are
    matched by the other ranks' threads, which got the same grants) and joins it.
    """

    def __init__(self, prepare: Callable[[int, Any], Any], batches: Callable[[int], Iterable[Any]],
                 epoch: int, device: torch.device, rank: int = 0, exclusive_collectives: bool = False):
        self._prepare = prepare
        # True: prepare only while the consumer waits in get() (collectives over NCCL, see the module doc);
        # between grant() and get() the consumer must issue no collective.
        self._exclusive = exclusive_collectives
        self._waiting_for: Optional[int] = None  # the batch the thread waits to be granted, while it waits
        self._ended = False
        self._batches = batches
        self._epoch = epoch
        self._device = device
        # Never full: at most PREFETCH_DEPTH + 1 batches are granted and not yet taken, plus the end mark.
        self._queue: "queue.Queue" = queue.Queue(maxsize=PREFETCH_DEPTH + 2)
        self._cond = threading.Condition()
        self._granted = 0
        self._stopping = False
        self._consumer_stream = None
        if device.type == "cuda":
            self._consumer_stream = torch.cuda.current_stream(device)
        self._thread = threading.Thread(target=self._run, name=f"gsplit-prefetch-rank{rank}", daemon=True)

    def start(self) -> None:
        self._thread.start()
        # At interpreter exit, finish the thread's granted work before the interpreter tears down:
        # a daemon thread still inside torch when it is killed aborts the process.
        atexit.register(self.stop)

    def grant(self, n: int) -> None:
        with self._cond:
            if n > self._granted:
                self._granted = n
                self._cond.notify_all()

    def _granted_batch(self, j: int) -> bool:
        with self._cond:
            self._waiting_for = j
            self._cond.notify_all()  # a consumer in get() may wait for this thread to be idle
            while j >= self._granted and not self._stopping:
                self._cond.wait()
            self._waiting_for = None
            return j < self._granted

    def _wait_idle(self) -> None:
        """Until the thread has prepared every granted batch (it waits for a grant) or has ended."""
        with self._cond:
            while not (self._ended or (self._waiting_for is not None and self._waiting_for >= self._granted)):
                if not self._thread.is_alive():
                    return
                self._cond.wait(timeout=1.0)

    def _run(self) -> None:
        try:
            stream, ctx = None, contextlib.nullcontext()
            if self._consumer_stream is not None:
                torch.cuda.set_device(self._device)  # the current device is per thread
                stream = torch.cuda.Stream(self._device)
                # what the consumer queued before (cache fill, graph copy) must be done before we read it
                stream.wait_stream(self._consumer_stream)
                ctx = torch.cuda.stream(stream)
            with ctx:
                for j, work in enumerate(self._batches(self._epoch)):
                    if not self._granted_batch(j):
                        break
                    item = self._prepare(self._epoch, work)
                    if stream is not None:
                        item.ready = torch.cuda.Event()
                        item.ready.record(stream)
                    self._queue.put(item)
        except BaseException as exc:  # noqa: BLE001 - everything must reach the consumer
            self._queue.put(_Failure(exc))
        else:
            self._queue.put(_END)
        finally:
            with self._cond:
                self._ended = True
                self._cond.notify_all()

    def get(self):
        """The next batch; re-raises the thread's exception. With ``exclusive_collectives``, returns only
        once the thread has prepared every granted batch (its collectives are all issued)."""
        # the consumer waits on this thread: it waits for peers exactly when the thread does (gsplit.launch)
        with waiting_for_thread(self._thread):
            if self._exclusive:
                self._wait_idle()
            return self._next_item()

    def _next_item(self):
        while True:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the prefetching thread ended without a batch or an error") from None
                continue
            if isinstance(item, _Failure):
                raise item.exc
            if item is _END:
                raise RuntimeError("the prefetching thread ended before the epoch's last batch")
            return item

    def stop(self) -> None:
        """Finish the granted batches and join the thread (no-op when it has ended)."""
        atexit.unregister(self.stop)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            with waiting_for_thread(self._thread):
                self._thread.join()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Failure):
                log.warning("preparing a prefetched mini-batch that was not consumed failed: %s: %s",
                            type(item.exc).__name__, item.exc)
