"""The global order of targets and how it is cut into mini-batches (shared by every loader)."""

from __future__ import annotations

import math
from typing import Iterator, Tuple

import torch

from gsplit.ops import counter_rng


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


class BatchSchedule:
    """A loader's targets and how each epoch cuts them into global mini-batches, identically on every rank.

    Both :class:`gsplit.DataLoader` and the data-parallel baseline iterate one of these, so the two
    systems see the same global mini-batches. Every pass advances the epoch unless
    :meth:`set_epoch` fixed it.

    With ``num_replicas`` > 1 (several hosts, each one split group of ``world_size`` ranks) a global
    mini-batch holds ``batch_size * world_size * num_replicas`` targets and replica ``h`` takes its
    ``h``-th consecutive slice of ``batch_size * world_size`` (:meth:`replica_slice`; in the last
    iteration of an epoch the later replicas may get fewer targets, or none).

    Example:
        >>> s = BatchSchedule(torch.arange(10), batch_size=2, world_size=2, seed=0, shuffle=False)
        >>> len(s), [b.tolist() for b in s.global_batches(s.next_epoch())]
        (3, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]])
        >>> h = BatchSchedule(torch.arange(10), batch_size=2, world_size=2, num_replicas=2)
        >>> len(h), [[h.replica_slice(b, r).tolist() for r in range(2)] for b in h.global_batches(0)]
        (2, [[[0, 1, 2, 3], [4, 5, 6, 7]], [[8, 9], []]])
    """

    def __init__(self, indices: torch.Tensor, batch_size: int, world_size: int = 1, seed: int = 0,
                 shuffle: bool = False, drop_last: bool = False, num_replicas: int = 1):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}; it must be at least 1 (targets per rank per iteration)")
        if num_replicas < 1:
            raise ValueError(f"num_replicas={num_replicas}; it must be at least 1 (hosts, each one split group)")
        self.num_replicas = int(num_replicas)
        self.indices = torch.as_tensor(indices, dtype=torch.int64).cpu()
        self.batch_size = int(batch_size)
        self.world_size = int(world_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self._next_epoch = 0
        self._start_iteration = 0

    def __len__(self) -> int:
        return num_iterations(self.indices.numel(), self.batch_size, self.world_size * self.num_replicas,
                              self.drop_last)

    def set_epoch(self, epoch: int, start_iteration: int = 0) -> None:
        """Fix the epoch of the next pass, and the iteration it starts at (a resumed run skips the done ones)."""
        if not 0 <= int(start_iteration) <= len(self):
            raise ValueError(f"start_iteration={start_iteration} but an epoch has {len(self)} iterations")
        self._next_epoch = int(epoch)
        self._start_iteration = int(start_iteration)

    def next_epoch(self) -> int:
        """The epoch of the pass that starts now (and advance the counter)."""
        return self.next_pass()[0]

    def next_pass(self) -> Tuple[int, int]:
        """``(epoch, first iteration)`` of the pass that starts now (and advance to the next epoch's start)."""
        epoch, start = self._next_epoch, self._start_iteration
        self._next_epoch, self._start_iteration = epoch + 1, 0
        return epoch, start

    def numbered_batches(self, epoch: int, start: int = 0) -> Iterator[Tuple[int, torch.Tensor]]:
        """``(iteration, global mini-batch)`` of ``epoch`` from iteration ``start`` on.

        Example:
            >>> s = BatchSchedule(torch.arange(6), batch_size=2)
            >>> [(it, b.tolist()) for it, b in s.numbered_batches(0, start=1)]
            [(1, [2, 3]), (2, [4, 5])]
        """
        for it, batch in enumerate(self.global_batches(epoch)):
            if it >= start:
                yield it, batch

    def global_batches(self, epoch: int) -> Iterator[torch.Tensor]:
        """The global mini-batches of ``epoch``: ``batch_size * world_size * num_replicas`` targets each
        (the union of every replica's mini-batch)."""
        order = epoch_permutation(self.indices, self.seed, epoch, self.shuffle)
        gb = self.batch_size * self.world_size * self.num_replicas
        for t in range(len(self)):
            yield order[t * gb:(t + 1) * gb]

    def replica_slice(self, global_batch: torch.Tensor, replica: int) -> torch.Tensor:
        """Replica ``replica``'s mini-batch of ``global_batch``: its consecutive ``batch_size * world_size`` slice."""
        if not 0 <= replica < self.num_replicas:
            raise ValueError(f"replica={replica} but the schedule has {self.num_replicas} replicas; "
                             f"pass 0 <= replica < {self.num_replicas}")
        size = self.batch_size * self.world_size
        return global_batch[replica * size:(replica + 1) * size]
