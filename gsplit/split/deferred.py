"""Split sampling with the sizes on the device: one host read per iteration instead of four per layer.

:func:`gsplit.split.sp_sample` needs, at every layer, the number of sampled edges, the size of the relabelled
mixed frontier, the id counts of the exchange and the size of the new local frontier; on a GPU each read makes
the host wait for the device (13 waits per 3-layer iteration at 2 ranks). Here every layer works on buffers
whose lengths the host knows beforehand, each with its true size as a 0-d device tensor:

- sampling writes at most ``fanout`` edges per frontier vertex (:func:`gsplit.ops.sample_neighbors_padded`);
- relabelling and the union of the requests are one stable sort each (:func:`gsplit.ops.relabel_padded`);
- the ids travel in the fixed-size slots of :meth:`~gsplit.comm.Communicator.all_to_all_slots`, whose capacities
  were learnt from the counts of earlier iterations (both ends of a pair know them), so the per-layer count
  exchange is a header in the same collective and nothing is read back.

After the last layer every size is read at once (the one wait), and the blocks and shuffle plans are cut to
them: the same blocks, frontiers and plans as the exact path, bit for bit. A slot that overflowed (a pair
exchanged more ids than ever before, by the quarter of headroom) truncated that exchange; every rank sees every
sender's overflow flag in its headers, so all ranks see it in the same read and redo the batch with the exact
path (:func:`sample_deferred` returns ``None``), which also teaches the capacities the new count.

It applies to one mini-batch per call with positive fanouts (overlap plans included); :func:`deferred_applies` says
when, and :func:`gsplit.split.sp_sample_many` takes it on a GPU whose ranks talk NCCL (on the CPU the compiled
sampler and relabel, which know their sizes for free, are faster: ``experiments/deferred_sizes.py``).
"""

from __future__ import annotations

from typing import List, Optional

import torch

from gsplit import ops
from gsplit.comm.communicator import Communicator, SlotExchange
from gsplit.comm.waits import waiting_for_peers
from gsplit.data.graph import Graph
from gsplit.minibatch.overlap import plan_overlap
from gsplit.ops import counter_rng
from gsplit.sampling.block import Block, MiniBatch, ShuffleIndex
from gsplit.sampling.neighbor import NeighborSampler


def sizes_on_device(device: torch.device, comm: Communicator) -> bool:
    """Whether :func:`gsplit.split.sp_sample_many` keeps the sizes on ``device`` (:func:`sample_deferred`): on a GPU
    whose collectives run there (NCCL), where every size read is a wait for the device. CPU ranks read their sizes
    for free. The same answer on every rank of a group.

    Example:
        >>> sizes_on_device(torch.device("cpu"), Communicator())
        False
    """
    return device.type == "cuda" and comm.world_size > 1 and comm.nccl_for_cuda


def deferred_applies(sampler: NeighborSampler, graph: Graph, comm: Communicator, exchange_inputs: bool) -> bool:
    """Whether :func:`sample_deferred` can sample this batch: every fanout bounds its layer's edges (none is -1),
    the graph has edges, and every exchange has learnt its slot capacities (an exact iteration ran before). A
    function of what every rank has seen alike, so all ranks agree.

    Example:
        >>> from gsplit.data.graph import Graph
        >>> deferred_applies(NeighborSampler([2]), Graph.from_edges([0], [1]), Communicator(), True)
        False
    """
    if comm.world_size == 1 or graph.indices.numel() == 0 or any(f <= 0 for f in sampler.fanouts):
        return False
    first = 0 if exchange_inputs else 1
    return all(f"ids/layer{layer}" in comm.capacities.sent for layer in range(first, sampler.num_layers))


class _Layer:
    """One layer's buffers and device sizes, until the read."""

    def __init__(self, layer, num_dst, src_nodes, num_src, src_local, dst_index, edge_ids, num_edges):
        self.layer, self.num_dst, self.src_nodes, self.num_src = layer, num_dst, src_nodes, num_src
        self.src_local, self.dst_index, self.edge_ids, self.num_edges = src_local, dst_index, edge_ids, num_edges
        self.exchange: Optional[SlotExchange] = None
        self.order = self.send_idx = self.frontier = self.num_frontier = None
        self.num_interior = None
        """The new frontier's rows no other rank asked for (a 0-d tensor), when it is ordered interior first."""
        self.interior_edges = torch.zeros_like(num_edges)
        """The edges of this layer's interior destinations (those of the frontier it sampled), for overlap."""


