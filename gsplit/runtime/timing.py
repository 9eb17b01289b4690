"""Timing a step of GPU work without making the host wait for the GPU.

``torch.cuda.synchronize(device)`` after every step would time it, but it waits for *every* stream of
the device: the prefetch thread's side stream and the sampling group's NCCL stream too. That removes the
overlap prefetching exists for and books the prefetch time as training time. :class:`StepTimer` records
a pair of CUDA events on the current stream around each step instead, and reads them only once they
have completed (``Event.query()`` does not block) or where the host waits anyway (the end of an epoch).
:class:`LayerClock` does the same inside a step, for each layer's forward and backward (marks in
:func:`gsplit.sp_forward`'s loops and identity autograd nodes whose backward marks), so the run log can
say which layer a slow rank is slow in (``trainer.iteration_balance``).

:func:`timed_step` times a one-off setup step instead (pinning a table, copying the graph to a GPU,
filling a cache): its time at INFO when it ends, and progress lines while it runs long, so a stall says
where it is.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Iterator, List, Optional, Tuple

import torch

log = logging.getLogger(__name__)


class SetupStep:
    """A running :func:`timed_step`: ``update(done, total)`` says how far it is (shown in progress lines),
    ``note`` is appended to its final log line, ``seconds`` is the time so far."""

    def __init__(self, what: str, unit: str = "GiB", scale: float = 2.0**30):
        self.what = what
        self.unit = unit
        self.scale = scale
        self.done: Optional[float] = None
        self.total: Optional[float] = None
        self.note = ""
        """Appended to the step's final log line (e.g. what it fell back to, or a rate)."""
        self.started = time.monotonic()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def update(self, done: float, total: float) -> None:
        """``done`` of ``total`` (in the step's base unit, bytes by default) are finished."""
        self.done, self.total = float(done), float(total)

    def progress(self) -> str:
        if self.done is None or not self.total:
            return ""
        return (f" ({self.done / self.scale:.2f} of {self.total / self.scale:.2f} {self.unit}, "
                f"{100 * self.done / self.total:.0f} %)")


@contextlib.contextmanager
def timed_step(what: str, *, logger: Optional[logging.Logger] = None, progress_after: float = 5.0,
               every: float = 5.0, warn_after: float = 30.0, unit: str = "GiB",
               scale: float = 2.0**30) -> Iterator[SetupStep]:
    """Time a setup step: one INFO line with its seconds when it ends, progress lines while it runs long.

    A step that blocks in a single call (a driver call, a copy) cannot report on itself, so a watchdog
    thread logs ``still <what>: N s so far`` at INFO every ``every`` seconds once ``progress_after``
    have passed, with the step's progress (:meth:`SetupStep.update`) when it has one, and one WARNING
    line once ``warn_after`` seconds have passed: a stall then says where it is, also without ``-v``.

    Example:
        >>> with timed_step("counting to three") as step:
        ...     for i in range(3):
        ...         step.update(i + 1, 3)
        >>> round(step.seconds) == 0 and step.done == 3
        True
    """
    logger = logger or log
    step = SetupStep(what, unit, scale)
    stop = threading.Event()

    def watch() -> None:
        warned = False
        wait = progress_after
        while not stop.wait(wait):
            elapsed = step.seconds
            if not warned and elapsed >= warn_after:
                warned = True
                logger.warning("%s has taken %.0f s so far%s", what, elapsed, step.progress())
            else:
                logger.info("still %s: %.0f s so far%s", what, elapsed, step.progress())
            wait = every if warned or elapsed + every < warn_after else max(0.01, warn_after - elapsed)

    watcher = threading.Thread(target=watch, name=f"timed_step: {what}", daemon=True)
    watcher.start()
    try:
        yield step
    finally:
        stop.set()
        watcher.join()
    logger.info("%s took %.2f s%s", what, step.seconds, f" ({step.note})" if step.note else "")


