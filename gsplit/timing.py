"""Timing a step of GPU work without making the host wait for the GPU.

``torch.cuda.synchronize(device)`` after every step would time it, but it waits for *every* stream of
the device: the prefetch thread's side stream and the sampling group's NCCL stream too. That removes the
overlap prefetching exists for and books the prefetch time as training time. :class:`StepTimer` records
a pair of CUDA events on the current stream around each step instead, and reads them only once they
have completed (``Event.query()`` does not block) or where the host waits anyway (the end of an epoch).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Tuple

import torch


class StepTimer:
    """Seconds of timed steps: the host clock on a CPU, CUDA events on the current stream on a GPU.

    ``start()`` / ``stop(key)`` bracket a step; ``ready()`` returns ``(key, seconds)`` of the steps whose
    end has been reached, without waiting; ``finish()`` waits for the last step (its end event on the
    current stream, not the whole device) and returns the rest. On a CPU each step is ready at ``stop``.

    Args:
        device: where the steps compute.
        event_factory: makes a timing event (default ``torch.cuda.Event(enable_timing=True)``); tests
            pass a fake one.

    Example:
        >>> timer = StepTimer(torch.device("cpu"))
        >>> timer.start(); timer.stop("it0")
        >>> [key for key, seconds in timer.ready()]
        ['it0']
        >>> timer.finish()
        []
    """

    def __init__(self, device: torch.device, event_factory: Optional[Callable[[], Any]] = None):
        self.on_gpu = torch.device(device).type == "cuda"
        self._device = torch.device(device)
        self._event = event_factory or (lambda: torch.cuda.Event(enable_timing=True))
        self._start: Any = None
        self._pending: Deque[Tuple[Any, Any, Any]] = deque()  # (key, start event, end event) in stream order
        self._done: List[Tuple[Any, float]] = []

    def start(self) -> None:
        if self.on_gpu:
            self._start = self._event()
            self._start.record(torch.cuda.current_stream(self._device))
        else:
            self._start = time.perf_counter()

    def stop(self, key: Any) -> None:
        if self._start is None:
            raise RuntimeError("StepTimer.stop() without start(); call start() before the step")
        if self.on_gpu:
            end = self._event()
            end.record(torch.cuda.current_stream(self._device))
            self._pending.append((key, self._start, end))
        else:
            self._done.append((key, time.perf_counter() - self._start))
        self._start = None

    def ready(self) -> List[Tuple[Any, float]]:
        """The steps whose end the GPU has reached, oldest first, as ``(key, seconds)``; never waits."""
        # events on one stream complete in order: stop at the first one still pending
        while self._pending and self._pending[0][2].query():
            key, start, end = self._pending.popleft()
            self._done.append((key, start.elapsed_time(end) / 1000.0))
        done, self._done = self._done, []
        return done

    def finish(self) -> List[Tuple[Any, float]]:
        """Every step not returned yet; waits for the last one's end event (only where the host waits anyway)."""
        if self._pending:
            self._pending[-1][2].synchronize()
        return self.ready()