def sample_deferred(graph: Graph, targets: torch.Tensor, owner: torch.Tensor, sampler: NeighborSampler,
                    comm: Communicator, epoch: int, iteration: int, exchange_inputs: bool = True,
                    overlap: bool = False) -> Optional[MiniBatch]:
    """This rank's split of one global mini-batch, as :func:`gsplit.split.sp_sample` makes it, with one host read.

    ``targets`` are this rank's targets on the sampling device, ``owner`` the partition map there. Returns
    ``None`` when a slot overflowed on any rank (every rank returns ``None`` then, in the same read): the caller
    samples the batch with the exact path. Call it only where :func:`deferred_applies`. ``overlap``: as in
    :func:`gsplit.split.sp_sample`, frontiers above the input interior first and every block but the last with
    its overlap plan (:func:`gsplit.minibatch.overlap.plan_overlap`, given the sizes read here).

    Example:
        >>> batch = sample_deferred(g, targets, owner, sampler, comm, epoch=0, iteration=3)   # doctest: +SKIP
        >>> batch is None or batch.blocks[-1].dst_nodes.equal(targets)                         # doctest: +SKIP
    """
    device, world = targets.device, comm.world_size
    n = graph.num_nodes
    frontier = targets.to(torch.int64)
    num_frontier = torch.full((), frontier.numel(), dtype=torch.int64, device=device)
    layers: List[_Layer] = []
    bad = torch.zeros((), dtype=torch.int64, device=device)
    num_interior = None
    for layer in reversed(range(sampler.num_layers)):
        key = counter_rng.stream_key(sampler.seed, epoch, iteration, layer)
        src, dst_index, edge_ids, num_edges, bad_here = ops.sample_neighbors_padded(
            graph, frontier, num_frontier, sampler.fanouts[layer], sampler.replace, key)
        bad = bad | bad_here
        edge_valid = torch.arange(src.numel(), device=device) < num_edges
        mixed, num_mixed, src_local = ops.relabel_padded(frontier, num_frontier, src, edge_valid, n)
        step = _Layer(layer, num_frontier, mixed, num_mixed, src_local, dst_index, edge_ids, num_edges)
        if num_interior is not None:  # the in-edges of the interior destinations come first (grouped by destination)
            step.interior_edges = (edge_valid & (dst_index < num_interior)).sum()
        layers.append(step)
        if layer == 0 and not exchange_inputs:
            break
        _exchange(step, owner, comm, n, interior_first=overlap and layer > 0)
        frontier, num_frontier, num_interior = step.frontier, step.num_frontier, step.num_interior
    sizes = _read_sizes(layers, bad, world)  # the one wait
    if sizes is None:
        return None
    batch = _cut(layers, sizes, comm, targets)
    if overlap:
        plan_overlap(batch.blocks, comm.rank, interior_edges=[row[2] for row in reversed(sizes)][:-1])
    return batch


def _exchange(step: _Layer, owner: torch.Tensor, comm: Communicator, num_nodes: int, interior_first: bool) -> None:
    """The id exchange of one layer in slots, and the union of the requests (sorted) as the next frontier;
    ``interior_first``: reordered as :func:`gsplit.split.split_sampling._interior_first` orders it."""
    world, device = comm.world_size, step.src_nodes.device
    valid = torch.arange(step.src_nodes.numel(), device=device) < step.num_src
    kind = _rank_dtype(world + 1)  # the smallest integers that hold a rank and the padding's mark: a radix sort
    dest = torch.where(valid, owner.index_select(0, torch.where(valid, step.src_nodes, 0)).to(kind), world)
    # grouped by owner (stable: each owner's ids in frontier order, as the exact path sends them), padding last
    dest_sorted, order = torch.sort(dest, stable=True)
    step.order = order
    step.exchange = comm.all_to_all_slots(step.src_nodes.index_select(0, order), dest_sorted,
                                          tag=f"ids/layer{step.layer}")
    requested = step.exchange.received
    empty = requested[:0]
    valid_requests = step.exchange.valid()
    step.frontier, step.num_frontier, step.send_idx = ops.relabel_padded(
        empty, torch.zeros((), dtype=torch.int64, device=device), requested, valid_requests, num_nodes)
    if interior_first:
        _interior_first(step, valid_requests, comm.rank)


