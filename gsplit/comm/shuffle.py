"""``shuffle``: the autograd-aware all-to-all that feeds every split-parallel layer.

The plan (:class:`~gsplit.sampling.ShuffleIndex`, on the block) is pure data; the process group is an
argument of the call, as in ``torch.distributed.nn.functional``, and is kept in the autograd context
for backward.
"""

from __future__ import annotations

import torch

from gsplit.comm.communicator import Communicator, as_communicator, group_of
from gsplit.sampling.block import Block, ShuffleIndex, without_stretch
from gsplit.ops.rows import gather_rows, scatter_rows_  # noqa: I001 - after sampling, which imports gsplit.ops first


def shuffle_rows(h: torch.Tensor, index: ShuffleIndex, comm: Communicator, tag_suffix: str = "fwd") -> torch.Tensor:
    """Local-frontier rows -> mixed-frontier rows, without autograd (used for input features).

    The rows this rank reads itself are copied directly (a gather and a scatter); only the rows of other ranks go
    through the all-to-all (this rank's own count in it is 0: same traffic counted, fewer copies). The copies are
    :func:`gsplit.ops.rows.gather_rows` / :func:`~gsplit.ops.rows.scatter_rows_` (torch's ``index_select`` /
    ``index_copy_``, compiled on the CPU; advanced indexing is several times slower there), and every
    mixed-frontier row is received exactly once, so the scatter is exact.
    """
    if h.shape[0] != index.num_local:
        raise ValueError(f"shuffle input has {h.shape[0]} rows but this rank's local frontier has "
                         f"{index.num_local} vertices; pass the output of the previous layer unchanged")
    if index.identity:  # every row stays where it is: nothing to copy or exchange (one rank, directly read rows)
        return h
    rank = comm.rank
    own_send, own_recv = index.own_rows(rank)
    out = h.new_empty((index.num_mixed,) + tuple(h.shape[1:]))
    if comm.world_size > 1:  # one collective, as before, even when no row goes to another rank
        send_counts, recv_counts = index.counts_to_others(rank)
        recv = comm.all_to_all_rows(gather_rows(h, without_stretch(index.send_idx, own_send)), send_counts,
                                    recv_counts, tag=f"{index.tag}/{tag_suffix}")
        scatter_rows_(out, without_stretch(index.recv_pos, own_recv), recv)
    scatter_rows_(out, index.recv_pos[own_recv], gather_rows(h, index.send_idx[own_send]))
    return out


class _Shuffle(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, index: ShuffleIndex, comm: Communicator) -> torch.Tensor:
        ctx.index, ctx.comm = index, comm
        return shuffle_rows(h, index, comm)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        index: ShuffleIndex = ctx.index
        comm: Communicator = ctx.comm
        rank = comm.rank
        own_send, own_recv = index.own_rows(rank)
        # Transpose of the forward: return each received row's gradient to its owner, who sums the
        # gradients of a vertex that several ranks read.
        grad_h = grad_out.new_zeros((index.num_local,) + tuple(grad_out.shape[1:]))
        own = gather_rows(grad_out, index.recv_pos[own_recv])
        if comm.world_size == 1:
            grad_h.index_add_(0, index.send_idx[own_send], own)
            return grad_h, None, None
        send_counts, recv_counts = index.counts_to_others(rank)
        back = comm.all_to_all_rows(gather_rows(grad_out, without_stretch(index.recv_pos, own_recv)),
                                    recv_counts, send_counts, tag=f"{index.tag}/bwd")
        # summed in rank order, this rank's own rows at its place: the order (and bits) of one index_add_
        # over the rows of every rank
        n_before = own_send.start
        grad_h.index_add_(0, index.send_idx[:own_send.start], back[:n_before])
        grad_h.index_add_(0, index.send_idx[own_send], own)
        grad_h.index_add_(0, index.send_idx[own_send.stop:], back[n_before:])
        return grad_h, None, None


def shuffle_by(h: torch.Tensor, index: ShuffleIndex, group=None) -> torch.Tensor:
    """The autograd shuffle of ``h`` by the plan ``index`` on ``group`` (``None``: the group
    :func:`~gsplit.comm.bind_group` recorded for the plan): :func:`shuffle` for a plan that is not a block's,
    e.g. the exchange of output rows before link prediction scores pairs (:func:`gsplit.link.pair_rows`).

    Example:
        >>> index = ShuffleIndex.read_directly(2, rank=0, world_size=1)
        >>> shuffle_by(torch.ones(2, 3), index).shape
        torch.Size([2, 3])
    """
    if index.identity:  # one rank: nothing moves
        if h.shape[0] != index.num_local:
            raise ValueError(f"h has {h.shape[0]} rows but the plan's input has {index.num_local}")
        return h
    comm = group_of(index) if group is None else as_communicator(group)
    return _Shuffle.apply(h, index, comm)


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
    if index is None or index.identity:  # not split, or one rank's plan: h's rows are the block's sources already
        if h.shape[0] != block.num_src_nodes():
            raise ValueError(f"h has {h.shape[0]} rows but block has {block.num_src_nodes()} source nodes")
        return h
    comm = group_of(index) if group is None else as_communicator(group)
    out = _Shuffle.apply(h, index, comm)
    # Marks the rows as this block's sources, so that gsplit.SplitParallel leaves a model that shuffles
    # for itself (gsplit.shuffle / gsplit.sp_forward in its forward) alone instead of shuffling twice.
    out.gsplit_shuffled_for = index
    return out
