"""A macrobatch's input rows on a split rank: loaded once, shuffled in one all-to-all.

With ``B = 1`` a rank loads the rows of its bottom local frontier and shuffles them into the first block's
sources (``blocks[0].shuffle_index``). For a macrobatch (:mod:`gsplit.sampling.macrobatch`) the rank loads the
*union* of its batches' bottom local frontiers once, and one all-to-all carries to every rank the union of the
rows it needs over the batches: each row at most once per pair of ranks. No id exchange is needed for that
plan: what rank ``i`` sends rank ``j`` (the rows ``j`` asked ``i`` for, in any batch) is what ``j`` knows it
receives from ``i`` (the vertices of its batches' first-layer sources that ``i`` owns), both in id order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from gsplit import ops
from gsplit.sampling.block import MiniBatch, ShuffleIndex
from gsplit.sampling.macrobatch import union_positions
from gsplit.split.split_sampling import _rank_dtype


@dataclass
class MacroInputs:
    """How a rank loads the input rows of a macrobatch's mini-batches once."""

    input_nodes: torch.Tensor
    """int64 vertices whose rows this rank loads (sorted): the union of its batches' ``input_nodes``."""
    shuffle_index: Optional[ShuffleIndex]
    """Moves the rows of ``input_nodes`` to those of ``mixed_nodes`` (one all-to-all); ``None`` where the rank
    reads every row it needs itself (``input_nodes`` is then ``mixed_nodes``)."""
    mixed_nodes: torch.Tensor
    """int64 vertices whose rows the rank's batches read (sorted): the union of their ``blocks[0].src_nodes``."""
    positions: List[torch.Tensor]
    """Per batch: the place in ``mixed_nodes`` of each of its ``blocks[0].src_nodes``."""

    def to(self, device, non_blocking: bool = False) -> "MacroInputs":
        mv = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return MacroInputs(input_nodes=mv(self.input_nodes), mixed_nodes=mv(self.mixed_nodes),
                           shuffle_index=None if self.shuffle_index is None else self.shuffle_index.to(device,
                                                                                                      non_blocking),
                           positions=[mv(p) for p in self.positions])


def macro_inputs(batches: Sequence[MiniBatch], owner: torch.Tensor, rank: int, world_size: int, num_nodes: int,
                 read_directly: bool) -> MacroInputs:
    """The input plan of a rank's split of a macrobatch (``batches`` from :func:`gsplit.split.sp_sample_many`).

    ``read_directly``: the batches were sampled with ``exchange_inputs=False`` and the rank reads its rows from
    a table every rank holds; else each row is loaded by its owner and shuffled. Local work only.

    Example:
        >>> plan = macro_inputs(batches, pmap.assignment, comm.rank, comm.world_size, g.num_nodes,
        ...                     read_directly=False)                                  # doctest: +SKIP
        >>> rows = shuffle_rows(features[plan.input_nodes], plan.shuffle_index, comm)  # doctest: +SKIP
    """
    mixed, positions = union_positions([b.blocks[0].src_nodes for b in batches], num_nodes)
    if read_directly:
        return MacroInputs(input_nodes=mixed, shuffle_index=None, mixed_nodes=mixed, positions=positions)
    loaded = ops.unique_ids(torch.cat([b.input_nodes for b in batches]), num_nodes)
    # what this rank sends: per destination, the distinct rows it asked for in any batch, in id order
    sends, dests = [], []
    for b in batches:
        index = b.blocks[0].shuffle_index
        sends.append(b.input_nodes.index_select(0, index.send_idx))
        dests.append(torch.repeat_interleave(torch.arange(world_size, device=loaded.device),
                                             torch.tensor(index.send_counts, device=loaded.device),
                                             output_size=index.send_idx.numel()))
    keys = ops.unique_ids(torch.cat(dests) * num_nodes + torch.cat(sends), num_nodes * world_size)
    dest = torch.div(keys, num_nodes, rounding_mode="floor")
    send_ids = keys - dest * num_nodes
    # what it receives: per sender, the vertices of ``mixed`` that the sender owns, in id order
    mixed_owner = owner.index_select(0, mixed).to(torch.int64)
    _, recv_pos = torch.sort(mixed_owner.to(_rank_dtype(world_size)), stable=True)
    counts = torch.stack([torch.bincount(dest, minlength=world_size), torch.bincount(mixed_owner, minlength=world_size)])
    send_counts, recv_counts = counts.tolist()
    index = ShuffleIndex(send_idx=torch.searchsorted(loaded, send_ids), send_counts=send_counts, recv_pos=recv_pos,
                         recv_counts=recv_counts, num_local=loaded.numel(), num_mixed=mixed.numel(),
                         tag=batches[0].blocks[0].shuffle_index.tag)
    return MacroInputs(input_nodes=loaded, shuffle_index=index, mixed_nodes=mixed, positions=positions)
