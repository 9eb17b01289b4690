"""A host's share of the graph in full-graph training across hosts (GraNNDis's shared preloading).

A *host map* gives every vertex a host (its *inner* vertices). An L-layer GNN computes an inner vertex's
output from the inputs of the vertices at most L in-edges upstream of it, so a host that holds its inner
vertices plus that *halo* computes every layer without reading anything from another host: the only
traffic across hosts is then the gradient all-reduce. :func:`host_subgraph` builds that share once: the
host's vertices (global ids), a :class:`~gsplit.Graph` over them in local ids, and which global edge each
local edge is.

Which edges are kept: a vertex ``d`` external hops from the inner vertices (``d = 0``: inner) feeds the
inner vertices' outputs only through layers ``<= L - d``, so its in-edges are needed for ``d < L`` and
kept (those whose source is in the share; with the full halo that is all of them), and a vertex at
``d = L`` is an input only. With the full halo (``external_hops = L``, no fanout) the inner vertices'
outputs are therefore exactly those of training on the whole graph; the halo's own outputs are
computed too (GraNNDis's redundant work) and are not part of the loss.

**Expansion-aware sampling** (``external_hops = m < L`` and/or ``external_fanout = k``) bounds the
halo, as GraNNDis does for deep GNNs: only vertices at most ``m`` external hops away are kept, inner
vertices keep every in-edge, and an external vertex keeps its in-edges from inner vertices plus at most
``k`` of those from external vertices, picked by a hash of ``(seed, edge id)``: the same on every rank
and every host, whatever the order of the calls. It is an approximation (the vertices at the edge of
the halo miss in-edges), no longer equal to training on the whole graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from gsplit.data.graph import Graph
from gsplit.ops.counter_rng import mix64, stream_key, vertex_keys

__all__ = ["HostSubgraph", "host_subgraph", "check_halo_options"]


@dataclass
class HostSubgraph:
    """One host's vertices and the edges it computes over, in local ids (positions in ``nodes``)."""

    host: int
    """The host (part of the host map) this share is for."""
    nodes: torch.Tensor
    """int64 global ids of the host's vertices, sorted: local id ``i`` is global vertex ``nodes[i]``."""
    graph: Graph
    """The kept edges (CSC over local ids): every in-edge of a vertex less than L hops out, from the share."""
    edge_ids: torch.Tensor
    """int64 global edge id (position in the whole graph's ``indices``) of every edge of ``graph``, in its order."""
    hops: torch.Tensor
    """int64 external hops of every local vertex: 0 for inner vertices, 1 for their in-neighbours elsewhere, ..."""

    @property
    def inner(self) -> torch.Tensor:
        """Boolean mask of the host's inner vertices (local ids)."""
        return self.hops == 0

    @property
    def num_inner(self) -> int:
        """Vertices of the share this host owns (trains)."""
        return int((self.hops == 0).sum())

    @property
    def num_halo(self) -> int:
        """Vertices of the share owned by another host (preloaded, computed again here)."""
        return self.nodes.numel() - self.num_inner


def check_halo_options(num_layers: int, external_hops: Optional[int], external_fanout: Optional[int]) -> int:
    """The external hops to keep (``external_hops`` clamped to ``num_layers``; ``None``: the full halo).

    Example:
        >>> check_halo_options(3, None, None), check_halo_options(3, 5, None), check_halo_options(3, 1, 15)
        (3, 3, 1)
    """
    if external_hops is not None and int(external_hops) < 1:
        raise ValueError(f"external_hops={external_hops}; pass at least 1 (0 would keep no vertex of another host, "
                         f"so the inner vertices would lose their in-edges from it), or leave it out for the full "
                         f"{num_layers}-hop halo")
    if external_fanout is not None and int(external_fanout) < 1:
        raise ValueError(f"external_fanout={external_fanout}; pass at least 1 in-neighbour per external vertex, or "
                         "leave it out to keep every one")
    return int(num_layers) if external_hops is None else min(int(external_hops), int(num_layers))


def _in_edge_positions(graph: Graph, vertices: torch.Tensor) -> torch.Tensor:
    """Positions in ``graph.indices`` of every in-edge of ``vertices``, grouped by vertex in their order."""
    start, end = graph.indptr[vertices], graph.indptr[vertices + 1]
    counts = end - start
    total = int(counts.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.int64)
    offsets = torch.repeat_interleave(start - (torch.cumsum(counts, 0) - counts), counts)
    return offsets + torch.arange(total)


