"""Split-parallel sampling: each rank samples only the vertices it owns, one id exchange per layer.

Layer by layer from the top, rank ``r`` samples the in-edges of its *local frontier* (vertices it
owns at that level), giving a block whose sources form a *mixed frontier* of local and remote
vertices. The ids are sent to their owners with one all-to-all that also carries their counts
(:meth:`~gsplit.comm.Communicator.all_to_all_counted`); each owner's next local frontier is
the union of what it received. Because picks are counter-based, the union over ranks of the blocks
is exactly the single-process mini-batch of ``NeighborSampler.sample_blocks`` for the same seeds.
The layer loop itself is :meth:`NeighborSampler.sample_layers`, shared with single-process sampling;
only the exchange step (:func:`exchange_ids`) is split parallelism's own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import List, Optional, Sequence, Tuple

import torch

from gsplit import ops
from gsplit.comm.communicator import Communicator
from gsplit.data.graph import Graph
from gsplit.ops.torch_ops import to_device
from gsplit.minibatch.overlap import plan_overlap
from gsplit.sampling.block import MiniBatch, ShuffleIndex
from gsplit.sampling.neighbor import NeighborSampler
from gsplit.split import deferred


def exchange_ids(ids: torch.Tensor, owner: torch.Tensor, comm: Communicator, tag: str,
                 num_nodes: Optional[int] = None, interior_first: bool = False) -> Tuple[torch.Tensor, ShuffleIndex]:
    """Send each id of this rank's mixed frontier to its owner; return ``(new_local_frontier, ShuffleIndex)``.

    ``ids`` are the mixed frontier (unique); ``owner[i]`` owns ``ids[i]``. An owner's new local frontier
    is the sorted union of the ids it is asked for. The id exchange and the later shuffle of rows run
    in opposite directions: ids go from the rank that needs a row to the rank that owns it, rows come
    back. So the requests this rank *receives* are the rows it will *send* in the shuffle, and the
    requests it sends are the rows it will receive.

    With ``interior_first`` (overlapped training, :mod:`gsplit.minibatch.overlap`) the new frontier is ordered
    interior first: the ids only this rank asked for, then those another rank asked for (the rows it will
    send away), each part in id order; ``index.num_interior`` says where the second part starts. Sampling
    picks are a function of the vertex, so the order changes no edge, only the rows' places.
    :func:`exchange_ids_many` does the same for several mini-batches in one all-to-all.
    """
    return exchange_ids_many([ids], [owner], comm, tag, num_nodes, interior_first)[0]


def exchange_ids_many(ids: Sequence[torch.Tensor], owners: Sequence[torch.Tensor], comm: Communicator, tag: str,
                      num_nodes: Optional[int] = None, interior_first: bool = False
                      ) -> List[Tuple[torch.Tensor, ShuffleIndex]]:
    """:func:`exchange_ids` of several mini-batches' mixed frontiers (``ids[k]``, owned by ``owners[k]``, e.g. the
    batches of a macrobatch) in ONE all-to-all: per batch, the frontier and plan that :func:`exchange_ids` of
    that batch alone returns, exactly.

    Batch ``k``'s ids travel as ``k * num_nodes + id``, grouped by destination and, within a destination, by
    batch (each batch's ids in the order its own exchange would send them); an owner reads the batch back
    from the value and handles every batch's requests as its own exchange would have.
    """
    if comm.world_size == 1:
        return [_own_frontier(x, tag, interior_first) for x in ids]
    # index_select rather than ids[order] here and below: the same gather, 6-9x faster on the CPU in torch 2.13
    # (62k ids: 0.08 vs 0.67 ms on one core; advanced indexing goes through a general kernel)
    # group the ids by owner, stable: the sort's values are the owners in that order (no second gather). The
    # owners are sorted as the smallest integers that hold a rank: torch sorts those by radix, 3-4x faster
    # than int64 keys (62k ids: 0.6 vs 2.2 ms on one core); a stable sort's order is the same for any dtype
    sorts = [torch.sort(owner.to(_rank_dtype(comm.world_size)), stable=True) for owner in owners]
    if len(ids) == 1:
        (dest, order), = sorts
        # the counts travel with the ids: one all-to-all per layer (a second only when a pair's count outgrows
        # the capacity learnt from earlier iterations), and one wait, for the counts that come back
        requested, requests_sent, requests_received = comm.all_to_all_counted(ids[0].index_select(0, order), dest,
                                                                              tag=f"ids/{tag}")
        return [_requested_frontier(requested, requests_received, order, requests_sent, ids[0].numel(), comm, tag,
                                    num_nodes, interior_first)]
    if num_nodes is None:
        raise ValueError("exchange_ids_many of several batches needs num_nodes (it numbers batch k's ids from "
                         "k * num_nodes); pass the graph's vertex count")
    send, dest, sent_by_batch = _batch_major_sends(ids, sorts, comm.world_size, num_nodes)
    requested, _, requests_received = comm.all_to_all_counted(send, dest, tag=f"ids/{tag}")
    requested, received_by_batch = _requests_by_batch(requested, requests_received, len(ids), num_nodes)
    sent, received = torch.stack([sent_by_batch, received_by_batch]).tolist()  # one wait
    out, start = [], 0
    for k, (x, (_, order)) in enumerate(zip(ids, sorts)):
        n = sum(received[k])
        out.append(_requested_frontier(requested[start:start + n], received[k], order, sent[k], x.numel(), comm,
                                       tag, num_nodes, interior_first))
        start += n
    return out


def _batch_major_sends(ids: Sequence[torch.Tensor], sorts, world_size: int, num_nodes: int):
    """The ids of every batch in one send buffer: grouped by destination, then by batch (batch ``k``'s as
    ``k * num_nodes + id``, in its own exchange's order); returns ``(send, dest, counts)``, ``counts[k][j]``
    the ids batch ``k`` sends rank ``j`` (a device tensor). Each id's place is computed, not sorted for: the
    batch's ids to rank ``j`` go after those of the earlier batches to ``j``."""
    device = ids[0].device
    counts = torch.stack([torch.zeros(world_size, dtype=torch.int64, device=device).index_add_(
        0, dest.to(torch.int64), torch.ones_like(order)) for dest, order in sorts])  # [batch][destination]
    to_dest = counts.sum(0)
    # place of batch k's first id to rank j, minus where it sits in batch k's own (destination-grouped) order
    shift = (torch.cumsum(to_dest, 0) - to_dest) + (torch.cumsum(counts, 0) - counts) - \
        (torch.cumsum(counts, 1) - counts)
    send = torch.empty(sum(x.numel() for x in ids), dtype=torch.int64, device=device)
    for k, (x, (dest, order)) in enumerate(zip(ids, sorts)):
        place = shift[k].index_select(0, dest.to(torch.int64)) + torch.arange(x.numel(), device=device)
        send.index_copy_(0, place, x.index_select(0, order).to(torch.int64) + k * num_nodes)
    dest = torch.repeat_interleave(torch.arange(world_size, device=device), to_dest, output_size=send.numel())
    return send, dest, counts


def _requests_by_batch(requested: torch.Tensor, per_sender: List[int], num_batches: int, num_nodes: int):
    """The received ``k * num_nodes + id`` requests (grouped by sender, each sender's by batch) as ids grouped
    by batch, each batch's by sender; and ``counts[k][i]``, the requests of batch ``k`` from rank ``i``."""
    device, world_size = requested.device, len(per_sender)
    batch = torch.div(requested, num_nodes, rounding_mode="floor")
    sender = torch.repeat_interleave(torch.arange(world_size, device=device), torch.tensor(per_sender, device=device),
                                     output_size=requested.numel())
    key = batch * world_size + sender
    counts = torch.zeros(num_batches * world_size, dtype=torch.int64, device=device).index_add_(
        0, key, torch.ones_like(key)).view(num_batches, world_size)
    from_sender = counts.sum(0)
    in_batch = counts.sum(1)
    # a request's place: its batch's start, the earlier senders' requests of that batch, its rank within
    # its (sender, batch) run, which starts where the sender's earlier batches end
    shift = (torch.cumsum(in_batch, 0) - in_batch).unsqueeze(1) + (torch.cumsum(counts, 1) - counts) - \
        (torch.cumsum(from_sender, 0) - from_sender).unsqueeze(0) - (torch.cumsum(counts, 0) - counts)
    place = shift.view(-1).index_select(0, key) + torch.arange(requested.numel(), device=device)
    out = torch.empty_like(requested)
    out.index_copy_(0, place, requested - batch * num_nodes)
    return out, counts


def _own_frontier(ids: torch.Tensor, tag: str, interior_first: bool) -> Tuple[torch.Tensor, ShuffleIndex]:
    """One rank: every id is its own, nothing to count or exchange. The (distinct) ids, in their order, are the
    new frontier, so the shuffle before the layer is the identity (:attr:`ShuffleIndex.identity`: no sort, no
    copy, no collective); the blocks are those a single-process sampler makes."""
    index = ShuffleIndex.read_directly(ids.numel(), rank=0, world_size=1, device=ids.device, tag=f"shuffle/{tag}")
    return ids, replace(index, num_interior=ids.numel() if interior_first else None)


def _requested_frontier(requested: torch.Tensor, requests_received: List[int], order: torch.Tensor,
                        requests_sent: List[int], num_mixed: int, comm: Communicator, tag: str,
                        num_nodes: Optional[int], interior_first: bool) -> Tuple[torch.Tensor, ShuffleIndex]:
    """An owner's new local frontier and the shuffle plan from the requests it received (grouped by sender) and
    the order in which it sent its own (``order``: its mixed frontier grouped by owner)."""
    # the new frontier is the sorted union of the requests and each request's row is its place in it
    frontier, send_idx = ops.unique_inverse(requested, num_nodes)
    num_interior = None
    if interior_first:
        frontier, send_idx, num_interior = _interior_first(frontier, send_idx, requests_received, comm.rank)
    index = ShuffleIndex(send_idx=send_idx, send_counts=requests_received,
                         recv_pos=order, recv_counts=requests_sent, num_local=frontier.numel(),
                         num_mixed=num_mixed, tag=f"shuffle/{tag}", num_interior=num_interior)
    return frontier, index


def _rank_dtype(world_size: int) -> torch.dtype:
    """The smallest signed integer type that holds every rank of ``world_size``."""
    for dtype in (torch.int8, torch.int16, torch.int32):
        if world_size - 1 <= torch.iinfo(dtype).max:
            return dtype
    return torch.int64


def _interior_first(frontier: torch.Tensor, send_idx: torch.Tensor, send_counts, rank: int):
    """``(frontier', send_idx', num_interior)``: the frontier reordered, rows no other rank asked for first
    (each part keeps id order), and the send rows renumbered to match; one host read (the count).

    The rows other ranks asked for are those of every requester's part of ``send_idx`` but this rank's own
    (two slices: no mask and no size read). The stable partition is one prefix sum: an interior row ``i``
    moves to ``i - (boundary rows before it)``, a boundary row to ``num_interior + (boundary rows before it)``;
    it equals a stable sort by the boundary flag, in one pass instead of a sort and its inverse.
    """
    start = sum(send_counts[:rank])
    end = start + send_counts[rank]
    boundary = torch.zeros(frontier.numel(), dtype=torch.int64, device=frontier.device)
    boundary.index_fill_(0, send_idx[:start], 1)
    boundary.index_fill_(0, send_idx[end:], 1)
    before = torch.cumsum(boundary, 0)  # boundary rows up to and including each row
    num_interior = frontier.numel() - (int(before[-1]) if frontier.numel() else 0)
    rows = torch.arange(frontier.numel(), device=frontier.device)
    new_of_old = torch.where(boundary.bool(), num_interior + before - 1, rows - before)
    reordered = torch.empty_like(frontier)
    reordered.index_copy_(0, new_of_old, frontier)
    return reordered, new_of_old.index_select(0, send_idx), num_interior


def local_targets(seeds: torch.Tensor, owner: torch.Tensor, rank: int) -> torch.Tensor:
    """This rank's targets among ``seeds`` (those ``owner`` gives to ``rank``), in the order of ``seeds``.

    Their number depends on the data, so on a GPU it costs a host sync; with ``seeds`` and ``owner`` on
    the host (as a loader has them) it costs none.

    Example:
        >>> local_targets(torch.tensor([4, 1, 2]), torch.tensor([0, 1, 1, 0, 1]), rank=1).tolist()
        [4, 1, 2]
    """
    if owner.device != seeds.device:
        owner = owner.to(seeds.device)
    return seeds[torch.nonzero(owner[seeds] == rank).squeeze(1)]


def sp_sample(graph: Graph, seeds: torch.Tensor, owner: torch.Tensor, sampler: NeighborSampler,
              comm: Communicator, epoch: int = 0, iteration: int = 0,
              num_global_targets: Optional[int] = None, targets: Optional[torch.Tensor] = None,
              overlap: bool = False, exchange_inputs: bool = True) -> MiniBatch:
    """Sample this rank's split of the global mini-batch ``seeds``.

    Args:
        graph: the full graph (every rank holds it, as in the paper).
        seeds: the *global* mini-batch's target vertices, identical on every rank.
        owner: ``owner[v]`` is the rank that owns vertex ``v`` (``PartitionMap.assignment``).
        sampler: the counter-based sampler; its picks do not depend on the rank.
        comm: this rank's communicator; every rank must call ``sp_sample`` for every iteration.
        epoch, iteration: counters that, with the sampler seed, fix the mini-batch.
        num_global_targets: the loss denominator (``blocks[-1].global_num_dst``); default
            ``seeds.numel()``. With several hosts, the size of the union of all hosts' mini-batches.
        targets: this rank's targets, ``local_targets(seeds, owner, comm.rank)``, when the caller has
            them, on the device to sample from; a loader selects them on the host, which saves a sync.
        overlap: order every local frontier above the input interior first and give every block but the
            last its :class:`~gsplit.sampling.block.OverlapSplit` (``block.overlap``), so that gsplit's
            forward computes the rows other ranks need first and overlaps their shuffle with the rest
            (:mod:`gsplit.minibatch.overlap`). The same edges are sampled.
        exchange_inputs: ``True``: the bottom layer's sources are requested from their owners, who load
            their features and shuffle them (the paper's split: no feature row is loaded twice). ``False``:
            no exchange at the bottom; the rank reads every input row it needs itself, from a feature table
            every rank holds (CPU ranks of one host: a read of shared memory costs what the shuffle's copy
            would, without the collective), and ``blocks[0].shuffle_index`` is
            :meth:`~gsplit.sampling.block.ShuffleIndex.read_directly`'s plan. The same edges are sampled.

    Returns a :class:`~gsplit.sampling.MiniBatch`: ``input_nodes`` is the rank's bottom local frontier
    (the only features it loads), or with ``exchange_inputs=False`` ``blocks[0].src_nodes`` (the ranks'
    sets then overlap), ``output_nodes`` its local targets in the order of ``seeds``, and
    ``blocks[l].shuffle_index`` feeds layer ``l``.

    Example:
        >>> batch = sp_sample(g, seeds, pmap.assignment, sampler, Communicator())   # doctest: +SKIP
        >>> batch.blocks[-1].dst_nodes                      # this rank's targets    # doctest: +SKIP
    """
    return sp_sample_many(graph, [seeds], owner, sampler, comm, epoch, [iteration],
                          None if num_global_targets is None else [num_global_targets],
                          None if targets is None else [targets], overlap, exchange_inputs)[0]


def sp_sample_many(graph: Graph, seeds: Sequence[torch.Tensor], owner: torch.Tensor, sampler: NeighborSampler,
                   comm: Communicator, epoch: int = 0, iterations: Sequence[int] = (0,),
                   num_global_targets: Optional[Sequence[int]] = None,
                   targets: Optional[Sequence[torch.Tensor]] = None, overlap: bool = False,
                   exchange_inputs: bool = True) -> List[MiniBatch]:
    """:func:`sp_sample` of several global mini-batches (``seeds[k]`` of iteration ``iterations[k]``, e.g. the
    batches of a macrobatch), with ONE id exchange per layer for all of them (:func:`exchange_ids_many`).

    Batch ``k`` is exactly what ``sp_sample(..., seeds[k], iteration=iterations[k])`` returns: the same picks
    (counter-based), the same frontiers and the same shuffle plans; only the number of collectives differs.
    ``num_global_targets`` and ``targets`` are per batch, as in :func:`sp_sample`.

    Example:
        >>> batches = sp_sample_many(g, [seeds_4, seeds_5], pmap.assignment, sampler, comm,
        ...                          iterations=[4, 5])                                    # doctest: +SKIP
    """
    if len(seeds) != len(iterations):
        raise ValueError(f"{len(seeds)} seed sets but {len(iterations)} iterations; pass one iteration per batch")
    if owner.numel() != graph.num_nodes:
        raise ValueError(f"the partition map covers {owner.numel()} vertices but the graph has {graph.num_nodes}; "
                         "use a map made for this graph")
    device = ops.sampling_device(graph, (seeds if targets is None else targets)[0].device)
    if targets is None:
        seeds = [to_device(s.to(torch.int64), device) for s in seeds]
        targets = [local_targets(s, owner, comm.rank) for s in seeds]
    owner = owner.to(device)

    def exchange(layer: int, mixed_frontiers: List[torch.Tensor]):
        if layer == 0 and not exchange_inputs:
            return [(m, ShuffleIndex.read_directly(m.numel(), comm.rank, comm.world_size, m.device,
                                                   tag="shuffle/layer0")) for m in mixed_frontiers]
        # layer 0's exchange makes the input frontier: features are loaded, not computed, so not reordered
        return exchange_ids_many(mixed_frontiers, [owner.index_select(0, m) for m in mixed_frontiers], comm,
                                 tag=f"layer{layer}", num_nodes=graph.num_nodes, interior_first=overlap and layer > 0)

    targets = [to_device(t.to(torch.int64), device) for t in targets]
    batches, planned = None, False
    if len(seeds) == 1 and deferred.sizes_on_device(device, comm) and \
            deferred.deferred_applies(sampler, graph, comm, exchange_inputs):
        # on a GPU: the sizes stay on the device and are read once (None: a slot overflowed, redo exactly)
        batch = deferred.sample_deferred(graph, targets[0], owner, sampler, comm, epoch, iterations[0],
                                         exchange_inputs, overlap)
        batches, planned = (None, False) if batch is None else ([batch], True)
    if batches is None:
        batches = sampler.sample_many(graph, targets, epoch, iterations, exchange)
    for k, batch in enumerate(batches):
        if overlap and not planned:
            plan_overlap(batch.blocks, comm.rank)
        # the loss is averaged over the global mini-batch, so the top block knows its global size
        batch.blocks[-1].global_num_dst = seeds[k].numel() if num_global_targets is None else \
            int(num_global_targets[k])
    return batches
