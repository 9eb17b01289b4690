"""Split-parallel sampling: each rank samples only the vertices it owns, one id exchange per layer.

Layer by layer from the top, rank ``r`` samples the in-edges of its *local frontier* (vertices it
owns at that level), giving a block whose sources form a *mixed frontier* of local and remote
vertices. The ids are sent to their owners with one all-to-all; each owner's next local frontier is
the union of what it received. Because picks are counter-based, the union over ranks of the blocks
is exactly the single-process mini-batch of ``NeighborSampler.sample_blocks`` for the same seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from gsplit.comm.communicator import Communicator
from gsplit.graph import Graph
from gsplit.sampling.block import Block
from gsplit.sampling.neighbor import NeighborSampler, relabel, unique_ids
from gsplit.split.shuffle_index import ShuffleIndex


@dataclass
class SplitBatch:
    """One rank's split of a global mini-batch."""

    input_nodes: torch.Tensor
    """int64 global ids of the rank's bottom local frontier: the only vertices whose features it loads."""
    output_nodes: torch.Tensor
    """int64 global ids of the rank's local targets, in the order of the global seeds."""
    blocks: List[Block]
    """One block per layer (index 0 = input layer); ``blocks[l].shuffle_index`` feeds layer ``l``."""


def exchange_ids(ids: torch.Tensor, owner: torch.Tensor, comm: Communicator, tag: str,
                 num_nodes: Optional[int] = None):
    """Send each id to its owner; return ``(new_local_frontier, ShuffleIndex)`` for the reverse rows.

    ``ids`` are the mixed frontier (unique); ``owner[i]`` owns ``ids[i]``. The owner's new frontier is
    the sorted union of every id it receives; the returned index moves that frontier's rows back to
    the requesting ranks' mixed-frontier positions.
    """
    world = comm.world_size
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=world).cpu()
    recv_counts = comm.exchange_counts(send_counts)
    recv_ids = comm.all_to_all_rows(ids[order], send_counts.tolist(), recv_counts.tolist(), tag=f"ids/{tag}")
    frontier = unique_ids(recv_ids, num_nodes)
    send_idx = torch.searchsorted(frontier, recv_ids)
    index = ShuffleIndex(send_idx=send_idx, send_counts=recv_counts.tolist(), recv_pos=order,
                         recv_counts=send_counts.tolist(), num_local=frontier.numel(), num_mixed=ids.numel(),
                         comm=comm, tag=f"shuffle/{tag}")
    return frontier, index


def sp_sample(graph: Graph, seeds: torch.Tensor, owner: torch.Tensor, sampler: NeighborSampler,
              comm: Communicator, epoch: int = 0, iteration: int = 0) -> SplitBatch:
    """Sample this rank's split of the global mini-batch ``seeds``.

    Args:
        graph: the full graph (every rank holds it, as in the paper).
        seeds: the *global* mini-batch's target vertices, identical on every rank.
        owner: ``owner[v]`` is the rank that owns vertex ``v`` (``PartitionMap.assignment``).
        sampler: the counter-based sampler; its picks do not depend on the rank.
        comm: this rank's communicator; every rank must call ``sp_sample`` for every iteration.
        epoch, iteration: counters that, with the sampler seed, fix the mini-batch.

    Example:
        >>> batch = sp_sample(g, seeds, pmap.assignment, sampler, Communicator())   # doctest: +SKIP
        >>> batch.blocks[-1].dst_nodes                      # this rank's targets    # doctest: +SKIP
    """
    seeds = seeds.to(graph.device, torch.int64)
    owner = owner.to(graph.device)
    if owner.numel() != graph.num_nodes:
        raise ValueError(f"the partition map covers {owner.numel()} vertices but the graph has {graph.num_nodes}; "
                         "use a map made for this graph")
    frontier = seeds[owner[seeds] == comm.rank]
    output_nodes = frontier
    blocks: List[Block] = []
    for layer in reversed(range(sampler.num_layers)):
        sampled = sampler.sample_neighbors(graph, frontier, layer, epoch, iteration)
        src_nodes, src_local = relabel(frontier, sampled.src, graph.num_nodes)
        next_frontier, index = exchange_ids(src_nodes, owner[src_nodes].long(), comm, tag=f"layer{layer}",
                                            num_nodes=graph.num_nodes)
        blocks.append(Block(src_nodes=src_nodes, num_dst=frontier.numel(), edge_src=src_local,
                            edge_dst=sampled.dst_index, edge_ids=sampled.edge_ids, layer=layer,
                            shuffle_index=index))
        frontier = next_frontier
    blocks.reverse()
    # the loss is averaged over the global mini-batch, so the top block knows its global size
    blocks[-1].global_num_dst = seeds.numel()
    return SplitBatch(input_nodes=frontier, output_nodes=output_nodes, blocks=blocks)