class _Stamps:
    """What both clocks share: a stamp is ``perf_counter()`` on a CPU, a CUDA event recorded on the current
    stream on a GPU (an enqueue: the host does not wait), and the seconds between two stamps."""

    def __init__(self, device: torch.device, event_factory: Optional[Callable[[], Any]] = None):
        self.on_gpu = torch.device(device).type == "cuda"
        self._device = torch.device(device)
        self._event = event_factory or (lambda: torch.cuda.Event(enable_timing=True))

    def _stamp(self) -> Any:
        if not self.on_gpu:
            return time.perf_counter()
        event = self._event()
        event.record(torch.cuda.current_stream(self._device))
        return event

    def _elapsed(self, start: Any, end: Any) -> float:
        """Seconds from ``start`` to ``end`` (on a GPU both events must have completed)."""
        return start.elapsed_time(end) / 1000.0 if self.on_gpu else end - start


class StepTimer(_Stamps):
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
        super().__init__(device, event_factory)
        self._start: Any = None
        self._pending: Deque[Tuple[Any, Any, Any]] = deque()  # (key, start event, end event) in stream order
        self._done: List[Tuple[Any, float]] = []

    def start(self) -> None:
        self._start = self._stamp()

    def stop(self, key: Any) -> None:
        if self._start is None:
            raise RuntimeError("StepTimer.stop() without start(); call start() before the step")
        end = self._stamp()
        if self.on_gpu:
            self._pending.append((key, self._start, end))
        else:
            self._done.append((key, self._elapsed(self._start, end)))
        self._start = None

    def ready(self) -> List[Tuple[Any, float]]:
        """The steps whose end the GPU has reached, oldest first, as ``(key, seconds)``; never waits."""
        # events on one stream complete in order: stop at the first one still pending
        while self._pending and self._pending[0][2].query():
            key, start, end = self._pending.popleft()
            self._done.append((key, self._elapsed(start, end)))
        done, self._done = self._done, []
        return done

    def finish(self) -> List[Tuple[Any, float]]:
        """Every step not returned yet; waits for the last one's end event (only where the host waits anyway)."""
        if self._pending:
            self._pending[-1][2].synchronize()
        return self.ready()


LayerLabel = Optional[Tuple[str, int]]
"""What the time after a mark is spent on: ``("fwd", i)`` / ``("bwd", i)`` (layer ``i``'s compute, forward or
backward) or ``None`` (anything else: shuffles, waits for peers, the loss, the optimiser)."""


@dataclass
class LayerSeconds:
    """Seconds one rank spent computing each layer in one training step (marks of a :class:`LayerClock`)."""

    forward: List[float] = field(default_factory=list)
    """Per layer (input layer first): its forward, with the activation and dropout that follow it; the
    shuffles before it and the waits for peers are left out."""
    backward: List[float] = field(default_factory=list)
    """Per layer: its backward, from the moment its output's gradient is complete to its input's; the
    shuffles' backward and the waits for returning gradients are left out."""


