"""The partition map a loader makes for itself when none is given (so that a DGL call site ports unchanged).

DGL's ``DataLoader(g, train_idx, sampler, use_ddp=True, ...)`` has no partition argument. Given no
``partition=`` with more than one rank, :class:`gsplit.DataLoader` calls :func:`default_partition`: rank 0
of the loader's group runs gsplit's method (expected pre-sampling weights for the loader's targets,
sampler and batch size, then METIS) and every rank receives the same map. Passing a map made once
(``gsplit.partition`` or ``gsplit prepare``) skips this work, which on a large graph takes minutes.

Rank 0 says so at WARNING once per job (once per process and graph size): a script that makes a training
and a validation loader without maps makes two maps, and the second is said at INFO.
"""

from __future__ import annotations

import logging
import time
from typing import Set, Tuple

import torch

from gsplit.comm.communicator import Communicator
from gsplit.data.graph import Graph
from gsplit.partitioning.strategies import partition
from gsplit.partitioning.partition_map import PartitionMap

log = logging.getLogger(__name__)

__all__ = ["default_partition"]

# (vertices, ranks) of the maps this process has said at WARNING that it made; later ones are said at INFO
_SAID: Set[Tuple[int, int]] = set()


def default_partition(graph: Graph, targets: torch.Tensor, sampler, batch_size: int, comm: Communicator) -> PartitionMap:
    """gsplit's map of ``graph`` for ``comm.world_size`` ranks, made on rank 0 and shared with every rank.

    Every rank of ``comm`` must call it (one object all-gather). ``batch_size`` is targets per rank.

    Example:
        >>> from gsplit.sampling.neighbor import NeighborSampler
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> default_partition(g, torch.arange(4), NeighborSampler([2]), 2, Communicator()).num_parts
        1
    """
    world = comm.world_size
    pmap = None
    if comm.rank == 0:
        t0 = time.perf_counter()
        pmap = partition(graph.to("cpu"), world, method="gsplit", train_idx=targets.cpu(), sampler=sampler,
                         batch_size=batch_size)
        key = (graph.num_nodes, world)
        log.log(logging.INFO if key in _SAID else logging.WARNING,
                "no partition map was given: made gsplit's map of %d vertices for %d ranks in %.1f s (pass "
                "partition= to reuse one: gsplit.partition(...) or `gsplit prepare`, saved with pmap.save(path))",
                graph.num_nodes, world, time.perf_counter() - t0)
        _SAID.add(key)
    if world > 1:
        pmap = comm.all_gather_object(pmap)[0]
    return pmap
