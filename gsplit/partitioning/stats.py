"""Split quality of a partition map: cross-split edges and load imbalance per layer (GSplit paper, Fig. 5)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List

import torch

from gsplit.graph import Graph
from gsplit.interop.graphs import as_graph, as_sampler  # DGLGraph / PyG Data in; imports neither library
from gsplit.partitioning.partition_map import PartitionMap
from gsplit.partitioning.presample import check_train_idx
from gsplit.sampling.batches import global_batches

log = logging.getLogger(__name__)

STATS_FIRST_EPOCH = 1 << 20
"""Epoch number of the first batch :func:`split_stats` samples. Pre-sampling uses epochs ``0, 1, ...``;
starting far away makes the statistics an out-of-sample measure of the map, not of the batches it was fit to."""


@dataclass
class SplitStats:
    """How a partition map splits sampled mini-batches, per GNN layer (index 0 = input layer), averaged over batches."""

    num_parts: int
    """Parts (GPUs) of the map."""
    method: str
    """The map's method."""
    num_batches: int
    """Mini-batches measured."""
    batch_size: int
    """Targets per (global) mini-batch."""
    cross_edge_fraction: List[float]
    """Per layer: fraction of the block's edges whose endpoints are owned by different parts."""
    edge_imbalance: List[float]
    """Per layer: max over parts / mean over parts of the block's edges, an edge counting for its dst's owner."""
    vertex_imbalance: List[float]
    """Per layer: max / mean over parts of the block's destination vertices."""
    input_imbalance: float
    """max / mean over parts of the input vertices (``blocks[0].src_nodes``): feature-loading balance."""
    per_batch: Dict[str, List[List[float]]] = field(default_factory=dict)
    """Raw values per batch and layer, keyed like the averaged fields (omitted from ``to_dict`` by default)."""

    @property
    def mean_cross_edge_fraction(self) -> float:
        """Cross-edge fraction averaged over layers."""
        return sum(self.cross_edge_fraction) / len(self.cross_edge_fraction)

    @property
    def max_edge_imbalance(self) -> float:
        """Worst layer's (batch-averaged) edge imbalance."""
        return max(self.edge_imbalance)

    def to_dict(self, per_batch: bool = False) -> Dict[str, Any]:
        """A JSON-ready dict of the fields (and of the two summary properties)."""
        d = asdict(self)
        if not per_batch:
            d.pop("per_batch")
        d["mean_cross_edge_fraction"] = self.mean_cross_edge_fraction
        d["max_edge_imbalance"] = self.max_edge_imbalance
        return d


def _imbalance(owners: torch.Tensor, num_parts: int) -> float:
    """max / mean of the per-part counts of ``owners``; 1.0 when there is nothing to balance."""
    if owners.numel() == 0:
        return 1.0
    counts = torch.bincount(owners, minlength=num_parts).to(torch.float64)
    return float(counts.max() / counts.mean())


def split_stats(graph: Graph, pmap: PartitionMap, sampler, train_idx, batch_size: int, num_batches: int,
                seed: int = 0, first_epoch: int = STATS_FIRST_EPOCH) -> SplitStats:
    """Measure ``pmap`` on ``num_batches`` reference mini-batches of ``batch_size`` targets.

    Batches are cut from permutations of ``train_idx`` seeded by ``(seed, epoch)`` (as in
    :func:`gsplit.presample`), for epochs ``first_epoch, first_epoch + 1, ...`` as many as needed, and
    sampled with ``sampler.sample_blocks``. For every block, an edge ``src -> dst`` is *cross* when
    ``pmap[src] != pmap[dst]``, and it is work of ``pmap[dst]``'s part.

    Example:
        >>> from gsplit import Graph, NeighborSampler
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> pm = PartitionMap.from_tensor(torch.tensor([0, 0, 1, 1]), 2, graph=g)
        >>> s = split_stats(g, pm, NeighborSampler([-1]), torch.arange(4), batch_size=4, num_batches=1)
        >>> s.cross_edge_fraction, s.edge_imbalance
        ([0.5], [1.0])
    """
    graph, sampler = as_graph(graph), as_sampler(sampler)
    pmap.check_graph(graph)
    train_idx = check_train_idx(graph, train_idx)
    if int(batch_size) < 1 or int(num_batches) < 1:
        raise ValueError(f"batch_size={batch_size}, num_batches={num_batches}; both must be positive")
    batch_size, num_batches = int(batch_size), int(num_batches)
    assign = pmap.assignment.to(graph.device).to(torch.int64)
    p = pmap.num_parts
    cross: List[List[float]] = []
    eimb: List[List[float]] = []
    vimb: List[List[float]] = []
    inimb: List[float] = []
    epoch = int(first_epoch)
    while len(cross) < num_batches:
        for it, seeds in enumerate(global_batches(train_idx, batch_size, seed, epoch)):
            if len(cross) == num_batches:
                break
            blocks = sampler.sample_blocks(graph, seeds, epoch, it)
            c_row, e_row, v_row = [], [], []
            for b in blocks:
                own_dst = assign[b.dst_nodes]
                e_dst = own_dst[b.edge_dst]
                e_src = assign[b.src_nodes[b.edge_src]]
                c_row.append(float((e_src != e_dst).to(torch.float64).mean()) if e_dst.numel() else 0.0)
                e_row.append(_imbalance(e_dst, p))
                v_row.append(_imbalance(own_dst, p))
            cross.append(c_row)
            eimb.append(e_row)
            vimb.append(v_row)
            inimb.append(_imbalance(assign[blocks[0].src_nodes], p))
        epoch += 1

    def avg(rows: List[List[float]]) -> List[float]:
        return [sum(col) / len(col) for col in zip(*rows)]

    stats = SplitStats(num_parts=p, method=pmap.method, num_batches=num_batches, batch_size=batch_size,
                       cross_edge_fraction=avg(cross), edge_imbalance=avg(eimb), vertex_imbalance=avg(vimb),
                       input_imbalance=sum(inimb) / len(inimb),
                       per_batch={"cross_edge_fraction": cross, "edge_imbalance": eimb, "vertex_imbalance": vimb})
    log.info("split stats (%s, %d parts, %d batches): cross-edge fraction %s, edge imbalance %s", pmap.method, p,
             num_batches, [round(x, 3) for x in stats.cross_edge_fraction], [round(x, 3) for x in stats.edge_imbalance])
    return stats
