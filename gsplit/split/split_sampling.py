"""Split-parallel sampling: each rank samples only the vertices it owns, one id exchange per layer.

Layer by layer from the top, rank ``r`` samples the in-edges of its *local frontier* (vertices it
owns at that level), giving a block whose sources form a *mixed frontier* of local and remote
vertices. The ids are sent to their owners with one all-to-all; each owner's next local frontier is
the union of what it received. Because picks are counter-based, the union over ranks of the blocks
is exactly the single-process mini-batch of ``NeighborSampler.sample_blocks`` for the same seeds.
The layer loop itself is :meth:`NeighborSampler.sample_layers`, shared with single-process sampling;
only the exchange step (:func:`exchange_ids`) is split parallelism's own.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from gsplit import ops
from gsplit.comm.communicator import Communicator
from gsplit.graph import Graph
from gsplit.sampling.block import MiniBatch, ShuffleIndex
from gsplit.sampling.neighbor import NeighborSampler


def exchange_ids(ids: torch.Tensor, owner: torch.Tensor, comm: Communicator, tag: str,
                 num_nodes: Optional[int] = None) -> Tuple[torch.Tensor, ShuffleIndex]:
    """Send each id of this rank's mixed frontier to its owner; return ``(new_local_frontier, ShuffleIndex)``.

    ``ids`` are the mixed frontier (unique); ``owner[i]`` owns ``ids[i]``. An owner's new local frontier
    is the sorted union of the ids it is asked for. The id exchange and the later shuffle of rows run
    in opposite directions: ids go from the rank that needs a row to the rank that owns it, rows come
    back. So the requests this rank *receives* are the rows it will *send* in the shuffle, and the
    requests it sends are the rows it will receive.
    """
    order = torch.argsort(owner, stable=True)
    requests_sent = torch.bincount(owner, minlength=comm.world_size).cpu()
    requests_received = comm.exchange_counts(requests_sent)
    requested = comm.all_to_all_rows(ids[order], requests_sent.tolist(), requests_received.tolist(),
                                      tag=f"ids/{tag}")
    frontier = ops.unique_ids(requested, num_nodes)
    index = ShuffleIndex(send_idx=torch.searchsorted(frontier, requested), send_counts=requests_received.tolist(),
                         recv_pos=order, recv_counts=requests_sent.tolist(), num_local=frontier.numel(),
                         num_mixed=ids.numel(), tag=f"shuffle/{tag}")
    return frontier, index


def sp_sample(graph: Graph, seeds: torch.Tensor, owner: torch.Tensor, sampler: NeighborSampler,
              comm: Communicator, epoch: int = 0, iteration: int = 0,
              num_global_targets: Optional[int] = None) -> MiniBatch:
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

    Returns a :class:`~gsplit.sampling.MiniBatch`: ``input_nodes`` is the rank's bottom local frontier
    (the only features it loads), ``output_nodes`` its local targets in the order of ``seeds``, and
    ``blocks[l].shuffle_index`` feeds layer ``l``.

    Example:
        >>> batch = sp_sample(g, seeds, pmap.assignment, sampler, Communicator())   # doctest: +SKIP
        >>> batch.blocks[-1].dst_nodes                      # this rank's targets    # doctest: +SKIP
    """
    seeds = seeds.to(ops.sampling_device(graph, seeds.device), torch.int64)
    owner = owner.to(seeds.device)
    if owner.numel() != graph.num_nodes:
        raise ValueError(f"the partition map covers {owner.numel()} vertices but the graph has {graph.num_nodes}; "
                         "use a map made for this graph")

    def exchange(layer: int, mixed_frontier: torch.Tensor):
        return exchange_ids(mixed_frontier, owner[mixed_frontier].long(), comm, tag=f"layer{layer}",
                            num_nodes=graph.num_nodes)

    batch = sampler.sample_layers(graph, seeds[owner[seeds] == comm.rank], epoch, iteration, exchange)
    # the loss is averaged over the global mini-batch, so the top block knows its global size
    batch.blocks[-1].global_num_dst = seeds.numel() if num_global_targets is None else int(num_global_targets)
    return batch
