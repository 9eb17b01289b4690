"""Split quality of a partition map: cross-split edges and load imbalance per layer (GSplit paper, Fig. 5)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import torch

from gsplit.data.graph import Graph
from gsplit.interop.graphs import as_graph, as_sampler  # DGLGraph / PyG Data in; imports neither library
from gsplit.partitioning.partition_map import PartitionMap
from gsplit.partitioning.weights import check_train_idx
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
            c_row, e_row, v_row, in_imb = block_split(sampler.sample_blocks(graph, seeds, epoch, it), assign, p)
            cross.append(c_row)
            eimb.append(e_row)
            vimb.append(v_row)
            inimb.append(in_imb)
        epoch += 1
    stats = stats_of_batches(p, pmap.method, batch_size, cross, eimb, vimb, inimb)
    log.info("split stats (%s, %d parts, %d batches): cross-edge fraction %s, edge imbalance %s", pmap.method, p,
             num_batches, [round(x, 3) for x in stats.cross_edge_fraction], [round(x, 3) for x in stats.edge_imbalance])
    return stats


def block_split(blocks, assign: torch.Tensor, num_parts: int):
    """How ``assign`` splits one mini-batch's ``blocks``: per layer the cross-edge fraction, the edge and the
    destination-vertex imbalance, and the input-vertex imbalance (see :class:`SplitStats`).

    Example:
        >>> from gsplit import Graph, NeighborSampler
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> block_split(NeighborSampler([-1]).sample_blocks(g, torch.arange(4)), torch.tensor([0, 0, 1, 1]), 2)
        ([0.5], [1.0], [1.0], 1.0)
    """
    c_row, e_row, v_row = [], [], []
    for b in blocks:
        own_dst = assign[b.dst_nodes]
        e_dst = own_dst[b.edge_dst]
        e_src = assign[b.src_nodes[b.edge_src]]
        c_row.append(float((e_src != e_dst).to(torch.float64).mean()) if e_dst.numel() else 0.0)
        e_row.append(_imbalance(e_dst, num_parts))
        v_row.append(_imbalance(own_dst, num_parts))
    return c_row, e_row, v_row, _imbalance(assign[blocks[0].src_nodes], num_parts)


def stats_of_batches(num_parts: int, method: str, batch_size: int, cross, eimb, vimb, inimb) -> SplitStats:
    """The :class:`SplitStats` of per-batch rows of :func:`block_split` (averaged over the batches)."""

    def avg(rows: List[List[float]]) -> List[float]:
        return [sum(col) / len(col) for col in zip(*rows)]

    return SplitStats(num_parts=num_parts, method=method, num_batches=len(cross), batch_size=batch_size,
                      cross_edge_fraction=avg(cross), edge_imbalance=avg(eimb), vertex_imbalance=avg(vimb),
                      input_imbalance=sum(inimb) / len(inimb),
                      per_batch={"cross_edge_fraction": cross, "edge_imbalance": eimb, "vertex_imbalance": vimb})


# ---------------------------------------------------------------------------------------------- full graph
@dataclass
class FullGraphStats:
    """How a partition map splits full-graph training: every layer computes every vertex over all in-edges.

    One layer's numbers; every layer of a full-graph epoch has the same split (forward and backward each
    move ``sum(halo_rows)`` rows per layer above the first).
    """

    num_parts: int
    """Parts (ranks) of the map."""
    num_nodes: int
    """Vertices of the graph."""
    num_edges: int
    """Edges of the graph (in-edges, counted once each)."""
    cut_edges: int
    """Edges whose source and destination are owned by different parts."""
    vertices: List[int]
    """Per part: vertices it owns (computes at every layer)."""
    in_edges: List[int]
    """Per part: in-edges of its vertices (its aggregation work per layer)."""
    halo_rows: List[int]
    """Per part: distinct remote in-neighbours of its vertices (rows it receives per layer)."""
    sent_rows: List[int]
    """Per part: rows it sends to other parts per layer (its vertices that other parts read)."""

    @property
    def cut_fraction(self) -> float:
        """Fraction of the edges that cross parts."""
        return self.cut_edges / max(self.num_edges, 1)

    @staticmethod
    def _imbalance(values: List[int]) -> float:
        mean = sum(values) / max(len(values), 1)
        return max(values) / mean if mean > 0 else 1.0

    @property
    def vertex_imbalance(self) -> float:
        """max / mean of the parts' vertices."""
        return self._imbalance(self.vertices)

    @property
    def edge_imbalance(self) -> float:
        """max / mean of the parts' in-edges (aggregation work)."""
        return self._imbalance(self.in_edges)

    @property
    def halo_imbalance(self) -> float:
        """max / mean of the parts' halo rows (received rows)."""
        return self._imbalance(self.halo_rows)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict of the fields and the derived ratios."""
        d = asdict(self)
        d.update(cut_fraction=self.cut_fraction, vertex_imbalance=self.vertex_imbalance,
                 edge_imbalance=self.edge_imbalance, halo_imbalance=self.halo_imbalance)
        return d


def full_graph_stats(graph: Graph, partition, num_parts: Optional[int] = None, chunk_edges: int = 1 << 22) -> FullGraphStats:
    """Cut edges, halo rows per part and balance of ``partition`` for full-graph training.

    ``partition`` is a :class:`PartitionMap` or a tensor of owners (then ``num_parts`` is needed). The
    edges are scanned in chunks of ``chunk_edges``; the halo needs one byte per (part, vertex).

    Example:
        >>> from gsplit import Graph
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)     # a 4-cycle
        >>> s = full_graph_stats(g, torch.tensor([0, 0, 1, 1]), 2)
        >>> s.cut_edges, s.halo_rows, s.sent_rows
        (4, [2, 2], [2, 2])
    """
    if isinstance(partition, PartitionMap):
        partition.check_graph(graph)
        num_parts = partition.num_parts
        owner = partition.assignment
    else:
        if num_parts is None:
            raise ValueError("partition is a tensor of owners; pass num_parts too")
        owner = torch.as_tensor(partition)
        if owner.numel() != graph.num_nodes:
            raise ValueError(f"the partition covers {owner.numel()} vertices but the graph has {graph.num_nodes}; "
                             "use a map made for this graph")
    p, n = int(num_parts), graph.num_nodes
    owner = owner.to(torch.int64).cpu()
    indptr, indices = graph.indptr.cpu(), graph.indices.cpu()
    deg = indptr[1:] - indptr[:-1]
    vertices = torch.bincount(owner, minlength=p)
    in_edges = torch.bincount(owner, weights=deg.to(torch.float64), minlength=p).round().to(torch.int64)
    needed = torch.zeros(p * n, dtype=torch.bool)  # needed[r * n + v]: part r reads remote vertex v
    cut = 0
    e = indices.numel()
    for a in range(0, e, int(chunk_edges)):
        b = min(a + int(chunk_edges), e)
        pos = torch.arange(a, b)
        dst = torch.searchsorted(indptr, pos, right=True) - 1
        src = indices[a:b]
        r_dst, r_src = owner[dst], owner[src]
        remote = r_dst != r_src
        cut += int(remote.sum())
        needed[r_dst[remote] * n + src[remote]] = True
    needed = needed.view(p, n)
    halo = needed.sum(1)
    sent = torch.zeros(p, dtype=torch.int64)
    for r in range(p):
        sent += torch.bincount(owner[needed[r]], minlength=p)
    return FullGraphStats(num_parts=p, num_nodes=n, num_edges=e, cut_edges=cut, vertices=vertices.tolist(),
                          in_edges=in_edges.tolist(), halo_rows=halo.tolist(), sent_rows=sent.tolist())