def _sampled(positions: torch.Tensor, dst: torch.Tensor, fanout: int, seed: int) -> torch.Tensor:
    """Mask of the at most ``fanout`` edges per destination with the smallest hash of ``(seed, edge id)``."""
    if positions.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    score = mix64(vertex_keys(stream_key(int(seed), 0, 0, 0), positions))
    order = torch.argsort(score, stable=True)
    order = order[torch.argsort(dst[order], stable=True)]  # by destination, then by score
    d = dst[order]
    first = torch.ones_like(d, dtype=torch.bool)
    first[1:] = d[1:] != d[:-1]
    idx = torch.arange(d.numel())
    group_start = torch.cummax(torch.where(first, idx, torch.zeros_like(idx)), 0).values
    keep = torch.zeros(positions.numel(), dtype=torch.bool)
    keep[order] = (idx - group_start) < int(fanout)
    return keep


def host_subgraph(graph: Graph, host_map: torch.Tensor, host: int, num_layers: int, *,
                  external_hops: Optional[int] = None, external_fanout: Optional[int] = None,
                  seed: int = 0) -> HostSubgraph:
    """Host ``host``'s share for ``num_layers`` layers: its inner vertices (``host_map == host``) and their halo.

    Defaults give the full ``num_layers``-hop halo (exact); ``external_hops``/``external_fanout`` bound it
    (expansion-aware sampling, see the module's text). Deterministic: every rank building it gets the same.

    Example:
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 4])        # a path 0 -> 1 -> 2 -> 3 -> 4
        >>> share = host_subgraph(g, torch.tensor([0, 0, 0, 1, 1]), host=1, num_layers=2)
        >>> share.nodes.tolist(), share.hops.tolist(), share.graph.num_edges   # 1 is an input only
        ([1, 2, 3, 4], [2, 1, 0, 0], 3)
    """
    graph = graph.to("cpu")
    n = graph.num_nodes
    host_map = torch.as_tensor(host_map).to("cpu", torch.int64)
    if host_map.shape != (n,):
        raise ValueError(f"host_map has shape {tuple(host_map.shape)} but the graph has {n} vertices; pass one host "
                         "per vertex")
    hops_limit = check_halo_options(num_layers, external_hops, external_fanout)
    fanout = None if external_fanout is None else int(external_fanout)
    hops = torch.full((n,), -1, dtype=torch.int64)
    frontier = (host_map == int(host)).nonzero().flatten()
    hops[frontier] = 0
    for d in range(1, hops_limit + 1):
        if frontier.numel() == 0:
            break
        pos = _in_edge_positions(graph, frontier)
        src = graph.indices[pos]
        if fanout is not None and d > 1:  # external vertices: at most k of their external in-edges
            dst = torch.repeat_interleave(frontier, graph.indptr[frontier + 1] - graph.indptr[frontier])
            external = hops[src] != 0
            keep = ~external
            keep[external] = _sampled(pos[external], dst[external], fanout, seed)
            src = src[keep]
        src = src[hops[src] < 0].unique()
        hops[src] = d
        frontier = src
    nodes = (hops >= 0).nonzero().flatten()  # sorted
    local = torch.full((n,), -1, dtype=torch.int64)
    local[nodes] = torch.arange(nodes.numel())
    computed = nodes[hops[nodes] < int(num_layers)]  # a vertex L hops out is an input only
    pos = _in_edge_positions(graph, computed)
    src = graph.indices[pos]
    dst = torch.repeat_interleave(computed, graph.indptr[computed + 1] - graph.indptr[computed])
    keep = local[src] >= 0
    if fanout is not None:  # the same picks as the expansion above: they depend on the edge id only
        external = (hops[dst] > 0) & (hops[src] != 0)
        picked = torch.zeros_like(keep)
        picked[external] = _sampled(pos[external], dst[external], fanout, seed)
        keep &= ~external | picked
    pos, src, dst = pos[keep], src[keep], dst[keep]
    counts = torch.zeros(nodes.numel(), dtype=torch.int64).index_add_(0, local[dst], torch.ones_like(dst))
    indptr = torch.zeros(nodes.numel() + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(counts, 0)
    sub = Graph.from_csc(indptr, local[src], validate=False)
    return HostSubgraph(host=int(host), nodes=nodes, graph=sub, edge_ids=pos, hops=hops[nodes])
