"""``as_edge_prediction_sampler``: a node sampler becomes an edge sampler, as in DGL.

A global mini-batch of edges (the same on every rank) is *planned* here (:class:`EdgeBatch`): its positive
pairs (the edges' endpoints), its negative pairs (counter-based, :mod:`gsplit.link.negative`), its targets
(the sorted distinct endpoints of all pairs) and the edges to exclude from neighbour sampling. The
loader then splits the targets like node targets (:func:`gsplit.split.sp_sample_many`) with
:class:`~gsplit.link.exclude.ExcludingSampler`, and splits the pairs by the owner of their source
(:func:`gsplit.link.pairs.split_pairs`). :meth:`EdgePredictionSampler.sample` is the single-process
reference the split reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from gsplit.data.graph import Graph
from gsplit.link.exclude import ExcludingSampler, reduced_in_edges
from gsplit.link.negative import NEGATIVE_STREAM, GlobalUniform, Uniform, as_negative_sampler
from gsplit.link.pairs import LinkMiniBatch, split_pairs
from gsplit.ops import counter_rng
from gsplit.sampling.neighbor import NeighborSampler

EXCLUDE_MODES = (None, "self", "reverse_id")


def edge_endpoints(graph: Graph, eids: torch.Tensor):
    """``(src, dst)`` global ids of the edges ``eids`` (gsplit edge ids: positions in ``graph.indices``).

    Example:
        >>> g = Graph.from_edges([0, 1], [2, 2])
        >>> [t.tolist() for t in edge_endpoints(g, torch.tensor([1]))]
        [[1], [2]]
    """
    src = graph.indices.index_select(0, eids)
    dst = torch.searchsorted(graph.indptr, eids, right=True) - 1
    return src, dst


def as_edge_ids(eids, graph: Graph, what: str = "train_eids") -> torch.Tensor:
    """``eids`` as distinct int64 edge ids of ``graph`` (a boolean mask over the edges is accepted), or one error
    that says what was wrong.

    Example:
        >>> as_edge_ids([3], Graph.from_edges([0, 1], [1, 0]))
        Traceback (most recent call last):
        ...
        ValueError: train_eids contain edge id 3 but the graph has 2 edges: pass edge ids in [0, 2)
    """
    if graph.num_edges == 0:
        raise ValueError(f"the graph has no edges, so there is nothing to predict; link prediction needs a graph "
                         f"with edges and {what} among them")
    t = eids if isinstance(eids, torch.Tensor) else torch.as_tensor(eids)
    if t.dtype == torch.bool:
        if t.dim() != 1 or t.numel() != graph.num_edges:
            raise ValueError(f"{what} is a boolean mask of shape {tuple(t.shape)} but the graph has "
                             f"{graph.num_edges} edges; pass one entry per edge or a tensor of edge ids")
        t = t.nonzero().squeeze(1)
    if t.dtype.is_floating_point or t.is_complex() or t.dim() != 1:
        raise TypeError(f"{what} must be a one-dimensional tensor of integer edge ids, got {t.dtype} of shape "
                        f"{tuple(t.shape)}")
    t = t.to(torch.int64)
    if t.numel() == 0:
        raise ValueError(f"{what} is empty; pass the ids of the training edges")
    lo, hi = (int(x) for x in torch.aminmax(t))
    if lo < 0 or hi >= graph.num_edges:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{what} contain edge id {bad} but the graph has {graph.num_edges} edges: pass edge ids "
                         f"in [0, {graph.num_edges})")
    seen = torch.zeros(graph.num_edges, dtype=torch.bool, device=t.device)
    seen[t] = True  # a mask, not torch.unique: a sort of 1.3M ids took seconds at every loader's start
    if int(seen.sum()) != t.numel():
        raise ValueError(f"{what} contain repeated edge ids; pass each training edge once")
    return t


def reverse_edge_ids(graph: Graph) -> torch.Tensor:
    """For every edge ``u -> v`` the id of an edge ``v -> u`` (DGL's ``reverse_eids``), for a graph made with
    ``symmetric=True``; an error names an edge without one.

    Example:
        >>> g = Graph.from_edges([0, 1], [1, 2], symmetric=True)
        >>> rev = reverse_edge_ids(g)
        >>> bool((edge_endpoints(g, rev)[0] == edge_endpoints(g, torch.arange(4))[1]).all())
        True
    """
    n = graph.num_nodes
    dst = graph.edge_dst()
    keys = dst * n + graph.indices
    sorted_keys, order = torch.sort(keys)
    want = graph.indices * n + dst
    at = torch.searchsorted(sorted_keys, want).clamp_max(max(keys.numel() - 1, 0))
    found = sorted_keys.index_select(0, at) == want
    if not bool(found.all()):
        e = int(torch.nonzero(~found)[0])
        raise ValueError(f"edge {e} ({int(graph.indices[e])} -> {int(dst[e])}) has no reverse edge; reverse_eids "
                         "needs a symmetric graph (Graph.from_edges(..., symmetric=True)), or pass exclude='self'")
    return order.index_select(0, at)


@dataclass
class EdgeBatch:
    """One global mini-batch of edges, planned (identical on every rank)."""

    iteration: int
    """Its iteration in the epoch (the counters of its picks and negatives)."""
    eids: torch.Tensor
    """int64 edge ids of the positive pairs, in the global order."""
    pos: tuple
    """``(src, dst)`` global ids of the positive pairs."""
    neg: Optional[tuple]
    """``(src, dst)`` global ids of the negative pairs (``None`` without a negative sampler)."""
    seeds: torch.Tensor
    """int64 sorted distinct endpoints of every pair: the mini-batch's targets."""
    excluded: Optional[torch.Tensor]
    """int64 sorted distinct edge ids removed from neighbour sampling, or ``None``."""


class EdgePredictionSampler:
    """DGL's ``EdgePredictionSampler``: made by :func:`as_edge_prediction_sampler`; pass it to
    :class:`gsplit.DataLoader` with edge ids instead of vertex ids."""

    def __init__(self, sampler: NeighborSampler, exclude=None, reverse_eids=None, negative_sampler=None):
        if exclude not in EXCLUDE_MODES:
            hint = " (a callable exclusion is not supported: pass 'self' or 'reverse_id')" if callable(exclude) else ""
            raise ValueError(f"exclude={exclude!r}; pass None, 'self' or 'reverse_id'{hint}")
        if exclude == "reverse_id" and reverse_eids is None:
            raise ValueError("exclude='reverse_id' needs reverse_eids (reverse_eids[e] = the id of e's reverse "
                             "edge, e.g. gsplit.link.reverse_edge_ids(graph)); pass it, or exclude='self'")
        if exclude != "reverse_id" and reverse_eids is not None:
            raise ValueError(f"reverse_eids is given but exclude={exclude!r}; pass exclude='reverse_id' to use it")
        self.sampler = sampler
        self.exclude = exclude
        self.reverse_eids = None if reverse_eids is None else torch.as_tensor(reverse_eids).to(torch.int64)
        self.negative_sampler = as_negative_sampler(negative_sampler)

    def __repr__(self) -> str:
        return (f"EdgePredictionSampler({self.sampler!r}, exclude={self.exclude!r}, "
                f"negative_sampler={self.negative_sampler!r})")

    @property
    def fanouts(self):
        return self.sampler.fanouts

    def targets_per_edge(self) -> int:
        """At most how many distinct targets one positive edge brings (its endpoints and its negatives'): what a
        loader's memory estimate of a macrobatch counts per edge."""
        neg = self.negative_sampler
        k = getattr(neg, "k", 1)
        if neg is None:
            return 2
        return 2 + (2 * k if isinstance(neg, GlobalUniform) else k if isinstance(neg, Uniform) else 2 * k)

    def with_node_sampler(self, sampler: NeighborSampler) -> "EdgePredictionSampler":
        """The same edge sampler around another node sampler (the loader's gsplit one)."""
        out = EdgePredictionSampler.__new__(EdgePredictionSampler)
        out.__dict__.update(self.__dict__)
        out.sampler = sampler
        return out

    def check(self, graph: Graph) -> None:
        """Raise one clear error when this sampler cannot serve ``graph``."""
        if not isinstance(self.sampler, NeighborSampler):
            raise TypeError(f"as_edge_prediction_sampler wraps a gsplit.NeighborSampler (or DGL's, converted by "
                            f"the loader), got {type(self.sampler).__name__}")
        self.check_reverse_eids(graph)

    def check_reverse_eids(self, graph: Graph) -> None:
        """Raise one clear error when ``reverse_eids`` does not fit ``graph``."""
        if self.reverse_eids is not None:
            r = self.reverse_eids
            if r.dim() != 1 or r.numel() != graph.num_edges:
                raise ValueError(f"reverse_eids has shape {tuple(r.shape)} but the graph has {graph.num_edges} "
                                 "edges; pass one reverse edge id per edge")
            lo, hi = (int(x) for x in torch.aminmax(r)) if r.numel() else (0, 0)
            if lo < 0 or hi >= graph.num_edges:
                raise ValueError(f"reverse_eids contain {lo if lo < 0 else hi}, outside the graph's "
                                 f"{graph.num_edges} edges; pass edge ids in [0, {graph.num_edges})")

    def plan(self, graph: Graph, eids: torch.Tensor, epoch: int, iteration: int) -> EdgeBatch:
        """The :class:`EdgeBatch` of the global mini-batch ``eids`` of ``(epoch, iteration)``, on the host (the
        loader splits targets and pairs there, without device syncs), also for a graph on a GPU."""
        eids = eids.to(torch.int64).cpu()
        src, dst = (t.cpu() for t in edge_endpoints(graph, eids.to(graph.indices.device)))
        neg = None
        if self.negative_sampler is not None:
            key = counter_rng.stream_key(self.sampler.seed, epoch, iteration, NEGATIVE_STREAM)
            neg = self.negative_sampler.sample(graph, eids, src, dst, key)
        ends = [src, dst] + ([] if neg is None else list(neg))
        seeds = torch.unique(torch.cat(ends))
        excluded = None
        if self.exclude == "self":
            excluded = torch.unique(eids)
        elif self.exclude == "reverse_id":
            excluded = torch.unique(torch.cat([eids, self.reverse_eids.index_select(0, eids)]))
        return EdgeBatch(iteration=int(iteration), eids=eids, pos=(src, dst), neg=neg, seeds=seeds, excluded=excluded)

    def plan_slice(self, graph: Graph, eids: torch.Tensor, epoch: int, iteration: int, lo: int, hi: int
                   ) -> EdgeBatch:
        """The :class:`EdgeBatch` of the edges ``eids[lo:hi]`` of the global mini-batch ``eids``: one rank's
        micro-batch of data parallelism (DGL's ``use_ddp=True``). Its negatives are its share of the global
        mini-batch's (the same draws as split training's, for the same edges); only its own edges (and their
        reverses) are excluded, as each rank of DGL's data-parallel loader excludes its own.

        Example:
            >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
            >>> from gsplit.link.negative import Uniform
            >>> s = as_edge_prediction_sampler(NeighborSampler([2]), exclude="self", negative_sampler=Uniform(2))
            >>> whole, part = s.plan(g, torch.arange(4), 0, 0), s.plan_slice(g, torch.arange(4), 0, 0, 2, 4)
            >>> torch.equal(part.neg[1], whole.neg[1][4:]), part.excluded.tolist()
            (True, [2, 3])
        """
        whole = self.plan(graph, eids, epoch, iteration)
        num = whole.eids.numel()
        mine = whole.eids[lo:hi]
        pos = tuple(t[lo:hi] for t in whole.pos)
        neg = None
        if whole.neg is not None:  # Uniform(k): k per edge, in edge order; others: the same share of the pairs
            num_neg = whole.neg[0].numel()
            neg = tuple(t[num_neg * lo // max(num, 1):num_neg * min(hi, num) // max(num, 1)] for t in whole.neg)
        ends = list(pos) + ([] if neg is None else list(neg))
        excluded = None
        if self.exclude == "self":
            excluded = torch.unique(mine)
        elif self.exclude == "reverse_id":
            excluded = torch.unique(torch.cat([mine, self.reverse_eids.index_select(0, mine)]))
        return EdgeBatch(iteration=whole.iteration, eids=mine, pos=pos, neg=neg, seeds=torch.unique(torch.cat(ends)),
                         excluded=excluded)

    def node_sampler(self, graph: Graph, batches: Sequence[EdgeBatch]) -> NeighborSampler:
        """The node sampler of ``batches``: the wrapped one, or one that leaves out their excluded edges."""
        if self.exclude is None:
            return self.sampler
        return ExcludingSampler(self.sampler, {b.iteration: reduced_in_edges(graph, b.excluded) for b in batches})

    def sample(self, graph: Graph, eids, epoch: int = 0, iteration: int = 0) -> LinkMiniBatch:
        """The single-process mini-batch of the edges ``eids``, as DGL's edge sampler returns it: the reference
        that split sampling reproduces.

        Example:
            >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
            >>> from gsplit.link.negative import Uniform
            >>> s = as_edge_prediction_sampler(NeighborSampler([2]), exclude="self", negative_sampler=Uniform(1))
            >>> input_nodes, pos, neg, blocks = s.sample(g, torch.tensor([0, 5]))
            >>> pos.num_edges(), neg.num_edges(), bool(torch.isin(blocks[0].edge_ids, torch.tensor([0, 5])).any())
            (2, 2, False)
        """
        self.check(graph)
        eids = as_edge_ids(eids, graph, "eids")
        batch = self.plan(graph, eids, epoch, iteration)
        mb = self.node_sampler(graph, [batch]).sample_layers(graph, batch.seeds, epoch, iteration)
        return attach_pairs(batch, mb, torch.zeros(graph.num_nodes, dtype=torch.int64), rank=0, world_size=1)


def attach_pairs(batch: EdgeBatch, minibatch, owner: torch.Tensor, rank: int, world_size: int) -> LinkMiniBatch:
    """This rank's :class:`LinkMiniBatch` from its split of ``batch``'s targets (``minibatch``: a
    :class:`~gsplit.MiniBatch`). The top block's ``global_num_dst`` is cleared: the loss is over pairs, not over
    output rows (see :func:`gsplit.link.split_bce_with_logits`); it holds the pair graphs instead
    (:attr:`gsplit.Block.pairs`)."""
    pos, neg = split_pairs(batch.pos, batch.neg, batch.eids, owner, minibatch.output_nodes.to(owner.device),
                           rank, world_size)
    minibatch.blocks[-1].global_num_dst = None
    minibatch.blocks[-1].pairs = (pos, neg)  # SplitParallel's output: these pair rows
    return LinkMiniBatch(minibatch.input_nodes, minibatch.output_nodes, pos, neg, minibatch.blocks)


def as_edge_prediction_sampler(sampler: NeighborSampler, exclude=None, reverse_eids=None,
                               negative_sampler=None) -> EdgePredictionSampler:
    """A node sampler as an edge sampler, with DGL's arguments (``dgl.dataloading.as_edge_prediction_sampler``).

    Args:
        sampler: a :class:`gsplit.NeighborSampler` (or DGL's, which the loader converts).
        exclude: ``None``; ``"self"``: the global mini-batch's edges are left out of every rank's neighbour
            sampling; ``"reverse_id"``: they and their reverses (``reverse_eids``).
        reverse_eids: ``reverse_eids[e]`` is the id of the reverse of edge ``e`` (e.g.
            :func:`gsplit.link.reverse_edge_ids`); needed by ``exclude="reverse_id"``.
        negative_sampler: ``gsplit.negative_sampler.Uniform(k)`` / ``GlobalUniform(k)``, a callable with DGL's
            protocol, or ``None`` (the loader then yields ``(input_nodes, pair_graph, blocks)``).

    Example:
        >>> import gsplit
        >>> s = gsplit.as_edge_prediction_sampler(gsplit.NeighborSampler([10, 5]), exclude="self",
        ...                                       negative_sampler=gsplit.negative_sampler.Uniform(3))
        >>> s.fanouts
        [10, 5]
    """
    return EdgePredictionSampler(sampler, exclude=exclude, reverse_eids=reverse_eids,
                                 negative_sampler=negative_sampler)
