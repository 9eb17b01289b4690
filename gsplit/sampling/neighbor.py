"""Counter-based uniform neighbour sampling, vectorised over vertices.

The picks for vertex ``v`` at layer ``l`` of iteration ``t`` in epoch ``e`` are a pure function of
``(seed, e, t, l, v)`` (see :mod:`gsplit.sampling.counter_rng`), so sampling a set of vertices in any
order or grouping, on any rank, gives the same edges. That is what lets split-parallel sampling
reproduce the single-process mini-batch exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from gsplit import ops
from gsplit.graph import Graph, as_vertex_ids
from gsplit.sampling import counter_rng
from gsplit.sampling.block import Block, MiniBatch, ShuffleIndex

Exchange = Callable[[int, torch.Tensor], Tuple[torch.Tensor, Optional[ShuffleIndex]]]
"""The one step in which the ways of sampling differ: called after layer ``l`` is sampled with that
layer's source vertices (for a split, the rank's *mixed frontier*), it returns the vertices to sample
next (the next *local frontier*) and the block's shuffle index (``None`` when nothing moves). One
process: the identity. Split parallelism: the id all-to-all of :func:`gsplit.split.sp_sample`."""


@dataclass(frozen=True)
class SampledEdges:
    """In-edges picked for a set of destination vertices, grouped by destination."""

    src: torch.Tensor
    """int64 global id of each picked edge's source."""
    dst_index: torch.Tensor
    """int64 index (into the ``nodes`` that were sampled) of each edge's destination; non-decreasing."""
    edge_ids: torch.Tensor
    """int64 edge id (position in ``Graph.indices``) of each picked edge."""


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
        >>> input_nodes, output_nodes, blocks = NeighborSampler([2, 2]).sample(g, torch.tensor([0]))
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
        self.num_neighbors: Optional[List[int]] = None
        """PyG's ``num_neighbors`` (seeds outward) when built by :meth:`from_pyg`, else None."""
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
        sampler = cls(list(num_neighbors)[::-1], replace=replace, seed=seed)
        sampler.num_neighbors = [int(n) for n in num_neighbors]  # PyG's order, kept: the order was said
        return sampler

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
        of picks. ``nodes`` need not be unique or sorted. :func:`gsplit.ops.sample_neighbors` picks the
        implementation (the CUDA kernel for CUDA ``nodes``, else torch); all pick the same edges.
        """
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer={layer} but the sampler has {self.num_layers} fanouts (layers 0..{self.num_layers - 1})")
        key = counter_rng.stream_key(self.seed, epoch, iteration, layer)
        return SampledEdges(*ops.sample_neighbors(graph, nodes, self.fanouts[layer], self.replace, key))

    # ------------------------------------------------------------------ a whole mini-batch
    def sample_layers(self, graph: Graph, seeds: torch.Tensor, epoch: int, iteration: int,
                      exchange: Optional[Exchange] = None) -> MiniBatch:
        """The layer loop every way of sampling shares: from the top layer down, sample, relabel, exchange.

        ``exchange`` (see :data:`Exchange`) is the only difference between one process (``None``: the
        identity), split parallelism (:func:`gsplit.split.sp_sample`) and pre-sampling. ``seeds`` are
        not checked here; :meth:`sample_blocks` is the checked entry point.
        """
        blocks: List[Block] = []
        # where the graph is, or on the seeds' GPU when the kernels can read a pinned host graph from there
        frontier = seeds.to(ops.sampling_device(graph, seeds.device))
        for layer in reversed(range(self.num_layers)):
            sampled = self.sample_neighbors(graph, frontier, layer, epoch, iteration)
            src_nodes, src_local = ops.relabel(frontier, sampled.src, graph.num_nodes)
            index = None
            if exchange is None:
                next_frontier = src_nodes
            else:
                next_frontier, index = exchange(layer, src_nodes)
            blocks.append(Block(src_nodes=src_nodes, num_dst=frontier.numel(), edge_src=src_local,
                                edge_dst=sampled.dst_index, edge_ids=sampled.edge_ids, layer=layer,
                                shuffle_index=index, global_num_dst=frontier.numel() if exchange is None else None))
            frontier = next_frontier
        blocks.reverse()
        return MiniBatch(input_nodes=frontier, output_nodes=blocks[-1].dst_nodes, blocks=blocks)

    def sample(self, graph: Graph, seeds, epoch: int = 0, iteration: int = 0) -> MiniBatch:
        """The single-process reference mini-batch as DGL's samplers return it: ``(input_nodes, output_nodes, blocks)``.

        ``blocks`` run from the input layer (index 0) to the output; ``output_nodes`` equals ``seeds``
        (ids or a boolean mask, checked) and ``input_nodes`` is ``blocks[0].src_nodes``. The returned
        :class:`MiniBatch` unpacks as that triple.
        """
        seeds = as_vertex_ids(seeds, graph.num_nodes, "seeds", unique=True)
        return self.sample_layers(graph, seeds, epoch, iteration)

    def sample_blocks(self, graph: Graph, seeds, epoch: int = 0, iteration: int = 0) -> List[Block]:
        """The blocks of :meth:`sample`, input layer first.

        Unlike DGL's method of the same name (which returns the triple that :meth:`sample` returns here)
        this returns the list of blocks alone: the library's reference tests are written against it.
        """
        return self.sample(graph, seeds, epoch, iteration).blocks
