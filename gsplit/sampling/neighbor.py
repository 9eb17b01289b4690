"""Counter-based uniform neighbour sampling, vectorised over vertices.

The picks for vertex ``v`` at layer ``l`` of iteration ``t`` in epoch ``e`` are a pure function of
``(seed, e, t, l, v)`` (see :mod:`gsplit.sampling.counter_rng`), so sampling a set of vertices in any
order or grouping, on any rank, gives the same edges. That is what lets split-parallel sampling
reproduce the single-process mini-batch exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from gsplit.graph import Graph
from gsplit.sampling import counter_rng
from gsplit.sampling.block import Block


@dataclass(frozen=True)
class SampledEdges:
    """In-edges picked for a set of destination vertices, grouped by destination."""

    src: torch.Tensor
    """int64 global id of each picked edge's source."""
    dst_index: torch.Tensor
    """int64 index (into the ``nodes`` that were sampled) of each edge's destination; non-decreasing."""
    edge_ids: torch.Tensor
    """int64 edge id (position in ``Graph.indices``) of each picked edge."""


def _segment_arange(counts: torch.Tensor) -> torch.Tensor:
    """``cat([arange(c) for c in counts])`` without a Python loop."""
    total = int(counts.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.int64, device=counts.device)
    starts = torch.cumsum(counts, 0) - counts
    return torch.arange(total, device=counts.device) - torch.repeat_interleave(starts, counts, output_size=total)


