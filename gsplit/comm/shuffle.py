"""``shuffle``: the autograd-aware all-to-all that feeds every split-parallel layer.

The plan (:class:`~gsplit.sampling.ShuffleIndex`, on the block) is pure data; the process group is an
argument of the call, as in ``torch.distributed.nn.functional``, and is kept in the autograd context
for backward.
"""

from __future__ import annotations

import torch

from gsplit.comm.communicator import Communicator, as_communicator, group_of
from gsplit.sampling.block import Block, ShuffleIndex


def shuffle_rows(h: torch.Tensor, index: ShuffleIndex, comm: Communicator, tag_suffix: str = "fwd") -> torch.Tensor:
    """Local-frontier rows -> mixed-frontier rows, without autograd (used for input features)."""
    if h.shape[0] != index.num_local:
        raise ValueError(f"shuffle input has {h.shape[0]} rows but this rank's local frontier has "
                         f"{index.num_local} vertices; pass the output of the previous layer unchanged")
    recv = comm.all_to_all_rows(h[index.send_idx], index.send_counts, index.recv_counts,
                                tag=f"{index.tag}/{tag_suffix}")
    out = h.new_empty((index.num_mixed,) + tuple(h.shape[1:]))
    out[index.recv_pos] = recv
    return out


class _Shuffle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, index: ShuffleIndex, comm: Communicator) -> torch.Tensor:
        ctx.index, ctx.comm = index, comm
        return shuffle_rows(h, index, comm)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        index: ShuffleIndex = ctx.index
        # Transpose of the forward: return each received row's gradient to its owner, who sums the
        # gradients of a vertex that several ranks read.
        back = ctx.comm.all_to_all_rows(grad_out[index.recv_pos].contiguous(), index.recv_counts,
                                        index.send_counts, tag=f"{index.tag}/bwd")
        grad_h = grad_out.new_zeros((index.num_local,) + tuple(grad_out.shape[1:]))
        grad_h.index_add_(0, index.send_idx, back)
        return grad_h, None, None


def shuffle(h: torch.Tensor, block: Block, group=None) -> torch.Tensor:
    """Turn this rank's rows of the previous layer into the rows of ``block``'s source vertices.

    In split-parallel training, before every layer but the first, each rank holds one row per vertex
    it owns; the layer needs one row per vertex of its mixed frontier. ``shuffle`` exchanges them with
    one all-to-all on ``group`` (a process group, a :class:`~gsplit.Communicator` such as
    ``loader.comm`` whose traffic counters then count it, or ``None``: the group of the loader that
    made ``block``, see :func:`~gsplit.comm.bind_group`, else the default group), and its
    backward sends the gradients back. For a block that is not split (the single-process reference or
    data parallelism) it returns ``h`` unchanged, so one model serves all.

    Example:
        >>> h = layer0(blocks[0], blocks[0].srcdata["feat"])   # doctest: +SKIP
        >>> h = gsplit.shuffle(h, blocks[1], loader.comm)       # doctest: +SKIP
        >>> h = layer1(blocks[1], h)                            # doctest: +SKIP
    """
    index = block.shuffle_index
    if index is None:
        if h.shape[0] != block.num_src_nodes():
            raise ValueError(f"h has {h.shape[0]} rows but block has {block.num_src_nodes()} source nodes")
        return h
    comm = group_of(index) if group is None else as_communicator(group)
    out = _Shuffle.apply(h, index, comm)
    # Marks the rows as this block's sources, so that gsplit.SplitParallel leaves a model that shuffles
    # for itself (gsplit.shuffle / gsplit.sp_forward in its forward) alone instead of shuffling twice.
    out.gsplit_shuffled_for = index
    return out
