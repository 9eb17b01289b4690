r"""Expected pre-sampling weights in closed form: what sampled pre-sampling estimates, without sampling.

Sampled pre-sampling (:func:`gsplit.presample` with ``method="sampled"``) runs the sampler for a few
epochs and averages counts; those averages estimate expectations under the sampler's distribution.
For :class:`~gsplit.sampling.NeighborSampler` the expectations follow layer by layer from the top:

* targets: a vertex of the training set is in a mini-batch of ``b`` targets with probability ``b / T``
  (``T`` training vertices);
* a vertex ``d`` of the frontier of layer ``l`` picks each of its in-edges with probability
  ``q_l(d)``: ``min(1, fanout_l / indeg(d))`` without replacement, ``1 - (1 - 1 / indeg(d))^fanout_l``
  with replacement (an edge may then be drawn several times: its expected count is
  ``fanout_l / indeg(d)``), ``1`` for fanout ``-1``;
* so the expected sampled in-edges of ``d`` in block ``l`` are ``p_{l+1}(d)`` times ``min(fanout, deg)``
  (``fanout`` with replacement, ``deg`` for ``-1``), and an edge ``u -> d`` is expected
  ``p_{l+1}(d) * (count per visit)`` times; both are exact (linear in the probabilities);
* a vertex ``u`` is at level ``l`` when it is a target or some out-neighbour ``d`` picked it at one of
  the layers ``l .. L-1`` while ``d`` was in the frontier. Levels are nested (``blocks[l].dst_nodes``
  is a prefix of ``blocks[l].src_nodes``), so ``d`` is in the frontier of every layer below the level
  ``tau_d`` where it first appears, ``P(tau_d >= m) = p_m(d)``. If ``u`` is absent, ``u`` cannot have
  brought ``d`` in, so ``d``'s presence is taken without ``u``'s help (the *cavity* of belief
  propagation). With a message per edge ``u -> d``,
  ``M_l(u -> d) = P(d, present without u, picks u at none of layers l .. L-1)``::

      1 - p_l(u)     = (1 - p_L(u)) * prod_{d : u -> d, d != u} M_l(u -> d)
      M_l(u -> d)    = 1 - sum_{m > l} P(tau_{d\u} = m) * (1 - prod_{l' = l}^{m - 1} (1 - q_{l'}(d)))
      P(tau_{d\u} >= m) = 1 - (1 - p_m(d)) / M_m(d -> u)      (divide out the reverse message)

  Assumed: the targets and the different out-neighbours of ``u`` are independent. Each layer costs a
  few passes over the edges and one scatter (a sparse matrix-vector product in log space). This is
  exact on trees (undirected, or each vertex with one out-edge) when every mini-batch holds the whole
  training set or each tree holds one training vertex, and for one layer with fixed targets
  (``tests/partitioning/test_expected.py`` checks these against exact enumeration, and sparse random graphs against
  200 sampled epochs). The simpler recurrence ``1 - p_l(u) = (1 - p_{l+1}(u)) prod_d (1 - p_{l+1}(d)
  q_l(d))`` agrees for two layers but overestimates the input level of three-layer samplers (by 20 %
  on a sparse random graph): ``u`` is mostly above *because* some ``d`` was, and ``d`` is mostly in the
  frontier because ``u`` picked it.

Epochs cut the training set into ``ceil(T / B)`` batches whose last one may be short; sampled
pre-sampling averages over all of them, so the result here is the same mixture: the full-batch
expectation weighted ``(nb - 1) / nb`` plus the short batch's weighted ``1 / nb``.
"""

from __future__ import annotations

import logging
import time
from typing import List, Tuple

import numpy as np
import torch

from gsplit.data.graph import Graph
from gsplit.partitioning.weights import PresampleWeights, check_train_idx

log = logging.getLogger(__name__)

# Floor of a log message: a message of 0 (a frontier vertex that surely picks every in-edge) would be
# -inf, and 1 / message overflows. exp(-60) ~ 1e-26 keeps the reciprocal finite in float32 and changes
# no probability by more than that.
_LOG_FLOOR = -60.0
# Per-edge arrays are float32 (20M edges: 80 MB each); per-vertex ones float64.
_EDGE_DTYPE = torch.float32