def relabel(dst_nodes: torch.Tensor, src: torch.Tensor, num_nodes: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Local numbering for a block: ``src_nodes = dst_nodes ++ sorted(new ids in src)``.

    Returns ``(src_nodes, src_local)`` where ``src_nodes[src_local] == src``. ``dst_nodes`` must be unique.
    Given ``num_nodes`` (the graph's), a batch that is large against the graph is relabelled with
    dense per-vertex tables in O(num_nodes) instead of a sort in O(n log n); the result is the same.

    Example:
        >>> relabel(torch.tensor([9, 4]), torch.tensor([4, 7, 1]))[0].tolist()
        [9, 4, 1, 7]
    """
    if _dense_pays_off(dst_nodes.numel() + src.numel(), num_nodes):
        return _relabel_dense(dst_nodes, src, num_nodes)
    nd = dst_nodes.numel()
    uniq, inv = torch.unique(torch.cat([dst_nodes, src]), return_inverse=True)
    is_dst = torch.zeros(uniq.numel(), dtype=torch.bool, device=uniq.device)
    is_dst[inv[:nd]] = True
    new_nodes = uniq[~is_dst]
    pos = torch.empty(uniq.numel(), dtype=torch.int64, device=uniq.device)
    pos[inv[:nd]] = torch.arange(nd, device=uniq.device)
    pos[~is_dst] = torch.arange(nd, nd + new_nodes.numel(), device=uniq.device)
    return torch.cat([dst_nodes, new_nodes]), pos[inv[nd:]]


# Dense relabelling costs ~9 bytes and a scan per graph vertex; worth it when the batch is not tiny
# against the graph (measured: 5-20x faster than torch.unique for 1M ids on a 1M-vertex graph).
_DENSE_RELABEL_FACTOR = 16
_DENSE_RELABEL_SLACK = 1 << 22


def _dense_pays_off(num_ids: int, num_nodes: Optional[int]) -> bool:
    return num_nodes is not None and num_nodes <= _DENSE_RELABEL_FACTOR * num_ids + _DENSE_RELABEL_SLACK


def unique_ids(ids: torch.Tensor, num_nodes: Optional[int] = None) -> torch.Tensor:
    """Sorted distinct values of ``ids`` (like ``torch.unique``), by an O(num_nodes) mask when that is cheaper.

    Example:
        >>> unique_ids(torch.tensor([5, 1, 5, 3]), num_nodes=8).tolist()
        [1, 3, 5]
    """
    if not _dense_pays_off(ids.numel(), num_nodes):
        return torch.unique(ids)
    seen = torch.zeros(num_nodes, dtype=torch.bool, device=ids.device)
    seen[ids] = True
    return seen.nonzero().squeeze(1)


def _relabel_dense(dst_nodes: torch.Tensor, src: torch.Tensor, num_nodes: int) -> Tuple[torch.Tensor, torch.Tensor]:
    dev = src.device
    nd = dst_nodes.numel()
    is_new = torch.zeros(num_nodes, dtype=torch.bool, device=dev)
    is_new[src] = True
    is_new[dst_nodes] = False
    new_nodes = is_new.nonzero().squeeze(1)  # sorted, like torch.unique
    local = torch.empty(num_nodes, dtype=torch.int64, device=dev)
    local[dst_nodes] = torch.arange(nd, device=dev)
    local[new_nodes] = torch.arange(nd, nd + new_nodes.numel(), device=dev)
    return torch.cat([dst_nodes, new_nodes]), local[src]


def sample_neighbors_torch(graph: Graph, nodes: torch.Tensor, fanout: int, replace: bool, key: int) -> SampledEdges:
    """The torch sampler for one layer, given its stream key (``counter_rng.stream_key(seed, epoch, iteration, layer)``).

    The reference that ``kernels/sample.cu`` reproduces; ``graph`` and ``nodes`` on one device.

    Example:
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> sample_neighbors_torch(g, torch.tensor([0]), 1, False, counter_rng.stream_key(0, 0, 0, 0)).dst_index.tolist()
        [0]
    """
    nodes = nodes.to(torch.int64)
    k = int(fanout)
    start = graph.indptr[nodes]
    deg = graph.indptr[nodes + 1] - start
    dev = nodes.device
    if k == -1:
        counts = deg
        dst_index = torch.repeat_interleave(torch.arange(nodes.numel(), device=dev), counts)
        eids = start[dst_index] + _segment_arange(counts)
        return SampledEdges(graph.indices[eids], dst_index, eids)

    vkeys = counter_rng.vertex_keys(key, nodes)
    n = nodes.numel()
    cols = torch.arange(k, device=dev)
    if replace:
        picks = counter_rng.draws_below(vkeys, k, deg.clamp_min(1)[:, None].expand(n, k))
        pos = torch.where(deg[:, None] > 0, torch.sort(picks, 1).values, -1)
    else:
        # Floyd's algorithm: a uniform k-subset of [0, d) in k draws, no rejection loop. It runs on every
        # row, also those with deg <= k (overwritten below): one pass over [n, k] tensors beats
        # selecting rows with boolean masks.
        bound = (deg[:, None] - k + 1 + cols[None, :]).clamp_min(1)  # draw i is uniform in [0, j + 1)
        chosen = counter_rng.draws_below(vkeys, k, bound)
        for i in range(1, k):
            taken = (chosen[:, :i] == chosen[:, i:i + 1]).any(1)
            chosen[:, i] = torch.where(taken, bound[:, i] - 1, chosen[:, i])
        everything = torch.where(cols[None, :] < deg[:, None], cols[None, :], -1)
        pos = torch.where((deg <= k)[:, None], everything, torch.sort(chosen, 1).values)
    valid = pos >= 0  # a prefix of every row
    counts = valid.sum(1)
    eids = torch.masked_select(start[:, None] + pos, valid)
    dst_index = torch.repeat_interleave(torch.arange(n, device=dev), counts, output_size=eids.numel())
    return SampledEdges(torch.index_select(graph.indices, 0, eids), dst_index, eids)


class NeighborSampler:
    """Uniform neighbour sampler with per-layer fanouts, reproducible per ``(seed, epoch, iteration)``.

    Args:
        fanouts: neighbours to pick per vertex for each layer, listed from the input layer up
            (``fanouts[0]`` feeds the first GNN layer), as in DGL. ``-1`` takes all in-neighbours.
        replace: sample with replacement (default: without, each in-edge at most once).
        seed: base seed; with ``epoch`` and ``iteration`` it fixes every pick.

    Example:
        >>> from gsplit.graph import Graph
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> blocks = NeighborSampler([2, 2]).sample_blocks(g, torch.tensor([0]), epoch=0, iteration=0)
        >>> [b.num_dst_nodes() for b in blocks]
        [3, 1]
    """

    def __init__(self, fanouts: Sequence[int], replace: bool = False, seed: int = 0):
        fanouts = [int(f) for f in fanouts]
        if len(fanouts) == 0:
            raise ValueError("fanouts is empty; pass one fanout per GNN layer, e.g. [15, 10, 5]")
        for i, f in enumerate(fanouts):
            if f < -1 or f == 0:
                raise ValueError(f"fanouts[{i}] = {f}; each fanout must be a positive number of neighbours or -1 for all")
        self.fanouts: List[int] = fanouts
        self.replace = bool(replace)
        self.seed = int(seed)

    @classmethod
    def from_pyg(cls, num_neighbors: Sequence[int], replace: bool = False, seed: int = 0) -> "NeighborSampler":
        """A sampler from PyG's ``num_neighbors``, which lists hops from the seeds outward (the reverse of ``fanouts``).

        PyG's ``NeighborLoader(num_neighbors=[25, 10])`` picks 25 neighbours of each seed, then 10 of each
        of those: here the last layer (closest to the targets) has fanout 25.

        Example:
            >>> NeighborSampler.from_pyg([25, 10]).fanouts
            [10, 25]
        """
        return cls(list(num_neighbors)[::-1], replace=replace, seed=seed)

    @property
    def num_layers(self) -> int:
        return len(self.fanouts)

    def __repr__(self) -> str:
        return f"NeighborSampler(fanouts={self.fanouts}, replace={self.replace}, seed={self.seed})"

    def to_config(self) -> dict:
        return {"fanouts": list(self.fanouts), "replace": self.replace, "seed": self.seed}

    # ------------------------------------------------------------------ one layer
    def sample_neighbors(self, graph: Graph, nodes: torch.Tensor, layer: int, epoch: int, iteration: int) -> SampledEdges:
        """Pick in-edges of ``nodes`` for ``layer``; result grouped by destination in ``nodes`` order.

        Within one destination, edges come in graph (CSC) order, so the output depends only on the set
        of picks. ``nodes`` need not be unique or sorted. CUDA ``nodes`` are sampled by the GPU kernel
        (:func:`gsplit.gpu.sample_neighbors_gpu`, same picks) when CuPy is installed.
        """
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer={layer} but the sampler has {self.num_layers} fanouts (layers 0..{self.num_layers - 1})")
        key = counter_rng.stream_key(self.seed, epoch, iteration, layer)
        if nodes.is_cuda:
            from gsplit import gpu  # lazy: gsplit.gpu imports this module for its fallback

            return SampledEdges(*gpu.sample_neighbors_gpu(graph, nodes, self.fanouts[layer], self.replace, key))
        return sample_neighbors_torch(graph, nodes, self.fanouts[layer], self.replace, key)

    # ------------------------------------------------------------------ a whole mini-batch
    def sample_blocks(self, graph: Graph, seeds: torch.Tensor, epoch: int = 0, iteration: int = 0) -> List[Block]:
        """The single-process reference mini-batch: blocks from the input layer (index 0) to the output.

        ``blocks[-1].dst_nodes`` equals ``seeds``; ``blocks[0].src_nodes`` are the input vertices.
        """
        seeds = torch.as_tensor(seeds, dtype=torch.int64)
        graph.check_ids(seeds, "seeds")
        if torch.unique(seeds).numel() != seeds.numel():
            raise ValueError("seeds contain repeated vertex ids; pass each target vertex once")
        blocks: List[Block] = []
        frontier = seeds.to(graph.device)
        for layer in reversed(range(self.num_layers)):
            sampled = self.sample_neighbors(graph, frontier, layer, epoch, iteration)
            src_nodes, src_local = relabel(frontier, sampled.src, graph.num_nodes)
            blocks.append(Block(src_nodes=src_nodes, num_dst=frontier.numel(), edge_src=src_local,
                                edge_dst=sampled.dst_index, edge_ids=sampled.edge_ids, layer=layer,
                                global_num_dst=frontier.numel()))
            frontier = src_nodes
        blocks.reverse()
        return blocks
