"""Macrobatches (BatchGNN): sample and load ``B`` mini-batches together, then train on them one by one.

A loader with ``macrobatch=B`` samples the mini-batches of ``B`` consecutive iterations in lockstep (their
ids exchanged in one all-to-all per layer, :func:`gsplit.split.sp_sample_many`), loads the *union* of their
input rows once (a row several of them need is read, and shuffled, once) and then yields them one at a time.
Each yielded mini-batch is exactly the one the loader yields with ``B = 1``: the same iteration numbers key
the counter-based sampler, the same rows land in ``blocks[0].srcdata``. The features must not change during
training (they are read once per macrobatch).

This module holds what every loader shares: where each batch's rows sit among the macrobatch's rows
(:class:`BatchInputs`, :func:`union_positions`) and the memory bound that chooses ``B``
(:func:`macrobatch_bytes`, :func:`fit_macrobatch`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from gsplit import ops
from gsplit.sampling.block import Block

log = logging.getLogger(__name__)

BUDGET_SHARE = 4
"""Without an explicit budget, a rank's macrobatch may take this fraction (1/4) of the memory available when
its loader is built, shared by the ranks of the host (host memory) or its own (GPU memory)."""


@dataclass
class BatchInputs:
    """One mini-batch's input rows inside its macrobatch's rows: set into its first block when it is yielded
    (not before, so that a macrobatch holds its union of rows once, not ``B`` copies of them)."""

    rows: Dict[str, torch.Tensor]
    """Per ``srcdata`` key, one row per vertex of the macrobatch's input vertices (shared by its batches)."""
    positions: torch.Tensor
    """int64 row of each of this batch's ``blocks[0].src_nodes`` in ``rows``."""

    def attach(self, block: Block) -> None:
        """Put this batch's rows into ``block.srcdata`` (an ``index_select`` per key)."""
        for key, rows in self.rows.items():
            block.srcdata[key] = rows.index_select(0, self.positions)

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.rows.values()
        yield self.positions


