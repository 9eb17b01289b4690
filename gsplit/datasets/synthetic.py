"""Synthetic power-law graphs with planted communities (degree-corrected stochastic block model).

Every vertex gets a community and a degree propensity ``theta`` drawn from a Pareto (power-law)
distribution. Each undirected edge picks its first end with probability proportional to ``theta``;
with probability ``p_in`` the second end is drawn (again proportional to ``theta``) from the first
end's community, otherwise from all vertices. Draws use inverse-CDF sampling (``torch.searchsorted``
on cumulative weights) over all edges at once, so generation is vectorised; the result is made
symmetric with self-loops and repeated pairs removed. Features are the community's centroid plus
Gaussian noise and labels are the community's class with some label noise, so a GNN that aggregates
neighbours beats one that looks at a vertex alone, and a partition that follows communities cuts
few edges.
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from gsplit.datasets.base import Dataset, random_split
from gsplit.data.graph import Graph
from gsplit.runtime.resources import require_memory

log = logging.getLogger(__name__)

# Edge draws per chunk: bounds the temporaries (a few float64/int64 arrays of this length).
_CHUNK = 1 << 20
# Bytes of the gathered-centroid temporary per chunk of feature rows.
_FEATURE_CHUNK_BYTES = 64 << 20
# Top-up rounds when duplicates and self-loops left the graph short of the requested edge count.
_MAX_ROUNDS = 6


def synthetic_graph(
    num_nodes: int = 20_000,
    avg_degree: float = 15.0,
    num_communities: int = 32,
    *,
    p_in: float = 0.8,
    power_law_exponent: float = 2.5,
    seed: int = 0,
) -> Tuple[Graph, torch.Tensor]:
    """Generate a symmetric power-law graph with planted communities; returns ``(graph, communities)``.

    Args:
        num_nodes: number of vertices.
        avg_degree: target average degree counting both directions, i.e. ``num_edges ~ num_nodes * avg_degree``.
        num_communities: number of planted communities (vertices are assigned uniformly at random).
        p_in: probability that an edge stays inside its first end's community.
        power_law_exponent: exponent ``gamma`` of the degree tail ``P(d) ~ d^-gamma`` (must exceed 2).
        seed: the same seed gives the same graph.

    Example:
        >>> g, comm = synthetic_graph(1000, avg_degree=10, num_communities=4, seed=1)
        >>> g.num_nodes, comm.shape
        (1000, torch.Size([1000]))
    """
    _check_params(num_nodes, avg_degree, num_communities, p_in, power_law_exponent)
    require_memory(synthetic_peak_bytes(num_nodes, avg_degree, 0), f"a synthetic graph of {int(num_nodes):,} vertices",
                   "ask for fewer -D num_nodes")
    gen = torch.Generator().manual_seed(int(seed))
    n = int(num_nodes)
    comm = torch.randint(num_communities, (n,), generator=gen, dtype=torch.int64)

    # Pareto(shape = gamma - 1) propensities give a degree tail with exponent gamma. Capping the expected
    # degree near sqrt(num_edges) keeps hub-hub pairs from being drawn many times over (which would be
    # lost to de-duplication and distort the degree sequence).
    shape = power_law_exponent - 1.0
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    theta = (1.0 - u).pow_(-1.0 / shape)  # 1 - u lies in (0, 1]
    del u
    target_edges = n * float(avg_degree)
    max_degree = max(math.sqrt(target_edges), 2.0 * avg_degree)
    theta.clamp_(max=max_degree * float(theta.mean()) / avg_degree)

    # One cumulative weight array over vertices sorted by community serves both kinds of draws: a global
    # draw searches the whole array, an intra-community draw the slice of its community.
    order = torch.sort(comm, stable=True).indices
    cum = torch.cumsum(theta[order], 0)
    total = float(cum[-1])
    comm_sizes = torch.bincount(comm, minlength=num_communities)
    comm_end = torch.cumsum(comm_sizes, 0)  # exclusive end position of each community in `order`
    comm_begin = comm_end - comm_sizes
    comm_cum_before = torch.where(comm_begin > 0, cum[(comm_begin - 1).clamp(min=0)], torch.zeros((), dtype=cum.dtype))
    comm_weight = cum[(comm_end - 1).clamp(min=0)] - comm_cum_before
    del theta

    def draw(count: int) -> np.ndarray:
        """``count`` undirected pairs as numpy keys ``min * n + max``, self-loops dropped."""
        keys = []
        for start in range(0, count, _CHUNK):  # chunks bound memory; each chunk is fully vectorised
            m = min(_CHUNK, count - start)
            pos_u = torch.searchsorted(cum, torch.rand(m, generator=gen, dtype=torch.float64) * total, right=True)
            pos_u.clamp_(max=n - 1)
            src = order[pos_u]
            del pos_u
            c = comm[src]
            r = torch.rand(m, generator=gen, dtype=torch.float64)
            inside = torch.rand(m, generator=gen) < p_in
            # inside the community: a point in [cum_before[c], cum_before[c] + weight[c]); else anywhere
            point = torch.where(inside, comm_cum_before[c] + r * comm_weight[c], r * total)
            del r
            pos_v = torch.searchsorted(cum, point, right=True)
            del point
            # rounding can step one past a community's slice: clamp back into it
            lo = torch.where(inside, comm_begin[c], torch.zeros((), dtype=torch.int64))
            hi = torch.where(inside, comm_end[c] - 1, torch.full((), n - 1, dtype=torch.int64))
            pos_v = torch.minimum(torch.maximum(pos_v, lo), hi)
            dst = order[pos_v]
            del pos_v, lo, hi, c, inside
            keep = src != dst
            a, b = src[keep], dst[keep]
            keys.append(torch.minimum(a, b) * n + torch.maximum(a, b))
        return torch.cat(keys).numpy() if keys else np.empty(0, dtype=np.int64)

    want_pairs = int(round(target_edges / 2))
    pairs = _sorted_unique(draw(want_pairs))
    for _ in range(_MAX_ROUNDS):
        missing = want_pairs - pairs.size
        if missing <= want_pairs // 2000:
            break
        # duplicates hit the top-up too: ask for a little more than is missing
        pairs = _sorted_unique(np.concatenate([pairs, draw(int(missing * 1.1) + 16)]))
    if pairs.size > want_pairs:
        # drop a seeded random surplus so the edge count matches the request closely
        drop = torch.randperm(pairs.size, generator=gen)[: pairs.size - want_pairs].numpy()
        pairs = np.delete(pairs, drop)
    return _symmetric_csc(pairs, n), comm


def synthetic_peak_bytes(num_nodes: int, avg_degree: float, feature_dim: int) -> int:
    """Estimated peak host memory of :func:`make_synthetic` (``feature_dim=0``: :func:`synthetic_graph`).

    From the arrays it holds at once, with ``E = num_nodes * avg_degree`` directed edges: at the
    symmetric CSC step, the pair keys (``E / 2`` int64) and the key array of both directions (``E``
    int64), 12 B per edge, plus allocator slack (16 B in all); the features (4 B per entry), which come
    after the edge temporaries are freed but are counted on top to stay on the safe side; per-vertex
    arrays (community, propensity, order, cumulative weights, labels, split: 64 B); and the per-chunk
    temporaries of the edge draws (160 MiB). Measured by ``experiments/scale.py`` (peak RSS of
    generation less the interpreter's): 894 MiB at 1M vertices (estimate 938), 2954 MiB at 4M (3273).

    Example:
        >>> synthetic_peak_bytes(1_000_000, 15, 128) / 2**30   # doctest: +ELLIPSIS
        0.9...
    """
    n, e = int(num_nodes), int(num_nodes * float(avg_degree))
    return 16 * e + 4 * n * int(feature_dim) + 64 * n + (160 << 20)


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct values of ``keys``, sorting in place (np.unique copies and is slower here)."""
    keys.sort()
    if keys.size == 0:
        return keys
    keep = np.empty(keys.size, dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def _symmetric_csc(pairs: np.ndarray, n: int) -> Graph:
    """CSC graph holding both directions of each unique pair key ``a * n + b`` (``a < b``).

    Gives the same arrays as ``Graph.from_edges(a, b, n, symmetric=True)`` with a fraction of its peak
    memory: one int64 key array of ``2 * len(pairs)`` sorted in place, no argsort indices, no bincount.
    """
    m = pairs.size
    key = np.empty(2 * m, dtype=np.int64)
    head = key[:m]
    np.remainder(pairs, n, out=head)          # b ...
    head *= n
    head += pairs // n                        # ... so edge a -> b is stored under its destination b
    key[m:] = pairs                           # edge b -> a is stored under its destination a
    key.sort()
    indptr = np.searchsorted(key, np.arange(n + 1, dtype=np.int64) * n)
    np.remainder(key, n, out=key)             # keys become the source ids, already grouped by destination
    return Graph(torch.from_numpy(indptr), torch.from_numpy(key))


def make_synthetic(
    num_nodes: int = 20_000,
    avg_degree: float = 15.0,
    num_communities: int = 32,
    feature_dim: int = 64,
    num_classes: int = 8,
    seed: int = 0,
    *,
    p_in: float = 0.8,
    power_law_exponent: float = 2.5,
    feature_noise: float = 2.0,
    label_noise: float = 0.1,
    split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
    name: Optional[str] = None,
) -> Dataset:
    """A synthetic node-classification dataset on a :func:`synthetic_graph`.

    Communities map to classes (a seeded random assignment, about ``num_communities / num_classes``
    communities per class). A vertex's features are its community's centroid (standard normal entries)
    plus Gaussian noise of std ``feature_noise``; its label is its community's class, replaced by a
    uniformly random class with probability ``label_noise``. Split: seeded random ``split_fractions``.

    Args:
        num_nodes, avg_degree, num_communities, p_in, power_law_exponent, seed: see :func:`synthetic_graph`.
        feature_dim: feature width.
        num_classes: number of classes (at most ``num_communities`` so every class has a community).
        feature_noise: std of the per-vertex Gaussian noise; larger makes a vertex's own features less
            telling and neighbour aggregation more useful.
        label_noise: probability that a vertex's label is replaced by a random class.
        split_fractions: train, val, test shares of the vertices.
        name: dataset name; defaults to ``"synthetic"``.

    Example:
        >>> ds = make_synthetic(num_nodes=2000, seed=0)
        >>> ds.num_classes, ds.features.dtype
        (8, torch.float32)
    """
    if num_classes < 1 or num_classes > num_communities:
        raise ValueError(f"num_classes must be in [1, num_communities={num_communities}], got {num_classes}; "
                         "every class needs at least one community")
    if feature_dim < 1:
        raise ValueError(f"feature_dim must be at least 1, got {feature_dim}")
    _check_params(num_nodes, avg_degree, num_communities, p_in, power_law_exponent)
    require_memory(synthetic_peak_bytes(num_nodes, avg_degree, feature_dim),
                   f"a synthetic dataset of {int(num_nodes):,} vertices, average degree {avg_degree} and "
                   f"{feature_dim}-d features", "ask for fewer -D num_nodes or a smaller -D feature_dim")
    if feature_noise < 0 or not 0.0 <= label_noise <= 1.0:
        raise ValueError(f"need feature_noise >= 0 and label_noise in [0, 1], got {feature_noise}, {label_noise}")
    graph, comm = synthetic_graph(num_nodes, avg_degree, num_communities, p_in=p_in,
                                  power_law_exponent=power_law_exponent, seed=seed)
    # A separate stream for features/labels keeps the graph identical whatever feature_dim is asked for.
    gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + 7) % (1 << 63))
    n = graph.num_nodes
    centroids = torch.randn(num_communities, feature_dim, generator=gen)
    features = torch.randn(n, feature_dim, generator=gen)
    features.mul_(feature_noise)
    # in place, in chunks of rows of at most _FEATURE_CHUNK_BYTES: the gathered centroids are a temporary
    # (chunks of _CHUNK rows were a second copy of the whole table up to 1M vertices)
    rows = max(1, _FEATURE_CHUNK_BYTES // (4 * feature_dim))
    for start in range(0, n, rows):
        features[start:start + rows].add_(centroids[comm[start:start + rows]])
    class_of_comm = torch.randperm(num_communities, generator=gen) % num_classes
    labels = class_of_comm[comm]
    flip = torch.rand(n, generator=gen) < label_noise
    labels[flip] = torch.randint(num_classes, (int(flip.sum()),), generator=gen)
    train, val, test = random_split(n, split_fractions, seed=seed)
    params = dict(num_nodes=num_nodes, avg_degree=avg_degree, num_communities=num_communities,
                  feature_dim=feature_dim, num_classes=num_classes, seed=seed, p_in=p_in,
                  power_law_exponent=power_law_exponent, feature_noise=feature_noise, label_noise=label_noise)
    ds = Dataset(graph=graph, features=features, labels=labels, train_idx=train, val_idx=val, test_idx=test,
                 num_classes=num_classes, name=name or "synthetic", communities=comm,
                 meta={"source": "synthetic", "params": params,
                       "split": f"random {tuple(split_fractions)} seed={seed}"})
    log.info("generated %r", ds)
    return ds


def _check_params(num_nodes, avg_degree, num_communities, p_in, power_law_exponent) -> None:
    if not 2 <= int(num_nodes) < 3_000_000_000:  # pair keys a * n + b must fit in int64
        raise ValueError(f"num_nodes must be in [2, 3e9), got {num_nodes}")
    if not 0 < avg_degree < num_nodes - 1:
        raise ValueError(f"avg_degree must be in (0, num_nodes - 1 = {num_nodes - 1}), got {avg_degree}")
    if not 1 <= num_communities <= num_nodes:
        raise ValueError(f"num_communities must be in [1, num_nodes], got {num_communities}")
    if not 0.0 <= p_in <= 1.0:
        raise ValueError(f"p_in is a probability and must be in [0, 1], got {p_in}")
    if not power_law_exponent > 2.0:
        raise ValueError(f"power_law_exponent must exceed 2 (finite mean degree), got {power_law_exponent}")
