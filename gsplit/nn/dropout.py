"""Vertex-keyed dropout: the mask of a row depends on its vertex, never on which rank computes it.

``torch.nn.functional.dropout`` draws masks from each process's random state, so split training with
dropout would drop different features than single-process training and the two would only agree in
distribution. Here the mask of vertex ``v`` at layer ``l`` of training step ``t`` is a row of a random
*mask bank* chosen by a counter-based hash of ``(seed, t, l, v)``; every cell of the bank is a counter-based
draw of ``(seed, t, l, cell)`` made on ``h``'s device, identical on every rank and every device type (a
CUDA run drops what a CPU run drops). Two vertices share a mask only
when their hashes pick the same bank row (probability ``1 / bank_rows``), so masks are independent across
vertices up to that small chance.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import nn

from gsplit import ops
from gsplit.ops.aggregate import relu_dropout_rows
from gsplit.ops.rows import place_rows
from gsplit.ops import counter_rng

_SALT = 0xD40D  # keeps dropout streams apart from the sampler's, which use the same counter hash
DEFAULT_BANK_ROWS = 4096


def vertex_dropout(h: torch.Tensor, vertex_ids: torch.Tensor, p: float, seed: int, step: int, layer: int,
                   bank_rows: int = DEFAULT_BANK_ROWS, bank: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dropout of rows ``h[i]`` (vertex ``vertex_ids[i]``) that every rank draws alike.

    Example:
        >>> h = torch.ones(4, 8)
        >>> a = vertex_dropout(h, torch.tensor([3, 9, 4, 7]), 0.5, seed=0, step=1, layer=0)
        >>> b = vertex_dropout(h[[1, 3]], torch.tensor([9, 7]), 0.5, seed=0, step=1, layer=0)
        >>> torch.equal(a[[1, 3]], b)          # the same vertex gets the same mask, wherever it is
        True
    """
    if p == 0.0 or h.numel() == 0:
        _check_p(p)
        return h
    rows, bank = _mask_rows(h, vertex_ids, p, seed, step, layer, bank_rows, bank)
    # Scale the (small) bank, not the rows: one product over h forward and one backward instead of two. The
    # mask is 0 or 1, so h * (mask * s) has the bits of (h * mask) * s.
    return h * (bank.to(h.dtype) * _scale(p)).index_select(0, rows)


def relu_vertex_dropout(h: torch.Tensor, vertex_ids: torch.Tensor, p: float, seed: int, step: int, layer: int,
                        bank_rows: int = DEFAULT_BANK_ROWS, bank: Optional[torch.Tensor] = None,
                        place: Optional[Tuple[int, torch.Tensor]] = None) -> torch.Tensor:
    """``vertex_dropout(relu(h), ...)`` with the same bits, in one pass on CPU (``ops.aggregate.relu_dropout_rows``):
    what gsplit's models apply between layers. On a 30k x 256 layer output it replaces ReLU, a gather of the
    mask rows and a product, forward and backward, by one fused pass each. ``place=(num_rows, pos)``: the result
    placed as :func:`gsplit.ops.rows.place_rows` places it (the kernel writes the rows there directly).

    Example:
        >>> h = torch.randn(4, 8)
        >>> ids = torch.tensor([3, 9, 4, 7])
        >>> torch.equal(relu_vertex_dropout(h, ids, 0.5, 0, 1, 0), vertex_dropout(torch.relu(h), ids, 0.5, 0, 1, 0))
        True
    """
    if p == 0.0 or h.numel() == 0 or h.dim() != 2:  # vertex_dropout checks p
        out = vertex_dropout(torch.relu(h), vertex_ids, p, seed, step, layer, bank_rows, bank)
        return out if place is None else place_rows(out, *place)
    rows, bank = _mask_rows(h, vertex_ids, p, seed, step, layer, bank_rows, bank)
    return relu_dropout_rows(h, rows, bank, _scale(p), place)


def _check_p(p: float) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p={p}; it must be in [0, 1)")


def _mask_rows(h: torch.Tensor, vertex_ids: torch.Tensor, p: float, seed: int, step: int, layer: int, bank_rows: int,
               bank: Optional[torch.Tensor]):
    """``(rows, bank)``: each row's index into the 0/1 mask bank; row ``i`` keeps ``bank[rows[i]]`` (times the
    scale)."""
    _check_p(p)
    if vertex_ids.numel() != h.shape[0]:
        raise ValueError(f"h has {h.shape[0]} rows but {vertex_ids.numel()} vertex ids were given; pass one id per row")
    key = counter_rng.stream_key(seed ^ _SALT, step, layer, 0)
    if bank is None:
        bank = dropout_bank(h, p, seed, step, layer, bank_rows)
    rows = counter_rng.draw_below(counter_rng.vertex_keys(key, vertex_ids.to(h.device)), 0, bank.shape[0])
    return rows, bank


def _scale(p: float) -> float:
    return 1.0 / (1.0 - p)


def dropout_bank(h: torch.Tensor, p: float, seed: int, step: int, layer: int,
                 bank_rows: int = DEFAULT_BANK_ROWS, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The mask bank :func:`vertex_dropout` draws for rows like ``h`` (pass it as ``bank=`` to draw it once for
    several calls of one step and layer, e.g. the two parts of an overlapped layer), of zeros and ones in ``dtype``
    (default ``h``'s; ``torch.bool``: the cells as drawn, which the CPU kernel of :func:`relu_vertex_dropout` reads
    directly, without converting 4096 x 256 cells per layer and step).

    Example:
        >>> h = torch.ones(4, 8)
        >>> bank = dropout_bank(h, 0.5, seed=0, step=1, layer=0)
        >>> torch.equal(vertex_dropout(h, torch.arange(4), 0.5, 0, 1, 0, bank=bank),
        ...             vertex_dropout(h, torch.arange(4), 0.5, 0, 1, 0))
        True
    """
    # Every cell of the bank is a counter-based draw of (seed, step, layer, cell) in integer arithmetic, made where
    # h is: every rank and every device type get the same masks (a CUDA run drops what a CPU run drops) with no
    # host work or copy on a GPU. The first GPU run found split parity failing when the bank came from the
    # GPU's own generator; drawing it on the host instead costs 12 ms of host time per layer (4096 x 256,
    # torch.rand on one thread, quiet), the compiled CPU kernel 3.4 ms, torch's integer ops on the CPU 57 ms
    # (the fallback without a compiler).
    key = counter_rng.stream_key(seed ^ _SALT, step, layer, 1)  # 1: apart from the row choice's stream (0)
    cells = bank_rows * math.prod(h.shape[1:])
    keep = ops.keep_cells(key, cells, counter_rng.keep_threshold(p), h.device)
    return keep.view((bank_rows,) + tuple(h.shape[1:])).to(dtype or h.dtype)


class SteppedModel(nn.Module):
    """A split-aware model (its forward shuffles itself through ``sp_forward``) whose vertex dropout is keyed by a
    training-step counter ``step``, which travels with ``state_dict()`` so that a reloaded model draws the masks an
    uninterrupted run would (checkpoints resume exactly). Subclasses hold ``layers`` and ``step``."""

    split_aware = True
    """Its forward shuffles itself (``sp_forward``): ``gsplit.SplitParallel`` must not add shuffles."""

    def get_extra_state(self) -> dict:
        return {"step": self.step}

    def set_extra_state(self, state: dict) -> None:
        self.step = int(state["step"])

    @property
    def num_layers(self) -> int:
        return len(self.layers)
