"""Vertex-keyed dropout: the mask of a row depends on its vertex, never on which rank computes it.

``torch.nn.functional.dropout`` draws masks from each process's random state, so split training with
dropout would drop different features than single-process training and the two would only agree in
distribution. Here the mask of vertex ``v`` at layer ``l`` of training step ``t`` is a row of a random
*mask bank* chosen by a counter-based hash of ``(seed, t, l, v)``; the bank's cells are counter-based
draws of ``(seed, t, l, cell)`` too, made where ``h`` is (on the GPU: no host work, no copy, no sync), and
the same on every rank and every device. Two vertices share a mask only when their hashes pick the same
bank row (probability ``1 / bank_rows``), so masks are independent across vertices up to that small chance.
"""

from __future__ import annotations

import math

import torch

from gsplit.sampling import counter_rng

_SALT = 0xD40D  # keeps dropout streams apart from the sampler's, which use the same counter hash
DEFAULT_BANK_ROWS = 4096


def vertex_dropout(h: torch.Tensor, vertex_ids: torch.Tensor, p: float, seed: int, step: int, layer: int,
                   bank_rows: int = DEFAULT_BANK_ROWS) -> torch.Tensor:
    """Dropout of rows ``h[i]`` (vertex ``vertex_ids[i]``) that every rank draws alike.

    Example:
        >>> h = torch.ones(4, 8)
        >>> a = vertex_dropout(h, torch.tensor([3, 9, 4, 7]), 0.5, seed=0, step=1, layer=0)
        >>> b = vertex_dropout(h[[1, 3]], torch.tensor([9, 7]), 0.5, seed=0, step=1, layer=0)
        >>> torch.equal(a[[1, 3]], b)          # the same vertex gets the same mask, wherever it is
        True
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p={p}; it must be in [0, 1)")
    if p == 0.0 or h.numel() == 0:
        return h
    if vertex_ids.numel() != h.shape[0]:
        raise ValueError(f"h has {h.shape[0]} rows but {vertex_ids.numel()} vertex ids were given; pass one id per row")
    key = counter_rng.stream_key(seed ^ _SALT, step, layer, 0)
    bank_key = counter_rng.stream_key(seed ^ _SALT, step, layer, 1)
    cells = torch.arange(bank_rows * math.prod(h.shape[1:]), device=h.device)
    # a cell is kept with probability 1 - p (to 2**-24): its draw is uniform in [0, 2**24)
    draws = counter_rng.draw_below(counter_rng.vertex_keys(bank_key, cells), 0, 1 << 24)
    bank = (draws >= math.ceil(p * (1 << 24))).to(h.dtype).view((bank_rows,) + tuple(h.shape[1:]))
    rows = counter_rng.draw_below(counter_rng.vertex_keys(key, vertex_ids.to(h.device)), 0, bank_rows)
    return h * bank.index_select(0, rows) * (1.0 / (1.0 - p))