def batch_mixture(num_train: int, batch_size: int) -> List[Tuple[int, float]]:
    """``(targets in the batch, share of an epoch's batches)`` for the batches of one epoch.

    Example:
        >>> batch_mixture(10, 4)      # batches of 4, 4, 2
        [(4, 0.6666666666666666), (2, 0.3333333333333333)]
        >>> batch_mixture(8, 4)
        [(4, 1.0)]
    """
    nb = -(-num_train // batch_size)
    last = num_train - (nb - 1) * batch_size
    if last == batch_size:
        return [(batch_size, 1.0)]
    return [(batch_size, (nb - 1) / nb), (last, 1.0 / nb)] if nb > 1 else [(last, 1.0)]


def _layer_rates(deg: np.ndarray, fanout: int, replace: bool) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per vertex as a destination of one layer: (edges picked per visit, expected count of each
    in-edge per visit, probability that a given in-edge is picked at least once)."""
    has = deg > 0
    safe = np.where(has, deg, 1.0)
    if fanout == -1:
        count = deg.copy()
        per_edge = has.astype(np.float64)
        incl = per_edge
    elif replace:
        count = np.where(has, float(fanout), 0.0)
        per_edge = np.where(has, fanout / safe, 0.0)
        with np.errstate(divide="ignore"):  # log1p(-1) at degree 1 is -inf: a sure pick, as intended
            incl = np.where(has, -np.expm1(fanout * np.log1p(-1.0 / safe)), 0.0)
    else:
        count = np.minimum(deg, float(fanout))
        per_edge = np.where(has, count / safe, 0.0)
        incl = per_edge
    return count, per_edge, incl


def edge_id_dtype(num_edges: int) -> np.dtype:
    """The narrowest of int32 / int64 that holds every edge id (and -1): int32 halves a per-edge id array
    for any graph under 2^31 edges.

    Example:
        >>> edge_id_dtype(10), edge_id_dtype(2**31)
        (dtype('int32'), dtype('int64'))
    """
    return np.dtype(np.int32 if num_edges < 2**31 else np.int64)


def reverse_edges(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Edge id of ``d -> u`` for every edge ``u -> d`` of a CSC graph, ``-1`` where there is none
    (int32 below 2^31 edges, else int64: :func:`edge_id_dtype`).

    With repeated edges one of the copies is returned. Symmetric graphs whose in-edge lists are sorted
    (every graph built by :meth:`Graph.from_edges`) take an O(E) path; others a sort and a search.

    Example:
        >>> reverse_edges(np.array([0, 1, 3, 4]), np.array([1, 0, 2, 1])).tolist()   # path 0 - 1 - 2
        [1, 0, 3, 2]
    """
    import scipy.sparse as sp

    n, m = indptr.size - 1, indices.size
    ids = edge_id_dtype(m)
    if m == 0:
        return np.zeros(0, dtype=ids)
    lo, hi = int(indices.min()), int(indices.max())  # scipy's tocsr indexes with them unchecked: a bad id
    if lo < 0 or hi >= n or int(indptr[0]) != 0 or int(indptr[-1]) != m:  # corrupts memory (a few % of this)
        raise ValueError(f"reverse_edges: indices hold ids in [{lo}, {hi}] and indptr runs {int(indptr[0])}.."
                         f"{int(indptr[-1])} but the graph has {n} vertices and {m} edges; build it with "
                         f"Graph.from_csc (validate=True) or Graph.load, which check them")
    # the same matrix by rows: row u lists the out-edges u -> d (by d), each with its edge id
    out = sp.csc_matrix((np.arange(m, dtype=ids), indices, indptr), shape=(n, n)).tocsr()
    if np.array_equal(out.indptr, indptr) and np.array_equal(out.indices, indices):
        # symmetric, sorted: u's k-th in-neighbour is its k-th out-neighbour, so the in-edge at CSC
        # position p (d -> u) and the out-edge u -> d at CSR position p are each other's reverse
        return np.asarray(out.data, dtype=ids)
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    key = dst * n + indices  # (dst, src) of every edge; sorted when every in-edge list is
    order = None
    if np.any(key[1:] < key[:-1]):
        order = np.argsort(key, kind="stable")
        key = key[order]
    # the reverse of out-edge u -> d is the edge with (dst, src) = (u, d); queries come sorted
    query = np.repeat(np.arange(n, dtype=np.int64), np.diff(out.indptr)) * n + out.indices
    pos = np.minimum(np.searchsorted(key, query), m - 1)
    found = key[pos] == query
    rev = np.full(m, -1, dtype=ids)
    hit = pos[found] if order is None else order[pos[found]]
    rev[np.asarray(out.data)[found]] = hit
    return rev


class _EdgeView:
    """The per-edge index arrays the message recursion needs, built once per graph, and its buffers.

    Every per-edge step writes into preallocated buffers (``out=`` and in-place ops): on CPU, allocating
    a fresh 80 MB tensor (and faulting its pages in) costs more than the arithmetic on it.
    """

    def __init__(self, graph: Graph, num_layers: int):
        self.n = graph.num_nodes
        indptr = graph.indptr.cpu()
        self.src = graph.indices.cpu()
        self.deg = indptr[1:] - indptr[:-1]
        self.m = int(self.src.numel())
        rev = torch.from_numpy(reverse_edges(indptr.numpy(), self.src.numpy()))
        self.no_rev = (rev < 0).nonzero().squeeze(1)      # edges whose reverse is missing (none if symmetric)
        self.rev = rev.clamp_min_(0)
        # destination per edge in the narrow type (int32 below 2^31 vertices): index_select takes it as it is
        ids = np.int32 if self.n < 2**31 else np.int64
        self.dst = torch.from_numpy(np.repeat(np.arange(self.n, dtype=ids), self.deg.numpy()))
        # a self loop d -> d only picks d itself, which is in the frontier already: it never counts
        self.loops = (self.src == self.dst).nonzero().squeeze(1)
        self.x = torch.empty(self.m, dtype=_EDGE_DTYPE)
        self.tmp = torch.empty(self.m, dtype=_EDGE_DTYPE)
        self.inv_rev = [torch.empty(self.m, dtype=_EDGE_DTYPE) for _ in range(max(num_layers - 1, 0))]

    def per_edge(self, per_dst: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """A per-destination value on every in-edge of that destination, written to ``out``."""
        return torch.index_select(per_dst.to(_EDGE_DTYPE), 0, self.dst, out=out)

    def sum_by_source(self, per_edge: torch.Tensor) -> torch.Tensor:
        """Per vertex ``u``: the sum of ``per_edge`` over its out-edges ``u -> d``, self loops left out
        (``per_edge`` is zeroed there in place)."""
        if self.loops.numel():
            per_edge.index_fill_(0, self.loops, 0.0)
        return torch.bincount(self.src, weights=per_edge, minlength=self.n).to(torch.float64)

    def reverse_reciprocal(self, log_m: torch.Tensor, out: torch.Tensor, per_dst: bool) -> torch.Tensor:
        """``1 / M(d -> u)`` on every edge ``u -> d`` from the log messages (1 where no reverse edge)."""
        if per_dst:  # M(d -> u) is a value of u: gather it through each edge's source
            torch.index_select(torch.exp(-log_m).to(_EDGE_DTYPE), 0, self.src, out=out)
        else:
            torch.index_select(log_m, 0, self.rev, out=out).neg_().exp_()
        if self.no_rev.numel():
            out.index_fill_(0, self.no_rev, 1.0)
        return out


def _level_probabilities(view: _EdgeView, target_p: torch.Tensor, incl: List[torch.Tensor]) -> List[torch.Tensor]:
    """``p_l`` for levels ``0..L`` (input level first) for one batch size; ``incl[l]`` is layer ``l``'s
    per-edge pick probability of every destination (float64 ``[n]``).

    Messages: for an edge ``u -> d``, ``M_l(u -> d)`` is the probability that ``d`` does not pick ``u``
    at any layer ``l .. L-1`` at which ``d`` is in the frontier, where ``d``'s presence is computed
    *without* ``u``'s help (the cavity, as in belief propagation): if ``u`` is absent, ``u`` cannot have
    brought ``d`` in. ``1 - p_l(u) = (1 - p_L(u)) * prod_d M_l(u -> d)``, and ``d``'s presence
    without ``u`` is ``1 - (1 - p_m(d)) / M_m(d -> u)`` (divide out the reverse message).
    """
    num_layers = len(incl)
    p: List[torch.Tensor] = [None] * num_layers + [target_p]  # type: ignore[list-item]
    log_not_target = torch.log1p(-target_p)  # -inf for certain targets
    keep: dict = {}  # keep[m]: P(no pick at layers l .. m-1) of a vertex first present at level m
    for l in reversed(range(num_layers)):
        miss = 1.0 - incl[l]
        for m in keep:
            keep[m] = keep[m] * miss
        keep[l + 1] = miss

        def delta(m: int) -> torch.Tensor:  # keep[m] - keep[m - 1], with keep[l] = 1
            return keep[m] - (keep[m - 1] if m - 1 > l else 1.0)

        # 1 - M_l(u -> d) = sum_{m > l} P(tau_{d\u} = m) (1 - keep[m]). Summed by parts with
        # P(tau_{d\u} >= m) = 1 - (1 - p_m(d)) X_m (X_m = 1 / M_m(d -> u); X_L = 1, the targets) it is
        # base(d) + sum_{l < m < L} coef_m(d) X_m  with  coef_m = (1 - p_m) (keep[m] - keep[m-1]).
        base = (1.0 - keep[num_layers]) + (1.0 - p[num_layers]) * delta(num_layers)
        if l == num_layers - 1:  # the targets do not depend on u: the message is one value per destination
            log_m_dst = torch.log1p(-base.clamp(0.0, 1.0)).clamp_min_(_LOG_FLOOR)
            log_m = view.per_edge(log_m_dst, view.x)
        else:
            x = view.per_edge(base, view.x)
            for m in range(l + 1, num_layers):
                x.add_(view.per_edge((1.0 - p[m]) * delta(m), view.tmp).mul_(view.inv_rev[m - 1]))
            log_m = x.clamp_(0.0, 1.0).neg_().log1p_().clamp_min_(_LOG_FLOOR)
        if l > 0:  # the layers below divide d's presence at level l by the reverse message
            view.reverse_reciprocal(log_m_dst if l == num_layers - 1 else log_m, view.inv_rev[l - 1],
                                    per_dst=l == num_layers - 1)
        total = view.sum_by_source(log_m)
        p[l] = torch.maximum(-torch.expm1((log_not_target + total).clamp_max(0.0)), p[l + 1])
    return p


def expected_presample(graph: Graph, train_idx, sampler, batch_size: int) -> PresampleWeights:
    """The weights :func:`gsplit.presample` estimates, computed as expectations (no sampling).

    ``batch_size`` is the *global* mini-batch (targets per sampled mini-batch, all ranks together).
    ``sampler`` must be a :class:`~gsplit.sampling.NeighborSampler` (its fanouts and ``replace`` define
    the distribution; its seed does not matter). Every weight is an expected value per mini-batch,
    averaged over the batches of an epoch as sampled pre-sampling averages them; ``num_batches`` and
    ``epochs`` are 0 (nothing was sampled) and ``metadata["method"]`` is ``"expected"``. See the
    module docstring for the formulas and the one approximation (independence).

    Example:
        >>> from gsplit import Graph, NeighborSampler
        >>> g = Graph.from_edges([1, 2], [0, 0])      # 1 -> 0, 2 -> 0
        >>> w = expected_presample(g, torch.tensor([0]), NeighborSampler([1]), batch_size=1)
        >>> w.level_vertex_weights.tolist(), w.edge_weights.tolist()
        ([[1.0, 0.5, 0.5], [1.0, 0.0, 0.0]], [0.5, 0.5])
    """
    from gsplit.sampling.neighbor import NeighborSampler

    if not isinstance(sampler, NeighborSampler):
        raise ValueError(f"method='expected' computes the weights of gsplit.NeighborSampler, got "
                         f"{type(sampler).__name__}; pass method='sampled' for other samplers")
    train_idx = check_train_idx(graph, train_idx)
    if int(batch_size) < 1:
        raise ValueError(f"batch_size={batch_size}; pass a positive number of targets per mini-batch")
    batch_size = int(batch_size)
    t0 = time.perf_counter()
    n, num_train = graph.num_nodes, int(train_idx.numel())
    view = _EdgeView(graph, len(sampler.fanouts))
    deg = view.deg.numpy().astype(np.float64)
    rates = [[torch.from_numpy(a) for a in _layer_rates(deg, f, sampler.replace)] for f in sampler.fanouts]
    num_layers = len(rates)
    is_train = torch.zeros(n, dtype=torch.bool)
    is_train[train_idx.cpu()] = True

    levels = torch.zeros(num_layers + 1, n, dtype=torch.float64)
    for size, share in batch_mixture(num_train, batch_size):
        target_p = torch.where(is_train, size / num_train, 0.0).to(torch.float64)
        p = _level_probabilities(view, target_p, [r[2] for r in rates])
        for l in range(num_layers + 1):
            levels[l] += share * p[l]
    loads = torch.stack([levels[l + 1] * rates[l][0] for l in range(num_layers)])
    per_dst = sum(levels[l + 1] * rates[l][1] for l in range(num_layers))
    edge_w = view.per_edge(per_dst, torch.empty(view.m, dtype=_EDGE_DTYPE))
    del view
    level_w = levels.to(torch.float32)
    elapsed = time.perf_counter() - t0
    log.info("expected pre-sampling weights (%d layers, global batch %d) in %.2fs", num_layers, batch_size, elapsed)
    return PresampleWeights(
        vertex_weights=level_w.sum(0),
        edge_weights=edge_w,
        level_vertex_weights=level_w,
        layer_edge_load=loads.to(torch.float32),
        num_batches=0,
        batch_size=batch_size,
        epochs=0,
        fanouts=[int(f) for f in sampler.fanouts],
        graph_fingerprint=graph.fingerprint(),
        metadata={"method": "expected", "seconds": round(elapsed, 3), "sampler": sampler.to_config(),
                  "num_train": num_train, "batches_per_epoch": -(-num_train // batch_size)},
    )