def union_positions(src_nodes: Sequence[torch.Tensor], num_nodes: Optional[int] = None
                    ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """``(union, positions)``: the sorted distinct vertices of all ``src_nodes`` and, per tensor, the place of
    each of its vertices in the union.

    Example:
        >>> union, pos = union_positions([torch.tensor([5, 1]), torch.tensor([1, 3])], num_nodes=8)
        >>> union.tolist(), [p.tolist() for p in pos]
        ([1, 3, 5], [[2, 0], [0, 1]])
    """
    union, inverse = ops.unique_inverse(torch.cat(list(src_nodes)), num_nodes)
    return union, list(torch.split(inverse, [s.numel() for s in src_nodes]))


def macrobatch_bytes(size: int, fanouts: Sequence[int], targets: int, num_nodes: int, num_edges: int,
                     max_in_degree: int, row_bytes: int, shuffled: bool = False) -> int:
    """Estimated bytes one rank holds for a macrobatch of ``size`` mini-batches, before it is built.

    A bound of each batch from its ``targets`` (a rank's share of the mini-batch) and the fanouts: layer by
    layer from the top, every destination draws ``min(fanout, max_in_degree)`` edges (all of them for ``-1``)
    and each edge brings a new source, capped at the graph's vertices; a block keeps 3 int64 per edge and 4
    per source (ids, shuffle plan, frontier). The input rows (``row_bytes`` each: features of all loaded
    tensors) are the union of the batches' bottom sources, capped at the graph's vertices, twice when
    ``shuffled`` (the rows this rank loads and those it receives), plus one batch's first-layer rows in use.

    Example:
        >>> macrobatch_bytes(4, [2, 2], targets=10, num_nodes=1000, num_edges=8000, max_in_degree=50,
        ...                  row_bytes=16)
        30240
    """
    vertices, per_batch = int(targets), 0
    for fanout in reversed(list(fanouts)):
        degree = max_in_degree if fanout < 0 else min(fanout, max_in_degree)
        edges = min(vertices * degree, num_edges)
        vertices = min(num_nodes, vertices + edges)
        per_batch += 8 * (3 * edges + 4 * vertices)
    union = min(num_nodes, size * vertices)
    return size * per_batch + union * row_bytes * (2 if shuffled else 1) + vertices * row_bytes


def fit_macrobatch(size: int, bytes_of, budget: int, what: str = "macrobatch", warn: bool = True,
                   agree=None) -> int:
    """The largest macrobatch ``<= size`` whose estimate ``bytes_of(B)`` fits ``budget`` bytes (at least 1):
    ``size`` itself when it fits, else the lowered size, said in one WARNING line when ``warn`` (a loader
    passes ``warn`` on one rank only, so a job says it once; the others log it at DEBUG). ``agree(B)``, when
    given, turns this rank's answer into the group's (a loader's: the smallest over its ranks, whose budgets,
    read from the memory available at slightly different moments, may differ), before it is said.

    ``bytes_of`` must not decrease with ``B`` (:func:`macrobatch_bytes` does not): the size is found by
    bisection, ~log2(size) estimates, so ``macrobatch=10**9`` is lowered at once instead of one by one.

    Example:
        >>> fit_macrobatch(16, lambda b: b * 100, budget=450)
        4
        >>> fit_macrobatch(10**9, lambda b: b * 100, budget=450)
        4
    """
    if size < 1:
        raise ValueError(f"{what}={size}; pass the number of mini-batches sampled and loaded together (1: each alone)")
    fits = size
    if size > 1 and bytes_of(size) > budget:
        fits, too_big = 1, size  # bytes_of(too_big) > budget; fits is 1 or fits the budget
        while too_big - fits > 1:
            mid = (fits + too_big) // 2
            if bytes_of(mid) <= budget:
                fits = mid
            else:
                too_big = mid
    if agree is not None:
        fits = int(agree(fits))
    if fits == size:
        return size
    log.log(logging.WARNING if warn else logging.DEBUG,
            "%s=%d needs about %.1f MiB per rank (estimated), above the budget of %.1f MiB; using %s=%d "
            "(about %.1f MiB); pass the loader a larger macrobatch_memory= to allow more",
            what, size, bytes_of(size) / 2**20, budget / 2**20, what, fits, bytes_of(fits) / 2**20)
    return fits


def default_budget(device: torch.device, ranks_here: int) -> int:
    """Bytes a rank's macrobatch may take when no budget is given: :data:`BUDGET_SHARE` of the memory available
    now, host memory split among the ``ranks_here`` ranks of the host, or this rank's GPU's free memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // BUDGET_SHARE
    from gsplit.runtime.resources import available_memory

    return available_memory() // (BUDGET_SHARE * max(1, ranks_here))


def macrobatch_groups(numbered: Iterator[Tuple[int, torch.Tensor]], size: int
                      ) -> Iterator[List[Tuple[int, torch.Tensor]]]:
    """``(iteration, seeds)`` pairs in macrobatches: iterations ``[k*size, (k+1)*size)`` form one, so that a pass
    resumed in the middle of one starts with the rest of it (a partial macrobatch) and the others are the same.

    Example:
        >>> pairs = [(it, torch.tensor([it])) for it in range(3, 9)]
        >>> [[it for it, _ in group] for group in macrobatch_groups(iter(pairs), 4)]
        [[3], [4, 5, 6, 7], [8]]
    """
    group: List[Tuple[int, torch.Tensor]] = []
    for it, seeds in numbered:
        if group and it // size != group[0][0] // size:
            yield group
            group = []
        group.append((it, seeds))
    if group:
        yield group


def num_macrobatches(start: int, stop: int, size: int) -> int:
    """Macrobatches of :func:`macrobatch_groups` over iterations ``[start, stop)``.

    Example:
        >>> num_macrobatches(3, 9, 4)
        3
    """
    return 0 if stop <= start else (stop - 1) // size - start // size + 1