class LayerClock(_Stamps):
    """Seconds each layer computes, forward and backward, per training step, without host-device syncs.

    The forward code calls :meth:`mark` where a layer's compute starts (``("fwd", i)``) and stops
    (``None``: a shuffle or a wait follows), and passes tensors through :meth:`on_backward`, an identity
    whose backward marks where the gradient reaches that point (autograd runs a layer's backward as one
    stretch between the gradient of its output and that of its input). The time from one mark to the next
    is booked to the first one's label; :meth:`close` ends a step. On a CPU a mark is ``perf_counter``; on
    a GPU a CUDA event recorded on the current stream (so a mark costs an enqueue, and a wait for a peer
    that stalls the stream is booked to the ``None`` stretch it is in), read like :class:`StepTimer`'s:
    only once the step's events have completed (``ready()``, never waits) or where the host waits anyway
    (``finish()``, the epoch's end).

    Args:
        device: where the layers compute.
        event_factory: makes a timing event (default ``torch.cuda.Event(enable_timing=True)``); tests
            pass a fake one.

    Example:
        >>> clock = LayerClock(torch.device("cpu"))
        >>> x = clock.on_backward(torch.ones(3, requires_grad=True), None)   # layer 0's backward ends here
        >>> clock.mark(("fwd", 0)); y = clock.on_backward((2 * x).sum(), ("bwd", 0)); clock.mark(None)
        >>> y.backward(); clock.close("it0")
        >>> [(key, len(s.forward), len(s.backward)) for key, s in clock.ready()]
        [('it0', 1, 1)]
    """

    def __init__(self, device: torch.device, event_factory: Optional[Callable[[], Any]] = None):
        super().__init__(device, event_factory)
        self._marks: List[Tuple[LayerLabel, Any]] = []
        self._pending: Deque[Tuple[Any, List[Tuple[LayerLabel, Any]]]] = deque()

    def mark(self, label: LayerLabel) -> None:
        """From now on the time is ``label``'s (``("fwd", i)``, ``("bwd", i)`` or ``None``)."""
        self._marks.append((label, self._stamp()))

    def on_backward(self, h: torch.Tensor, label: LayerLabel) -> torch.Tensor:
        """``h`` itself, whose backward marks ``label`` once ``h``'s gradient is complete (a tensor that needs
        no gradient is returned as it is: its backward never runs)."""
        if not (torch.is_grad_enabled() and h.requires_grad):
            return h
        return _BackwardMark.apply(h, self, label)

    def close(self, key: Any) -> None:
        """End the step ``key``: the time since the last mark is nobody's; the next mark starts a new step."""
        self.mark(None)
        marks, self._marks = self._marks, []
        self._pending.append((key, marks))

    def ready(self) -> List[Tuple[Any, LayerSeconds]]:
        """The closed steps whose marks the GPU has passed, oldest first, as ``(key, LayerSeconds)``; never waits."""
        done = []
        while self._pending and (not self.on_gpu or all(stamp.query() for _, stamp in self._pending[0][1])):
            key, marks = self._pending.popleft()
            done.append((key, self._seconds(marks)))
        return done

    def finish(self) -> List[Tuple[Any, LayerSeconds]]:
        """Every closed step not returned yet; waits for the last mark (only where the host waits anyway)."""
        if self.on_gpu:
            for _, marks in self._pending:
                for _, stamp in marks:
                    stamp.synchronize()
        return self.ready()

    def _seconds(self, marks: List[Tuple[LayerLabel, Any]]) -> LayerSeconds:
        out = LayerSeconds()
        for (label, start), (_, end) in zip(marks, marks[1:]):
            if label is None:
                continue
            phase, layer = label
            times = out.forward if phase == "fwd" else out.backward
            times.extend([0.0] * (layer + 1 - len(times)))
            times[layer] += self._elapsed(start, end)
        n = max(len(out.forward), len(out.backward))
        out.forward.extend([0.0] * (n - len(out.forward)))
        out.backward.extend([0.0] * (n - len(out.backward)))
        return out


class _BackwardMark(torch.autograd.Function):
    """Identity; its backward marks a :class:`LayerClock` when the gradient arrives."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, clock: LayerClock, label: LayerLabel) -> torch.Tensor:
        ctx.clock, ctx.label = clock, label
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.clock.mark(ctx.label)
        return grad, None, None


def layer_starts(clock: Optional[LayerClock], i: int, h: torch.Tensor) -> torch.Tensor:
    """Layer ``i`` computes from ``h`` now: mark its forward, and its backward's end at ``h``'s gradient.
    ``clock=None``: nothing is timed, ``h`` is returned as it is."""
    if clock is None:
        return h
    h = clock.on_backward(h, None)
    clock.mark(("fwd", i))
    return h


def layer_ends(clock: Optional[LayerClock], i: int, h: torch.Tensor) -> torch.Tensor:
    """Layer ``i`` made ``h``: its forward stops, its backward starts when ``h``'s gradient is complete."""
    if clock is None:
        return h
    clock.mark(None)
    return clock.on_backward(h, ("bwd", i))