def _interior_first(step: _Layer, valid_requests: torch.Tensor, rank: int) -> None:
    """The new frontier reordered rows no other rank asked for first (each part in id order), the send rows
    renumbered to match, the count kept on the device: the exact path's ``_interior_first`` on padded buffers."""
    frontier, n, dev = step.frontier, step.frontier.numel(), step.frontier.device
    caps = step.exchange.recv_cap
    sender = torch.cat([torch.full((c,), i, dtype=torch.int64, device=dev) for i, c in enumerate(caps)])
    send_idx = torch.where(valid_requests, step.send_idx, 0)
    # rows another rank asked for; every other entry marks a dump row past the end
    asked = torch.where(valid_requests & (sender != rank), send_idx, n)
    boundary = torch.zeros(n + 1, dtype=torch.int64, device=dev).index_fill_(0, asked, 1)[:n]
    before = torch.cumsum(boundary, 0)  # boundary rows up to and including each row
    rows = torch.arange(n, device=dev)
    num_interior = step.num_frontier - (before[-1] if n else 0)
    new_of_old = torch.where(boundary.bool(), num_interior + before - 1, rows - before)
    new_of_old = torch.where(rows < step.num_frontier, new_of_old, n + rows)  # padding rows: places of their own
    reordered = torch.empty(2 * n, dtype=frontier.dtype, device=dev).index_copy_(0, new_of_old, frontier)
    step.frontier, step.num_interior = reordered[:n], num_interior
    step.send_idx = new_of_old.index_select(0, send_idx)


def _rank_dtype(n: int) -> torch.dtype:
    """The smallest signed integer type that holds ``n - 1``."""
    for dtype in (torch.int8, torch.int16, torch.int32):
        if n - 1 <= torch.iinfo(dtype).max:
            return dtype
    return torch.int64


def _read_sizes(layers: List[_Layer], bad: torch.Tensor, world: int) -> Optional[List[List[int]]]:
    """Every layer's sizes in one read: per layer ``[edges, mixed, interior edges, frontier, interior, sent...,
    received..., overflow...]``
    (the exchange's entries absent where the layer has none). Raises on an id out of range; ``None`` on overflow."""
    parts = [bad.reshape(1)]
    for step in layers:
        parts.append(torch.stack([step.num_edges, step.num_src, step.interior_edges]).to(torch.int64))
        if step.exchange is not None:
            ex = step.exchange
            interior = step.num_frontier if step.num_interior is None else step.num_interior
            parts += [torch.stack([step.num_frontier, interior]).to(torch.int64), ex.sent_counts, ex.recv_counts,
                      ex.overflow]
    with waiting_for_peers():  # under NCCL the host waits here for the peers' slots too
        flat = torch.cat([p.to(torch.int64) for p in parts]).tolist()
    if flat[0]:
        raise ValueError("split sampling met a vertex id outside the graph in a frontier; the targets or the "
                         "partition map do not belong to this graph: pass ids in [0, num_nodes)")
    out, at, overflow = [], 1, False
    for step in layers:
        width = 3 + (2 + 3 * world if step.exchange is not None else 0)
        row = flat[at:at + width]
        at += width
        overflow = overflow or any(row[5 + 2 * world:])
        out.append(row)
    return None if overflow else out


def _cut(layers: List[_Layer], sizes: List[List[int]], comm: Communicator, targets: torch.Tensor) -> MiniBatch:
    """The blocks and shuffle plans of the read sizes: every buffer cut to its size."""
    world, blocks = comm.world_size, []
    num_dst, frontier = targets.numel(), targets
    for step, row in zip(layers, sizes):
        num_edges, num_mixed = row[0], row[1]
        src_nodes = step.src_nodes[:num_mixed]
        if step.exchange is None:  # layer 0 without an exchange: this rank reads every input row itself
            index = ShuffleIndex.read_directly(num_mixed, comm.rank, world, src_nodes.device, tag="shuffle/layer0")
            next_frontier = src_nodes
        else:
            num_local, num_interior = row[3], (row[4] if step.num_interior is not None else None)
            sent, received = row[5:5 + world], row[5 + world:5 + 2 * world]
            comm.settle_slots(step.exchange, sent, received)
            send_idx = torch.cat([step.send_idx[step.exchange.slot(i, received[i])] for i in range(world)])
            index = ShuffleIndex(send_idx=send_idx, send_counts=received, recv_pos=step.order[:num_mixed],
                                 recv_counts=sent, num_local=num_local, num_mixed=num_mixed,
                                 tag=f"shuffle/layer{step.layer}", num_interior=num_interior)
            next_frontier = step.frontier[:num_local]
        blocks.append(Block(src_nodes=src_nodes, num_dst=num_dst, edge_src=step.src_local[:num_edges],
                            edge_dst=step.dst_index[:num_edges], edge_ids=step.edge_ids[:num_edges], layer=step.layer,
                            shuffle_index=index))
        num_dst, frontier = next_frontier.numel(), next_frontier
    blocks.reverse()
    return MiniBatch(input_nodes=frontier, output_nodes=blocks[-1].dst_nodes, blocks=blocks)
