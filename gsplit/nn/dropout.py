"""Vertex-keyed dropout: the mask of a row depends on its vertex, never on which rank computes it.

``torch.nn.functional.dropout`` draws masks from each process's random state, so split training with
dropout would drop different features than single-process training and the two would only agree in
distribution. Here the mask of vertex ``v`` at layer ``l`` of training step ``t`` is a row of a random
*mask bank* chosen by a counter-based hash of ``(seed, t, l, v)``; the bank is drawn on the host from a
generator seeded by ``(seed, t, l)`` and copied to ``h``'s device, identical on every rank and every device
type (a CUDA run drops what a CPU run drops). Two vertices share a mask only
when their hashes pick the same bank row (probability ``1 / bank_rows``), so masks are independent across
vertices up to that small chance.
"""

from __future__ import annotations

from typing import Optional

import torch

from gsplit.sampling import counter_rng

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
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p={p}; it must be in [0, 1)")
    if p == 0.0 or h.numel() == 0:
        return h
    if vertex_ids.numel() != h.shape[0]:
        raise ValueError(f"h has {h.shape[0]} rows but {vertex_ids.numel()} vertex ids were given; pass one id per row")
    key = counter_rng.stream_key(seed ^ _SALT, step, layer, 0)
    if bank is None:
        bank = dropout_bank(h, p, seed, step, layer, bank_rows)
    rows = counter_rng.draw_below(counter_rng.vertex_keys(key, vertex_ids.to(h.device)), 0, bank.shape[0])
    # Scale the (small) bank, not the rows: one product over h forward and one backward instead of two. The
    # mask is 0 or 1, so h * (mask * s) has the bits of (h * mask) * s.
    return h * (bank * (1.0 / (1.0 - p))).index_select(0, rows)


def dropout_bank(h: torch.Tensor, p: float, seed: int, step: int, layer: int,
                 bank_rows: int = DEFAULT_BANK_ROWS) -> torch.Tensor:
    """The mask bank :func:`vertex_dropout` draws for rows like ``h`` (pass it as ``bank=`` to draw it once for
    several calls of one step and layer, e.g. the two parts of an overlapped layer).

    Example:
        >>> h = torch.ones(4, 8)
        >>> bank = dropout_bank(h, 0.5, seed=0, step=1, layer=0)
        >>> torch.equal(vertex_dropout(h, torch.arange(4), 0.5, 0, 1, 0, bank=bank),
        ...             vertex_dropout(h, torch.arange(4), 0.5, 0, 1, 0))
        True
    """
    key = counter_rng.stream_key(seed ^ _SALT, step, layer, 0)
    # The bank is drawn on the host from a generator seeded by (seed, step, layer), whatever h's device: every
    # rank and every device type draw the same masks, so a CUDA run drops exactly what a CPU run drops (the
    # first GPU run found the split-parity tests failing when the bank was drawn by the GPU's own generator,
    # whose stream differs from the CPU's). Hashing every cell instead (also device-independent) cost 1.4x
    # the CPU draw and ~18 % of a dp epoch on CPU (experiments/vs_dgl.py). On a GPU this is ~1 ms of host work
    # per layer for a 4096 x 256 bank, and its copy from pinned memory does not wait for the GPU.
    gen = torch.Generator().manual_seed(key & ((1 << 63) - 1))
    bank = torch.rand((bank_rows,) + tuple(h.shape[1:]), generator=gen) >= p
    if h.device.type == "cuda":
        bank = bank.pin_memory()  # so that the copy below neither blocks the host nor waits for the GPU
    return bank.to(h.device, non_blocking=True).to(h.dtype)
