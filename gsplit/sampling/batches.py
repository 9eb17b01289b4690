"""The global order of targets and how it is cut into mini-batches (shared by every loader)."""

from __future__ import annotations

import math
from typing import Iterator

import torch

from gsplit.sampling import counter_rng


def epoch_permutation(indices: torch.Tensor, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """The global order of ``indices`` for ``epoch``: identical on every rank for the same seed.

    Example:
        >>> epoch_permutation(torch.arange(5), seed=0, epoch=0, shuffle=False).tolist()
        [0, 1, 2, 3, 4]
    """
    if not shuffle:
        return indices
    g = torch.Generator().manual_seed(counter_rng.stream_key(seed, epoch, 0, 0) & ((1 << 63) - 1))
    return indices[torch.randperm(indices.numel(), generator=g)]


def num_iterations(num_indices: int, batch_size: int, world_size: int = 1, drop_last: bool = False) -> int:
    """Iterations per epoch: as many as DGL's data-parallel loader would run on each rank.

    Example:
        >>> num_iterations(10, batch_size=2, world_size=2), num_iterations(10, 2, 2, drop_last=True)
        (3, 2)
    """
    global_batch = batch_size * world_size
    return num_indices // global_batch if drop_last else math.ceil(num_indices / global_batch)


def global_batches(indices: torch.Tensor, batch_size: int, seed: int, epoch: int, shuffle: bool = True,
                   drop_last: bool = False) -> Iterator[torch.Tensor]:
    """Consecutive slices of ``batch_size`` targets of the epoch's global order (the last may be short)."""
    order = epoch_permutation(indices, seed, epoch, shuffle)
    for t in range(num_iterations(order.numel(), batch_size, 1, drop_last)):
        yield order[t * batch_size:(t + 1) * batch_size]
