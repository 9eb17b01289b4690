"""Bound METIS's input: keep each vertex's heaviest edges, symmetric, within a budget of adjacency entries.

METIS's memory grows with the adjacency entries it is given: it keeps every level of its coarsening at
once, each with 64-bit ids and weights per entry, and on graphs without much locality the coarse
levels shrink slowly in edges. At 15M entries (1M vertices, degree 15, 4 balance constraints) its own
process peaked at ~108 B per entry beyond its input, at 60M more, well above the graph and its
features. :func:`heaviest_edges` gives METIS a budget of entries per vertex instead: the edges that
matter most to the cut (the heaviest pre-sampling weights, i.e. the edges most often sampled) are kept,
the light ones dropped, so METIS's memory is bounded per vertex at any scale.

Rule: each entry (an edge as seen from one endpoint) gets its rank in its vertex's list, heaviest first;
an edge's rank is the smaller of its two endpoints' ranks (so it is kept if it is among the ``k``
heaviest of *either* endpoint: the input stays symmetric, and a hub keeps the edges its light
neighbours need). ``k`` is the largest rank threshold whose kept entries fit the budget. Ties (and
unweighted graphs) are broken by a hash of the edge's two endpoints, which is the same seen from either
end, so equal weights are thinned like a uniform random sample instead of by vertex id.
Every pass runs over rows in chunks (one sort per chunk): time is linear in the entries, temporaries
are ~16 B per entry plus a chunk's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import numpy as np

log = logging.getLogger(__name__)

MIN_ENTRIES_PER_VERTEX = 2.0
"""The smallest budget: every vertex's single heaviest edge, symmetrised, needs up to 2 entries per vertex."""

_CHUNK = 1 << 22
"""Entries per chunk of rows: bounds the per-chunk sort's temporaries (~100 MB)."""


@dataclass(frozen=True)
class SparsifyInfo:
    """What :func:`heaviest_edges` kept."""

    entries_in: int
    """Adjacency entries (both directions) of the input."""
    entries_kept: int
    """Adjacency entries kept (both directions)."""
    rank_threshold: int
    """``k``: an edge is kept when it is among the ``k`` heaviest of one of its endpoints (-1: all kept)."""
    weight_kept: float
    """Share of the total edge weight that was kept (1.0 when all entries are kept)."""


AUTO = "auto"
"""The budget that :func:`gsplit.partitioning.budget.resolve_metis_bound` picks from the memory available."""


def check_entries_per_vertex(value: Union[float, str, None]) -> Union[float, str, None]:
    """Validate a budget of METIS adjacency entries per vertex: None or 0 mean no bound, ``"auto"`` a bound
    only where every edge would not fit in memory (:func:`gsplit.partitioning.budget.resolve_metis_bound`).

    Example:
        >>> check_entries_per_vertex(8), check_entries_per_vertex(0), check_entries_per_vertex("auto")
        (8.0, None, 'auto')
    """
    if value is None:
        return None
    if value == AUTO:
        return AUTO
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"METIS edges per vertex={value!r}; pass a number (0 for no bound) or \"auto\"") from None
    if v == 0:
        return None
    if not np.isfinite(v) or v < MIN_ENTRIES_PER_VERTEX:
        raise ValueError(f"METIS edges per vertex={value!r}; pass 0 (no bound: METIS sees every edge) or a budget "
                         f"of at least {MIN_ENTRIES_PER_VERTEX:g} adjacency entries per vertex, e.g. 8")
    return v


def _rows(xadj: np.ndarray, a: int, b: int) -> np.ndarray:
    """The row of entries ``a..b-1`` (``a < b``)."""
    r0 = int(np.searchsorted(xadj, a, side="right")) - 1
    r1 = int(np.searchsorted(xadj, b - 1, side="right")) - 1
    counts = np.minimum(xadj[r0 + 1:r1 + 2], b) - np.maximum(xadj[r0:r1 + 1], a)
    return np.repeat(np.arange(r0, r1 + 1, dtype=np.int64), counts)


def _row_chunks(xadj: np.ndarray):
    """``(a, b)`` entry ranges of whole rows, each about ``_CHUNK`` entries (a longer row is its own chunk)."""
    m = int(xadj[-1])
    a = 0
    while a < m:
        # the first row end at or past a + _CHUNK
        r = int(np.searchsorted(xadj, a + _CHUNK, side="left"))
        b = int(xadj[min(r, len(xadj) - 1)])
        if b <= a:  # cannot happen with a valid xadj; guards against an endless loop
            b = m
        yield a, b
        a = b


