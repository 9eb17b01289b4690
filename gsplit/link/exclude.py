"""Edge exclusion: neighbour sampling without the edges of the global mini-batch (and their reverses).

As in DGL (``sample_neighbors(..., exclude_edges=...)``) excluded edges are removed *before* the picks: a
vertex that loses in-edges picks ``fanout`` of the rest. The vertices that lose some get a small CSC of
their remaining in-edges (:class:`ReducedInEdges`, numbered by their rank in the sorted set of such
vertices) and are sampled from it with a key of their own; the others are sampled from the graph as usual.
Both are functions of the global mini-batch only, so every rank, and one process, picks the same edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch

from gsplit import ops
from gsplit.graph import Graph
from gsplit.ops.torch_ops import _segment_arange
from gsplit.sampling import counter_rng
from gsplit.sampling.neighbor import NeighborSampler, SampledEdges

_EXCLUDED_SALT = 0x5EED_E0C1
"""Mixed into the stream key of the vertices that lost in-edges, so their draws are not those of vertex ids."""


@dataclass(frozen=True)
class ReducedInEdges:
    """The in-edges of the vertices that lose some to exclusion, without the excluded ones."""

    vertices: torch.Tensor
    """int64 sorted global ids of the vertices that lose at least one in-edge; vertex ``vertices[i]`` is ``i``
    in ``graph``."""
    graph: Graph
    """CSC of their remaining in-edges (``indices`` hold global source ids)."""
    edge_ids: torch.Tensor
    """int64 global edge id of each edge of ``graph``."""


def reduced_in_edges(graph: Graph, excluded: torch.Tensor) -> ReducedInEdges:
    """The :class:`ReducedInEdges` of ``graph`` without the edges ``excluded`` (sorted, distinct edge ids).

    Example:
        >>> g = Graph.from_edges([0, 1, 2], [1, 1, 1])
        >>> r = reduced_in_edges(g, torch.tensor([0]))
        >>> r.vertices.tolist(), r.graph.indices.tolist(), r.edge_ids.tolist()
        ([1], [1, 2], [1, 2])
    """
    indptr = graph.indptr
    dst = torch.searchsorted(indptr, excluded.to(indptr.device), right=True) - 1
    vertices = torch.unique(dst)
    start = indptr.index_select(0, vertices)
    deg = indptr.index_select(0, vertices + 1) - start
    total = int(deg.sum())
    eids = torch.repeat_interleave(start, deg, output_size=total) + _segment_arange(deg, total)
    keep = ~torch.isin(eids, excluded.to(eids.device))
    owner = torch.repeat_interleave(torch.arange(vertices.numel(), device=deg.device), deg, output_size=total)
    counts = torch.zeros(vertices.numel(), dtype=torch.int64, device=deg.device).index_add_(
        0, owner[keep], torch.ones_like(owner[keep]))
    kept = eids[keep]
    sub = Graph(indptr=torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]),
                indices=graph.indices.index_select(0, kept))
    return ReducedInEdges(vertices=vertices, graph=sub, edge_ids=kept)


class ExcludingSampler(NeighborSampler):
    """``base``'s picks, except that in iteration ``t`` the edges of ``reduced[t]`` replace the graph's in-edges
    of the vertices that lost some (see the module docstring). Made by the edge sampler for the iterations
    it samples; ``sample_many`` and split sampling use it like any sampler.

    Example:
        >>> g = Graph.from_edges([0, 1, 2], [1, 1, 1])
        >>> s = ExcludingSampler(NeighborSampler([-1]), {0: reduced_in_edges(g, torch.tensor([0]))})
        >>> s.sample_neighbors(g, torch.tensor([1]), 0, 0, 0).edge_ids.tolist()
        [1, 2]
    """

    def __init__(self, base: NeighborSampler, reduced: Dict[int, ReducedInEdges]):
        super().__init__(base.fanouts, replace=base.replace, seed=base.seed)
        self.reduced = reduced

    def sample_neighbors(self, graph: Graph, nodes: torch.Tensor, layer: int, epoch: int, iteration: int
                         ) -> SampledEdges:
        reduced = self.reduced.get(iteration)
        if reduced is None or reduced.vertices.numel() == 0:
            return super().sample_neighbors(graph, nodes, layer, epoch, iteration)
        vertices = reduced.vertices.to(nodes.device)
        local = torch.searchsorted(vertices, nodes).clamp_max(vertices.numel() - 1)
        lost = vertices.index_select(0, local) == nodes
        kept_rows = torch.nonzero(~lost).squeeze(1)
        lost_rows = torch.nonzero(lost).squeeze(1)
        key = counter_rng.stream_key(self.seed, epoch, iteration, layer)
        fanout = self.fanouts[layer]
        src1, dst1, eid1 = ops.sample_neighbors(graph, nodes.index_select(0, kept_rows), fanout, self.replace, key)
        src2, dst2, eid2 = ops.sample_neighbors(reduced.graph, local.index_select(0, lost_rows), fanout,
                                                self.replace, counter_rng.mix64_int(key ^ _EXCLUDED_SALT))
        eid2 = reduced.edge_ids.to(eid2.device).index_select(0, eid2)
        dst = torch.cat([kept_rows.index_select(0, dst1), lost_rows.index_select(0, dst2)])
        order = torch.sort(dst, stable=True).indices  # grouped by destination, each one's edges in CSC order
        return SampledEdges(src=torch.cat([src1, src2]).index_select(0, order), dst_index=dst.index_select(0, order),
                            edge_ids=torch.cat([eid1, eid2]).index_select(0, order))
