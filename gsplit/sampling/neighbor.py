"""Counter-based uniform neighbour sampling, vectorised over vertices.

The picks for vertex ``v`` at layer ``l`` of iteration ``t`` in epoch ``e`` are a pure function of
``(seed, e, t, l, v)`` (see :mod:`gsplit.ops.counter_rng`), so sampling a set of vertices in any
order or grouping, on any rank, gives the same edges. That is what lets split-parallel sampling
reproduce the single-process mini-batch exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from gsplit import ops
from gsplit.data.graph import Graph, as_vertex_ids
from gsplit.ops import counter_rng
from gsplit.sampling.block import Block, MiniBatch, ShuffleIndex

Exchange = Callable[[int, List[torch.Tensor]], List[Tuple[torch.Tensor, Optional[ShuffleIndex]]]]
"""The one step in which the ways of sampling differ: called after layer ``l`` of every mini-batch being
sampled is sampled, with each batch's source vertices of that layer (for a split, the rank's *mixed
frontiers*, one per batch), it returns per batch the vertices to sample next (the next *local frontier*) and
the block's shuffle index (``None`` when nothing moves). One process: the identity. Split parallelism: the id
all-to-all of :func:`gsplit.split.sp_sample`, one for all the batches (a macrobatch's)."""


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
        >>> from gsplit.data.graph import Graph
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
                      exchange: Optional[Callable[[int, torch.Tensor], Tuple[torch.Tensor, Optional[ShuffleIndex]]]]
                      = None) -> MiniBatch:
        """The layer loop of one mini-batch (:meth:`sample_many` of one); ``exchange(layer, mixed_frontier)``
        returns ``(next_frontier, shuffle_index)`` for it. ``seeds`` are not checked here; :meth:`sample_blocks`
        is the checked entry point."""
        many = None if exchange is None else (lambda layer, mixed: [exchange(layer, mixed[0])])
        return self.sample_many(graph, [seeds], epoch, [iteration], many)[0]

    def sample_many(self, graph: Graph, seeds: Sequence[torch.Tensor], epoch: int, iterations: Sequence[int],
                    exchange: Optional[Exchange] = None) -> List[MiniBatch]:
        """The layer loop every way of sampling shares: from the top layer down, sample, relabel, exchange.

        Several mini-batches (``seeds[k]`` of iteration ``iterations[k]``, e.g. a macrobatch) go through it in
        lockstep: layer ``l`` of every batch is sampled before ``exchange`` (see :data:`Exchange`) gets all
        their source vertices at once, so that a split exchanges the ids of every batch in one all-to-all per
        layer. Each batch's picks are keyed by its own iteration (counter-based), so batch ``k`` is exactly
        the one :meth:`sample_layers` makes alone. ``exchange`` is the only difference between one process
        (``None``: the identity), split parallelism (:func:`gsplit.split.sp_sample`) and pre-sampling.

        Example:
            >>> from gsplit.data.graph import Graph
            >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
            >>> s = NeighborSampler([1, 1])
            >>> both = s.sample_many(g, [torch.tensor([0]), torch.tensor([2])], epoch=0, iterations=[4, 5])
            >>> torch.equal(both[1].blocks[0].edge_ids, s.sample_layers(g, torch.tensor([2]), 0, 5).blocks[0].edge_ids)
            True
        """
        if len(seeds) != len(iterations):
            raise ValueError(f"{len(seeds)} seed sets but {len(iterations)} iterations; pass one iteration per batch")
        blocks: List[List[Block]] = [[] for _ in seeds]
        # where the graph is, or on the seeds' GPU when the kernels can read a pinned host graph from there
        frontiers = [s.to(ops.sampling_device(graph, s.device)) for s in seeds]
        for layer in reversed(range(self.num_layers)):
            sampled, relabelled = [], []
            for frontier, iteration in zip(frontiers, iterations):  # each batch's picks relabelled while in cache
                sampled.append(self.sample_neighbors(graph, frontier, layer, epoch, iteration))
                relabelled.append(ops.relabel(frontier, sampled[-1].src, graph.num_nodes))
            src_nodes = [src for src, _ in relabelled]
            nexts = [(src, None) for src in src_nodes] if exchange is None else exchange(layer, src_nodes)
            for k, (frontier, edges, (src, src_local), (_, index)) in enumerate(zip(frontiers, sampled, relabelled,
                                                                                     nexts)):
                blocks[k].append(Block(src_nodes=src, num_dst=frontier.numel(), edge_src=src_local,
                                       edge_dst=edges.dst_index, edge_ids=edges.edge_ids, layer=layer,
                                       shuffle_index=index,
                                       global_num_dst=frontier.numel() if exchange is None else None))
            frontiers = [nxt for nxt, _ in nexts]
        out = []
        for frontier, bs in zip(frontiers, blocks):
            bs.reverse()
            out.append(MiniBatch(input_nodes=frontier, output_nodes=bs[-1].dst_nodes, blocks=bs))
        return out

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