def _edge_hash(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """A pseudo-random uint64 per edge, equal for ``(u, v)`` and ``(v, u)`` (splitmix64 of the pair)."""
    lo, hi = np.minimum(rows, cols).astype(np.uint64), np.maximum(rows, cols).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = lo * np.uint64(0x9E3779B97F4A7C15) + hi
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


_WEIGHT_BITS = 21
"""Bits of the quantised weight in the sort key: METIS's integer weights have 21 (``to_metis_weights``)."""


def _ranks(xadj: np.ndarray, adjncy: np.ndarray, weights: Optional[np.ndarray]) -> np.ndarray:
    """Each entry's position in its row ordered heaviest first (ties: by the edge's hash), int32.

    One int64 key per entry, sorted once per chunk: the row (within the chunk) in the high bits, then the
    weight quantised as METIS will see it (``to_metis_weights``' scale: the heaviest is ``2**20``),
    inverted so the heaviest comes first, then the top bits of the edge's hash."""
    m = int(xadj[-1])
    rank = np.empty(m, dtype=np.int32)
    top = float(np.max(weights)) if weights is not None and m else 0.0
    wmax = (1 << (_WEIGHT_BITS - 1))
    for a, b in _row_chunks(xadj):
        rows = _rows(xadj, a, b)
        local = rows - rows[0]
        row_bits = max(int(local[-1]).bit_length(), 1)
        hash_bits = max(63 - row_bits - _WEIGHT_BITS, 0)
        key = local << np.int64(_WEIGHT_BITS + hash_bits)
        if top > 0:
            q = np.rint(np.asarray(weights[a:b], dtype=np.float64) * (wmax / top)).astype(np.int64)
            key |= (wmax - q) << np.int64(hash_bits)
        if hash_bits:
            key |= (_edge_hash(rows, adjncy[a:b]) >> np.uint64(64 - hash_bits)).astype(np.int64)
        order = np.argsort(key)
        del key
        within = np.arange(b - a, dtype=np.int64) - (xadj[rows[order]] - a)
        rank[a + order] = np.minimum(within, np.iinfo(np.int32).max)
    return rank


def heaviest_edges(xadj: np.ndarray, adjncy: np.ndarray, weights: Optional[np.ndarray], max_entries: int
                   ) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray], SparsifyInfo]:
    """At most ``max_entries`` adjacency entries of a symmetric CSR graph: each vertex's heaviest edges.

    Args:
        xadj, adjncy: CSR of a symmetric graph (both directions stored, sorted or not).
        weights: a non-negative weight per entry, equal in both directions (e.g. :func:`symmetrize`'s),
            or None for unit weights (ties everywhere: a hash of the endpoints decides).
        max_entries: the budget; at least ``2 * num_vertices`` (every vertex's heaviest edge fits).

    Returns:
        ``(xadj, adjncy, weights, info)``: the kept graph (the input arrays themselves when everything
        fits), symmetric, rows in their input order, and :class:`SparsifyInfo`.

    Example:
        >>> xadj = np.array([0, 3, 6, 9, 12])                  # K4: 0-1 weighs 5, 2-3 4, the rest 1
        >>> adjncy = np.array([1, 2, 3, 0, 2, 3, 0, 1, 3, 0, 1, 2])
        >>> w = np.array([5., 1, 1, 5, 1, 1, 1, 1, 4, 1, 1, 4])
        >>> x, a, kw, info = heaviest_edges(xadj, adjncy, w, max_entries=8)
        >>> x.tolist(), a.tolist(), kw.tolist()                 # the second heaviest would not fit
        ([0, 1, 2, 3, 4], [1, 0, 3, 2], [5.0, 5.0, 4.0, 4.0])
        >>> info.entries_kept, info.rank_threshold
        (4, 1)
    """
    from gsplit.partitioning.expected import reverse_edges

    n, m = len(xadj) - 1, int(xadj[-1])
    if max_entries < MIN_ENTRIES_PER_VERTEX * n:
        raise ValueError(f"max_entries={max_entries} for {n} vertices; pass at least {int(MIN_ENTRIES_PER_VERTEX * n)} "
                         "(2 per vertex) so that every vertex keeps its heaviest edge")
    total_w = float(m) if weights is None else float(np.sum(weights, dtype=np.float64))
    if m <= max_entries:
        return xadj, adjncy, weights, SparsifyInfo(m, m, -1, 1.0)
    rank = _ranks(xadj, adjncy, weights)
    rev = reverse_edges(xadj, adjncy)
    if rev.size and rev.min() < 0:
        raise ValueError("heaviest_edges needs a symmetric graph (every entry's reverse stored); "
                         "pass symmetrize()'s output")
    # an edge's rank: the better of its two ends'; equal on both entries of an edge, so thresholds keep pairs
    for a, b in ((a, min(a + _CHUNK, m)) for a in range(0, m, _CHUNK)):
        np.minimum(rank[a:b], rank[rev[a:b]], out=rank[a:b])
    del rev
    hist = np.zeros(0, dtype=np.int64)
    for a, b in ((a, min(a + _CHUNK, m)) for a in range(0, m, _CHUNK)):
        h = np.bincount(rank[a:b])
        if h.size > hist.size:
            h[:hist.size] += hist
            hist = h
        else:
            hist[:h.size] += h
    fits = np.cumsum(hist) <= max_entries  # fits[k - 1]: ranks < k fit
    k = int(np.count_nonzero(fits))  # >= 1: rank 0 holds at most 2 entries per vertex
    kept = int(hist[:k].sum())
    counts = np.zeros(n, dtype=np.int64)
    new_adj = np.empty(kept, dtype=adjncy.dtype)
    new_w = None if weights is None else np.empty(kept, dtype=weights.dtype)
    written = 0
    for a, b in ((a, min(a + _CHUNK, m)) for a in range(0, m, _CHUNK)):
        keep = rank[a:b] < k
        c = int(np.count_nonzero(keep))
        counts += np.bincount(_rows(xadj, a, b)[keep], minlength=n)
        new_adj[written:written + c] = adjncy[a:b][keep]
        if new_w is not None:
            new_w[written:written + c] = weights[a:b][keep]
        written += c
    new_xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=new_xadj[1:])
    kept_w = float(kept) if new_w is None else float(np.sum(new_w, dtype=np.float64))
    weight_kept = kept_w / total_w if total_w else 1.0
    info = SparsifyInfo(m, kept, k, weight_kept)
    log.info("METIS input bounded to %d of %d adjacency entries (%.1f per vertex): each vertex's %d heaviest "
             "edges, %.1f%% of the edge weight", kept, m, kept / max(n, 1), k, 100 * weight_kept)
    return new_xadj, new_adj, new_w, info
