"""Negative samplers for link prediction, counter-based: the negatives of a global mini-batch of edges are a
function of ``(seed, epoch, iteration, edge position)``, never of the rank that asks for them.

:class:`Uniform` and :class:`GlobalUniform` mean what DGL's ``dgl.dataloading.negative_sampler`` classes of
the same names mean. A user's callable with DGL's protocol (``neg(g, eids) -> (src, dst)``) is accepted too
(:class:`CallableNegatives`): every rank calls it on the whole global mini-batch with torch's default
generator seeded from the same counters (and restored afterwards), so it is exact when it draws only from
that generator.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import torch

from gsplit.data.graph import Graph, check_id_range
from gsplit.ops import counter_rng

NEGATIVE_STREAM = 1 << 20
"""The ``layer`` slot of the negatives' stream key (:func:`~gsplit.ops.counter_rng.stream_key`): no GNN
has that many layers, so negatives never share draws with neighbour picks."""

Pairs = Tuple[torch.Tensor, torch.Tensor]


def _check_k(k, name: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, float)) or int(k) != k or k < 1:
        raise ValueError(f"{name}(k={k!r}): the negative ratio k must be a whole number of at least 1 "
                         f"(negatives per positive edge), e.g. {name}(5)")
    return int(k)


class Uniform:
    """``k`` negatives per positive edge ``(u, v)``: ``(u, w)`` with ``w`` uniform over all vertices (DGL's
    ``negative_sampler.Uniform``; a negative may hit an existing edge, as in DGL).

    The negatives of the edge at position ``i`` of the global mini-batch are draws ``i*k .. i*k+k-1`` of the
    iteration's stream, in that order (DGL's ``src.repeat_interleave(k)`` order).

    Example:
        >>> from gsplit.data.graph import Graph
        >>> g = Graph.from_edges([0, 1, 2], [1, 2, 0])
        >>> src, dst = Uniform(2).sample(g, torch.tensor([0, 1]), torch.tensor([2, 0]), torch.tensor([0, 1]), key=7)
        >>> src.tolist(), dst.shape
        ([2, 2, 0, 0], torch.Size([4]))
    """

    def __init__(self, k: int):
        self.k = _check_k(k, "Uniform")

    def __repr__(self) -> str:
        return f"Uniform({self.k})"

    def sample(self, graph: Graph, eids: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, key: int) -> Pairs:
        """The negative pairs of the positive edges ``eids`` (endpoints ``src -> dst``) under stream ``key``."""
        n = eids.numel() * self.k
        positions = torch.arange(n, dtype=torch.int64, device=src.device)
        bound = torch.full((n,), max(graph.num_nodes, 1), dtype=torch.int64, device=src.device)
        neg_dst = counter_rng.draw_below(counter_rng.vertex_keys(key, positions), 0, bound)
        return src.repeat_interleave(self.k), neg_dst


class GlobalUniform:
    """``k * len(eids)`` negative pairs drawn uniformly over all vertex pairs that are not edges (DGL's
    ``negative_sampler.GlobalUniform``): with ``exclude_self_loops`` no ``(v, v)``, with ``replace=False`` no
    pair twice. As in DGL, fewer may come back when the graph is dense: ``ceil(num * (1 + redundancy))``
    candidates are drawn and the first ``num`` that pass are kept.

    Example:
        >>> from gsplit.data.graph import Graph
        >>> g = Graph.from_edges([0, 1, 2], [1, 2, 3])
        >>> src, dst = GlobalUniform(2).sample(g, torch.tensor([0]), torch.tensor([0]), torch.tensor([1]), key=3)
        >>> len(src) <= 2 and bool((src != dst).all())
        True
    """

    def __init__(self, k: int, exclude_self_loops: bool = True, replace: bool = False, redundancy: float = 1.3):
        self.k = _check_k(k, "GlobalUniform")
        if not redundancy >= 0:
            raise ValueError(f"GlobalUniform(redundancy={redundancy!r}): pass a non-negative factor of extra "
                             "candidates (1.3: 130% more than asked for)")
        self.exclude_self_loops = bool(exclude_self_loops)
        self.replace = bool(replace)
        self.redundancy = float(redundancy)
        self._keys: Optional[Tuple[Graph, torch.Tensor]] = None  # the graph's sorted edge keys, made once

    def __repr__(self) -> str:
        return f"GlobalUniform({self.k}, exclude_self_loops={self.exclude_self_loops}, replace={self.replace})"

    def _edge_keys(self, graph: Graph) -> torch.Tensor:
        if self._keys is None or self._keys[0] is not graph:
            keys = graph.edge_dst() * graph.num_nodes + graph.indices  # dst * N + src, one per edge
            self._keys = (graph, torch.sort(keys).values.cpu())  # the draws are made on the host
        return self._keys[1]

    def sample(self, graph: Graph, eids: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, key: int) -> Pairs:
        num = eids.numel() * self.k
        n = graph.num_nodes
        draws = math.ceil(num * (1 + self.redundancy))
        vkeys = counter_rng.vertex_keys(key, torch.arange(draws, dtype=torch.int64))
        bound = torch.full((draws,), max(n, 1), dtype=torch.int64)
        u = counter_rng.draw_below(vkeys, 0, bound)
        v = counter_rng.draw_below(vkeys, 1, bound)
        cand = v * n + u
        keys = self._edge_keys(graph).to(cand.device)
        at = torch.searchsorted(keys, cand).clamp_max(max(keys.numel() - 1, 0))
        ok = keys[at] != cand if keys.numel() else torch.ones_like(cand, dtype=torch.bool)
        if self.exclude_self_loops:
            ok &= u != v
        if not self.replace:  # the first draw of each pair
            uniq, inverse = torch.unique(cand, return_inverse=True)
            first = torch.full((uniq.numel(),), draws, dtype=torch.int64).scatter_reduce_(
                0, inverse, torch.arange(draws), "amin")
            ok &= torch.zeros(draws, dtype=torch.bool).index_fill_(0, first, True)
        keep = torch.nonzero(ok).squeeze(1)[:num]
        return u[keep].to(src.device), v[keep].to(src.device)


class CallableNegatives:
    """A user's negative sampler with DGL's protocol, ``fn(g, eids) -> (src, dst)`` (e.g. the degree^0.75
    sampler of DGL's multi-GPU link prediction example).

    Every rank calls ``fn`` on the whole global mini-batch with torch's default CPU generator (and, once CUDA is
    in use, the current GPU's) seeded from ``key`` inside ``torch.random.fork_rng`` (the caller's generator
    state is left as it was), so the pairs
    are the same on every rank, and the same as one process's, when ``fn`` draws only from that generator
    (``torch.randint``, ``torch.multinomial`` without ``generator=``). ``g`` is the graph given to the loader
    (a :class:`gsplit.Graph`); ``eids`` are gsplit edge ids.

    Example:
        >>> from gsplit.data.graph import Graph
        >>> g = Graph.from_edges([0, 1, 2], [1, 2, 0])
        >>> neg = CallableNegatives(lambda g, e: (e.repeat(2) % 3, torch.randint(0, 3, (2 * len(e),))))
        >>> a = neg.sample(g, torch.tensor([0]), torch.tensor([2]), torch.tensor([0]), key=5)
        >>> b = neg.sample(g, torch.tensor([0]), torch.tensor([2]), torch.tensor([0]), key=5)
        >>> torch.equal(a[1], b[1])
        True
    """

    def __init__(self, fn: Callable, graph_for_fn=None, eids_for_fn: Optional[Callable] = None):
        if not callable(fn):
            raise TypeError(f"negative_sampler must be gsplit.negative_sampler.Uniform(k) / GlobalUniform(k) or a "
                            f"callable neg(g, eids) -> (src, dst), got {type(fn).__name__}")
        self.fn = fn
        self.graph_for_fn = graph_for_fn
        """The graph ``fn`` receives (the loader's input, e.g. a ``DGLGraph``); ``None``: the gsplit graph."""
        self.eids_for_fn = eids_for_fn
        """gsplit edge ids -> the ids ``fn`` receives (a ``DGLGraph``'s own); ``None``: gsplit's."""

    def __repr__(self) -> str:
        return f"CallableNegatives({self.fn!r})"

    def sample(self, graph: Graph, eids: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, key: int) -> Pairs:
        g = graph if self.graph_for_fn is None else self.graph_for_fn
        seed = key & ((1 << 63) - 1)
        # a graph on the rank's GPU (DGL's example with --mode puregpu) draws from that GPU's generator: it is
        # seeded alike (only it: torch.manual_seed would reach every GPU) and restored too
        cuda = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=cuda):
            torch.default_generator.manual_seed(seed)
            if cuda:
                torch.cuda.manual_seed(seed)
            out = self.fn(g, eids if self.eids_for_fn is None else self.eids_for_fn(eids))
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"the negative sampler {name} returned {type(out).__name__}; it must return a pair "
                            "(src, dst) of vertex-id tensors, as DGL's negative samplers do")
        neg_src, neg_dst = (torch.as_tensor(t) for t in out)
        if neg_src.dim() != 1 or neg_src.shape != neg_dst.shape or neg_src.dtype.is_floating_point \
                or neg_dst.dtype.is_floating_point:
            raise ValueError(f"the negative sampler {name} returned src of shape {tuple(neg_src.shape)} "
                             f"({neg_src.dtype}) and dst of shape {tuple(neg_dst.shape)} ({neg_dst.dtype}); "
                             "return two one-dimensional integer tensors of equal length")
        neg_src, neg_dst = neg_src.to(torch.int64), neg_dst.to(torch.int64)
        check_id_range(neg_src, graph.num_nodes, f"the negative sampler {name}'s src")
        check_id_range(neg_dst, graph.num_nodes, f"the negative sampler {name}'s dst")
        return neg_src.to(src.device), neg_dst.to(src.device)


def as_negative_sampler(negative_sampler) -> Optional[object]:
    """``negative_sampler`` as an object with ``sample(graph, eids, src, dst, key)``: gsplit's samplers as they
    are, a callable wrapped in :class:`CallableNegatives`, ``None`` (no negatives) as ``None``.

    Example:
        >>> as_negative_sampler(Uniform(3)).k
        3
    """
    if negative_sampler is None or isinstance(negative_sampler, (Uniform, GlobalUniform, CallableNegatives)):
        return negative_sampler
    module = type(negative_sampler).__module__ or ""
    dgl_names = ("Uniform", "GlobalUniform", "PerSourceUniform")
    if module.startswith("dgl.") and type(negative_sampler).__name__ in dgl_names:
        k = getattr(negative_sampler, "k", None)
        raise TypeError(f"negative_sampler is DGL's {type(negative_sampler).__name__}, whose draws differ per rank; "
                        f"pass gsplit.negative_sampler.{type(negative_sampler).__name__}({k if k else 'k'}) instead "
                        "(the same meaning, counter-based)")
    return CallableNegatives(negative_sampler)
