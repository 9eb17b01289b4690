"""``partition_full_graph``: a partition map for full-graph training (no pre-sampling).

In a full-graph epoch every vertex is computed at every layer over all its in-edges, so a rank's work
per layer is its vertices' in-edges (aggregation) and its vertices (dense transforms, activations), and
its communication is the remote in-neighbours it reads (its halo), which the edge cut bounds. METIS
therefore balances two constraints per vertex, its in-degree and 1, and minimises the plain edge cut of
the symmetrised graph (``balance="two"``, default); ``balance="combined"`` gives METIS the single weight
``in-degree + 1`` instead (for METIS builds without multi-constraint support, or a looser balance).
The METIS call, graph symmetrisation and weight scaling are :mod:`gsplit.partitioning.metis`'s.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from gsplit.data.graph import Graph
from gsplit.partitioning import metis
from gsplit.partitioning.partition_map import PartitionMap
from gsplit.partitioning.strategies import check_part_args

log = logging.getLogger(__name__)

FULL_GRAPH_METHOD = "full-graph"
"""``PartitionMap.method`` of the maps this module makes."""

FULL_GRAPH_BALANCE = ("two", "combined")
"""``balance`` choices of :func:`partition_full_graph`."""


def full_graph_vertex_weights(graph: Graph, balance: str = "two") -> np.ndarray:
    """Float vertex weights for METIS: ``[n, 2]`` (in-degree, 1) or ``[n]`` (in-degree + 1).

    Example:
        >>> g = Graph.from_edges([0, 0, 1], [1, 2, 2])
        >>> full_graph_vertex_weights(g, "combined").tolist()
        [1.0, 2.0, 3.0]
    """
    if balance not in FULL_GRAPH_BALANCE:
        raise ValueError(f"balance={balance!r}; use one of {', '.join(FULL_GRAPH_BALANCE)}")
    deg = graph.in_degrees().cpu().numpy().astype(np.float64)
    if balance == "combined" or not deg.any():  # a graph without edges has only the vertex count to balance
        return deg + 1.0
    return np.stack([deg, np.ones_like(deg)], 1)


def partition_full_graph(graph: Graph, num_parts: int, *, balance: str = "two", seed: int = 0,
                         ufactor: int = 30) -> PartitionMap:
    """Partition ``graph`` for full-graph training over ``num_parts`` ranks: balanced in-edges and vertices,
    few cut edges. No pre-sampling: every edge is used at every layer.

    ``ufactor`` is METIS's tolerance in thousandths (30: a part may exceed the average by 3% per
    constraint). The map is deterministic for a given ``seed``; its metadata keeps METIS's edge cut.

    Example:
        >>> g = Graph.from_edges([0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3], symmetric=True)  # two triangles
        >>> pm = partition_full_graph(g, 2)
        >>> pm.method, pm.part_sizes().tolist(), pm.metadata["metis_edgecut"]
        ('full-graph', [3, 3], 0)
    """
    num_parts = check_part_args(num_parts, graph.num_nodes, ufactor)
    n = graph.num_nodes
    t0 = time.perf_counter()
    vw = full_graph_vertex_weights(graph, balance)
    meta = {"seed": int(seed), "balance": balance, "ufactor": int(ufactor)}
    if num_parts == 1:
        assign = np.zeros(n, dtype=np.int64)
    else:
        xadj, adjncy, _ = metis.symmetrize(graph)  # unit edge weights: the plain edge cut is minimised
        vw_int = metis.to_metis_weights(vw, *metis._weight_limits(), keep_positive=True)
        assign, cut, backend = metis.metis_part_kway(xadj, adjncy, num_parts, vw_int, None, seed=int(seed),
                                                     ufactor=int(ufactor))
        meta.update(metis_edgecut=int(cut), metis_backend=backend, ncon=1 if vw_int.ndim == 1 else int(vw_int.shape[1]))
    meta["seconds"] = round(time.perf_counter() - t0, 3)
    pmap = PartitionMap(assignment=torch.from_numpy(assign), num_parts=num_parts, method=FULL_GRAPH_METHOD,
                        graph_fingerprint=graph.fingerprint(), num_nodes=n, metadata=meta)
    sizes = pmap.part_sizes()
    if bool((sizes == 0).any()):
        log.warning("full-graph partition left %d of %d parts empty (sizes %s)", int((sizes == 0).sum()), num_parts,
                    sizes.tolist())
    log.info("full-graph partition of %d vertices into %d parts in %.1fs; part sizes %s", n, num_parts,
             meta["seconds"], sizes.tolist())
    return pmap
