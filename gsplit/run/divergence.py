"""A diverging run stops at the iteration it diverged, named: :func:`check_loss` on the CPU at once, and
:class:`LossWatch` on a GPU without a host-device sync per iteration (the loss is read behind an event).
"""

from __future__ import annotations

import math

import torch

__all__ = ["check_loss", "LossWatch"]


def check_loss(cfg, value: float, rank: int, epoch: int, iteration: int, step: int) -> None:
    """Stop a run whose loss is NaN/inf or exploded, naming the rank and the iteration. ``cfg``: the run's
    :class:`~gsplit.run.trainer.TrainConfig` (its ``max_loss`` and ``lr``).

    Example:
        >>> from types import SimpleNamespace
        >>> check_loss(SimpleNamespace(max_loss=0.0, lr=0.01), 0.7, 0, 0, 3, 3)  # finite: nothing happens
        >>> check_loss(SimpleNamespace(max_loss=0.0, lr=0.01), float("nan"), 1, 0, 3, 3)
        Traceback (most recent call last):
        FloatingPointError: rank 1: the loss is nan at epoch 0, iteration 3 (step 3): training diverged; lower the learning rate (lr 0.01) or check the input features for huge values; the last checkpoint, if any, predates it
    """
    if math.isfinite(value) and not (cfg.max_loss and value > cfg.max_loss):
        return
    what = f"is {value}" if not math.isfinite(value) else f"is {value:.3g}, above max_loss {cfg.max_loss:g}"
    raise FloatingPointError(f"rank {rank}: the loss {what} at epoch {epoch}, iteration {iteration} (step {step}): "
                             f"training diverged; lower the learning rate (lr {cfg.lr:g}) or check the input "
                             f"features for huge values; the last checkpoint, if any, predates it")


class LossWatch:
    """Stops a diverging run (:func:`check_loss`) without making the host wait for the device.

    On the CPU each loss is checked at once. On a GPU it is copied to pinned host memory behind an event
    and checked when that event has passed (usually an iteration later), so the loop keeps no sync.
    """

    def __init__(self, cfg, rank: int, device: torch.device):
        self.cfg, self.rank, self.cuda = cfg, rank, device.type == "cuda"
        self.pending: list = []  # (host copy, event, epoch, iteration, step)

    def push(self, loss: torch.Tensor, epoch: int, iteration: int, step: int) -> None:
        if not self.cuda:
            check_loss(self.cfg, float(loss.detach()), self.rank, epoch, iteration, step)
            return
        host = torch.empty((), dtype=loss.dtype, pin_memory=True)
        host.copy_(loss.detach(), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.pending.append((host, event, epoch, iteration, step))
        while self.pending and self.pending[0][1].query():
            self._check(self.pending.pop(0))

    def flush(self) -> None:
        """Check what is still pending (at an epoch's end, where the loop waits for the device anyway)."""
        for item in self.pending:
            item[1].synchronize()
            self._check(item)
        self.pending.clear()

    def _check(self, item) -> None:
        host, _, epoch, iteration, step = item
        check_loss(self.cfg, float(host), self.rank, epoch, iteration, step)
