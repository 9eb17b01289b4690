"""``ShuffleIndex``: who sends which rows to whom before one layer of split-parallel training."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List

import torch

from gsplit.comm.communicator import Communicator


@dataclass
class ShuffleIndex:
    """The bookkeeping of one shuffle: local-frontier rows in, mixed-frontier rows out.

    Before layer ``l`` a rank holds one row per vertex of its *local frontier* (vertices it owns at
    that level). The layer needs one row per vertex of its block's ``src_nodes`` (the *mixed
    frontier*), some owned by other ranks. Each mixed-frontier vertex is received from its owner
    exactly once, so the forward shuffle is a permutation-with-copies and backward is its transpose.
    """

    send_idx: torch.Tensor
    """int64 rows of the local frontier to send, grouped by destination rank (a row may repeat)."""
    send_counts: List[int]
    """Rows sent to each rank (``len == world_size``)."""
    recv_pos: torch.Tensor
    """int64 position in the block's ``src_nodes`` of each received row, grouped by source rank."""
    recv_counts: List[int]
    """Rows received from each rank."""
    num_local: int
    """Rows of the local frontier (input of the shuffle)."""
    num_mixed: int
    """Rows of the mixed frontier (output of the shuffle) = the block's ``num_src_nodes()``."""
    comm: Communicator
    """The process group the shuffle runs on."""
    tag: str = "shuffle"
    """Traffic-counter tag for this shuffle (e.g. ``"shuffle/layer1"``)."""

    def to(self, device) -> "ShuffleIndex":
        return replace(self, send_idx=self.send_idx.to(device), recv_pos=self.recv_pos.to(device))

    def remote_rows(self) -> int:
        """Rows this rank receives from other ranks in the forward shuffle."""
        return sum(self.recv_counts) - self.recv_counts[self.comm.rank]
