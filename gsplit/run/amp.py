"""Mixed-precision training steps: the layers under ``torch.autocast``, float16's gradient scaler.

``fp32`` runs as before. ``bf16`` / ``fp16`` run the forward (layers and loss) under ``torch.autocast`` on the
rank's device: matrix products in the half dtype, so the activations that the shuffles carry (and their
gradients) are in it too where autocast produces them; master weights, gradients and the optimiser stay
float32, and the gradient all-reduce sums float32 gradients as DDP does. ``fp16`` also scales the loss
(``torch.amp.GradScaler``) so that small gradients do not underflow float16. The scaler unscales and checks
the gradients *after* the all-reduce, when every rank holds the same sums: an inf/nan anywhere is seen by
every rank, so every rank skips the same steps and lowers its scale alike (the ranks' models never part).

Example:
    >>> amp = MixedPrecision("bf16", torch.device("cpu"))
    >>> model = torch.nn.Linear(4, 2)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with amp.autocast():
    ...     loss = model(torch.randn(3, 4)).square().mean()
    >>> amp.backward(loss)
    >>> amp.step(opt)
    True
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Dict, Optional

import torch

from gsplit.data.precision import autocast_dtype

log = logging.getLogger(__name__)


_NATIVE = {torch.bfloat16: ("avx512_bf16", "amx_bf16"), torch.float16: ("avx512_fp16", "amx_fp16")}


def native_half_products(dtype: torch.dtype, cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies ``dtype`` natively (AVX-512 BF16/FP16 or AMX flags in ``/proc/cpuinfo``).

    Example:
        >>> native_half_products(torch.bfloat16, cpuinfo="/nonexistent")
        False
    """
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return any(flag in flags for flag in _NATIVE.get(dtype, ()))


class MixedPrecision:
    """One rank's training precision: its autocast context, backward and optimiser step.

    Args:
        precision: ``"fp32"`` (default: no autocast), ``"bf16"`` or ``"fp16"`` (with a gradient scaler).
        device: the rank's device (autocast's device type).
    """

    def __init__(self, precision: str = "fp32", device: torch.device = torch.device("cpu")):
        self.precision = precision or "fp32"
        self.dtype = autocast_dtype(self.precision)
        self.device = torch.device(device)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.dtype == torch.float16 else None
        first = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0  # said once per job
        if first and self.device.type == "cpu" and self.dtype is not None and not native_half_products(self.dtype):
            log.warning("--precision %s on a CPU without %s: its products run through a slower path than float32 "
                        "(measured on AVX-512 without them: bfloat16 2-3x, float16 27x float32's time), and autocast's "
                        "half-precision copies add memory; half-precision features (--feature-dtype) still halve "
                        "the feature bytes", self.precision, _NATIVE[self.dtype][0])
        self.skipped = 0
        """Optimiser steps skipped so far (float16: inf/nan gradients); the same on every rank."""
        self._pending = []  # per step: whether its scale went down (device booleans, read at the epoch's end)

    def autocast(self):
        """The context to run the forward (layers and loss) in; a no-op for ``fp32``."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, the loss scaled first under ``fp16``."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, opt: torch.optim.Optimizer) -> bool:
        """The optimiser step, after the gradients were summed over the ranks; under ``fp16`` unscaled, skipped
        when any gradient is inf/nan, and the scale updated. Returns True (whether it was skipped is counted in
        :attr:`skipped` without making the host wait: read it after :meth:`settle`)."""
        if self.scaler is None:
            opt.step()
            return True
        before = self.scaler._scale.clone() if getattr(self.scaler, "_scale", None) is not None else None
        self.scaler.step(opt)
        self.scaler.update()
        if before is not None:  # the scale backs off exactly when the step found inf/nan and was skipped
            self._pending.append(self.scaler._scale < before)
        return True

    def settle(self) -> int:
        """Count the skipped steps recorded since the last call (one host read); returns :attr:`skipped`."""
        if self._pending:
            self.skipped += int(torch.stack(self._pending).sum())
            self._pending = []
        return self.skipped

    @property
    def scale(self) -> Optional[float]:
        """The current loss scale (``fp16``), else None."""
        return None if self.scaler is None else float(self.scaler.get_scale())

    def state_dict(self) -> Dict[str, Any]:
        """What a checkpoint keeps: the precision, the scaler's state and the skipped count."""
        return {"precision": self.precision, "skipped": self.settle(),
                "scaler": None if self.scaler is None else self.scaler.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a checkpoint of another precision is refused in one line."""
        saved = state.get("precision", "fp32")
        if saved != self.precision:
            raise ValueError(f"the checkpoint was trained with --precision {saved}, this run asks for "
                             f"{self.precision}; resume with --precision {saved}")
        self.skipped = int(state.get("skipped", 0))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


__all__ = ["MixedPrecision"]
