"""Partitioning strategies (:func:`partition`): weighted METIS (``gsplit``, ``node``, ``edge``) and ``random``.

``gsplit`` and ``node`` balance the pre-sampling weights (:class:`~gsplit.partitioning.weights.PresampleWeights`,
made here when not given) across the parts, ``gsplit`` also minimises the pre-sampled communication (edge
weights); ``edge`` balances in-edges and training vertices; ``random`` assigns vertices uniformly. METIS's
input and call are :mod:`gsplit.partitioning.metis`'s; its input is bounded as
:mod:`gsplit.partitioning.budget` decides, and the cut refined over every edge afterwards
(:mod:`gsplit.partitioning.refine`).
"""

from __future__ import annotations

import logging
import time
from typing import Optional, Union

import numpy as np
import torch

from gsplit.data.graph import Graph
from gsplit.interop.graphs import as_graph, as_sampler  # DGLGraph / PyG Data in; imports neither library
from gsplit.partitioning.budget import METIS_EDGES_PER_VERTEX, resolve_metis_bound
from gsplit.partitioning.metis import _weight_limits, metis_part_kway, symmetrize, to_metis_weights
from gsplit.partitioning.partition_map import PartitionMap
from gsplit.partitioning.presample import presample
from gsplit.partitioning.refine import refine_cut
from gsplit.partitioning.sparsify import AUTO, check_entries_per_vertex, heaviest_edges
from gsplit.partitioning.weights import PresampleWeights, check_train_idx
from gsplit.runtime.resources import cpu_seconds

log = logging.getLogger(__name__)


METHODS = ("gsplit", "node", "edge", "random")
"""Names accepted by :func:`partition`'s ``method``."""

BALANCE_MODES = ("layers", "total")
"""How ``gsplit``/``node`` turn pre-sampling weights into METIS balance constraints (see :func:`partition`)."""


def _balance_constraints(weights: PresampleWeights, balance: str) -> np.ndarray:
    """Vertex weights (float, ``[n]`` or ``[n, ncon]``) for ``gsplit``/``node`` from pre-sampling."""
    if balance == "total":
        return weights.vertex_weights.cpu().numpy().astype(np.float64)
    # "layers": per GNN layer, the vertex's sampled in-edges there (the work its GPU does for it), plus the
    # input level's appearances (feature loading); drop constraints that are zero everywhere.
    cols = [weights.layer_edge_load[l] for l in range(weights.num_layers)] + [weights.level_vertex_weights[0]]
    mat = torch.stack(cols, 1).cpu().numpy().astype(np.float64)
    mat = mat[:, mat.sum(0) > 0]
    return mat if mat.shape[1] > 1 else mat.reshape(-1)


def _random_assignment(n: int, num_parts: int, seed: int) -> np.ndarray:
    """Balanced random map: a seeded permutation dealt round-robin (part sizes differ by at most 1)."""
    perm = np.random.default_rng([int(seed), 0x9A27]).permutation(n)
    out = np.empty(n, dtype=np.int64)
    out[perm] = np.arange(n) % num_parts
    return out


def _per_rank_batch(weights: PresampleWeights, num_parts: int) -> Optional[int]:
    """Targets per rank that ``weights`` were made for, for a map of ``num_parts`` parts."""
    if int(weights.metadata.get("num_parts", 0)) == num_parts and "batch_size_per_rank" in weights.metadata:
        return int(weights.metadata["batch_size_per_rank"])
    if weights.batch_size % num_parts == 0:
        return weights.batch_size // num_parts
    log.warning("the pre-sampling weights were made for mini-batches of %d targets, which %d parts do not divide; "
                "the map records no batch size", weights.batch_size, num_parts)
    return None


def check_part_args(num_parts: int, num_nodes: int, ufactor: int) -> int:
    """Validate the arguments every partitioner shares; returns ``num_parts`` as an int.

    Example:
        >>> check_part_args(2, 10, 30)
        2
    """
    num_parts = int(num_parts)
    if num_parts < 1:
        raise ValueError(f"num_parts={num_parts}; pass the world size (number of ranks), at least 1")
    if num_parts > num_nodes:
        raise ValueError(f"num_parts={num_parts} but the graph has only {num_nodes} vertices; "
                         f"use at most {num_nodes} parts")
    if not 0 <= int(ufactor) <= 10_000:
        raise ValueError(f"ufactor={ufactor}; pass the allowed imbalance in thousandths, e.g. 30 for 3%")
    return num_parts


def partition(graph: Graph, num_parts: int, method: str = "gsplit", weights: Optional[PresampleWeights] = None,
              train_idx=None, seed: int = 0, sampler=None, batch_size: Optional[int] = None, *,
              epochs: int = 10, ufactor: int = 30, balance: str = "layers",
              presample_method: str = "expected",
              metis_edges_per_vertex: Union[float, str, None] = METIS_EDGES_PER_VERTEX) -> PartitionMap:
    """Partition ``graph``'s vertices into ``num_parts`` parts (one per GPU); returns a :class:`PartitionMap`.

    Methods:
        ``gsplit``: METIS minimising the cut of the pre-sampled edge weights (edges never sampled are left
        out) while balancing pre-sampled vertex weights. ``node``: same vertex weights, every edge weighs 1.
        ``edge``: no pre-sampling; balances in-degree (edges owned) and, with ``train_idx``, the number of
        training vertices, minimising the plain edge cut. ``random``: seeded, balanced uniform random.

    ``balance`` picks the vertex weights of ``gsplit``/``node``: ``"layers"`` (default) gives METIS one
    constraint per GNN layer (the vertex's pre-sampled in-edges at that layer, i.e. its share of that
    layer's work) plus one for input-feature loads, so every layer is balanced; ``"total"`` is one
    constraint, the total appearances (``PresampleWeights.vertex_weights``), as in the GSplit paper.

    METIS sees ``A + A^T`` without self loops (:func:`symmetrize`) and integer weights: each float weight
    array is scaled so its largest entry becomes 2**20, rounded, and a positive weight is never rounded to
    0 (:func:`to_metis_weights`). ``ufactor`` is METIS's tolerance: every constraint may exceed its average
    per part by ``ufactor / 1000``. The map is deterministic for a given ``seed``.

    ``metis_edges_per_vertex`` bounds METIS's input, and with it METIS's memory (which grows with the
    entries it is given, faster than they do): at most that many adjacency entries per vertex on
    average, each vertex's heaviest edges (by pre-sampled weight; unit weights: a hash of the endpoints),
    kept symmetric (:func:`gsplit.partitioning.sparsify.heaviest_edges`); METIS's map is then refined
    over every edge (balanced label propagation, :func:`gsplit.partitioning.refine.refine_cut`). ``0`` or
    ``None``: METIS sees every edge; ``"auto"`` (default): every edge where the memory that needs is
    available, else :data:`METIS_BOUND_WHEN_SHORT` (with a warning). The map's metadata records what was kept (``metis_entries_in``,
    ``metis_adjacency_entries``, ``metis_weight_kept``) and the refinement (``refine_cut_before/after``).

    ``gsplit``/``node`` need ``weights`` from :func:`presample`; without them, pass ``sampler``,
    ``batch_size`` (targets **per rank**, as the loaders take it) and ``train_idx``, and pre-sampling runs
    here for the global mini-batch ``batch_size * num_parts``: ``presample_method="expected"`` (default,
    closed form) or ``"sampled"`` (``epochs`` epochs of the sampler). The map records the per-rank batch
    size (from ``weights``: their global mini-batch divided by ``num_parts``).

    Example:
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> partition(g, 2, method="random").part_sizes().tolist()
        [2, 2]
    """
    graph = as_graph(graph)
    sampler = None if sampler is None else as_sampler(sampler)
    if method not in METHODS:
        raise ValueError(f"unknown partition method {method!r}; use one of {', '.join(METHODS)}")
    if balance not in BALANCE_MODES:
        raise ValueError(f"unknown balance {balance!r}; use one of {', '.join(BALANCE_MODES)}")
    num_parts = check_part_args(num_parts, graph.num_nodes, ufactor)
    budget = check_entries_per_vertex(metis_edges_per_vertex)  # bad values fail before any work
    n = graph.num_nodes
    t0 = time.perf_counter()
    fingerprint = graph.fingerprint()
    meta = {"seed": int(seed)}

    if method in ("gsplit", "node"):
        if weights is None:
            if sampler is None or batch_size is None or train_idx is None:
                raise ValueError(f"method={method!r} needs pre-sampling weights: pass weights=presample(...), or "
                                 "sampler=, batch_size= and train_idx= so that partition runs pre-sampling")
            weights = presample(graph, train_idx, sampler, batch_size, num_parts=num_parts, epochs=epochs, seed=seed,
                                method=presample_method)
        if not isinstance(weights, PresampleWeights):
            raise TypeError(f"weights must be a PresampleWeights from presample(), got {type(weights).__name__}")
        weights.check_graph(graph)
        fanouts, bsize = weights.fanouts, _per_rank_batch(weights, num_parts)
        meta.update(presample_method=weights.metadata.get("method", "sampled"), presample_epochs=weights.epochs,
                    presample_batches=weights.num_batches, balance=balance)
    else:
        if weights is not None:
            log.info("method=%r does not use pre-sampling weights; ignoring them", method)
        fanouts = None if sampler is None else list(getattr(sampler, "fanouts", []) or []) or None
        bsize = None if batch_size is None else int(batch_size)

    if num_parts == 1:
        assign = np.zeros(n, dtype=np.int64)
    elif method == "random":
        assign = _random_assignment(n, num_parts, seed)
    else:
        t_graph, c_graph = time.perf_counter(), cpu_seconds()
        if method == "gsplit":
            xadj, adjncy, ew = symmetrize(graph, weights.edge_weights, drop_zero=True)
            vw = _balance_constraints(weights, balance)
        elif method == "node":
            xadj, adjncy, ew = symmetrize(graph)
            vw = _balance_constraints(weights, balance)
        else:  # edge
            xadj, adjncy, ew = symmetrize(graph)
            vw = graph.in_degrees().cpu().numpy().astype(np.float64)
            if train_idx is not None:
                is_train = np.zeros(n, dtype=np.float64)
                is_train[check_train_idx(graph, train_idx).cpu().numpy()] = 1.0
                vw = np.stack([vw, is_train], 1)
        entries_in = int(adjncy.size)
        t_bound, c_bound = time.perf_counter(), cpu_seconds()
        bounded = False
        if budget == AUTO:  # decided only where METIS runs: other methods need no memory for it
            budget = resolve_metis_bound(n, graph.num_edges, budget)
        if budget is not None:
            xadj, adjncy, ew, kept = heaviest_edges(xadj, adjncy, ew, int(budget * n))
            bounded = kept.rank_threshold >= 0
            meta.update(metis_entries_in=entries_in, metis_rank_threshold=kept.rank_threshold,
                        metis_weight_kept=round(kept.weight_kept, 6), metis_edges_per_vertex=budget)
        t_scale, c_scale = time.perf_counter(), cpu_seconds()
        limits = _weight_limits()
        vw_int = to_metis_weights(vw, *limits, keep_positive=True)
        ew_int = None if ew is None else to_metis_weights(ew, *limits, keep_positive=True)
        del vw, ew
        t_metis, c_metis = time.perf_counter(), cpu_seconds()
        metis_memory: dict = {}
        assign, cut, backend = metis_part_kway(xadj, adjncy, num_parts, vw_int, ew_int, seed=seed, ufactor=int(ufactor),
                                               memory=metis_memory)
        meta.update(metis_memory)
        t_refine, c_refine = time.perf_counter(), cpu_seconds()
        if bounded:  # the edges METIS did not see still cost communication when cut: refine over all of them
            full_w = weights.edge_weights.cpu().numpy() if method == "gsplit" else None
            assign, refined = refine_cut(graph.indptr.cpu().numpy(), graph.indices.cpu().numpy(), full_w, assign,
                                         num_parts, vw_int, int(ufactor))
            meta.update(refine_cut_before=refined.cut_before, refine_cut_after=refined.cut_after,
                        refine_moved=refined.moved, refine_rounds=refined.rounds)
        meta.update(metis_edgecut=cut, metis_backend=backend, ncon=1 if vw_int.ndim == 1 else int(vw_int.shape[1]),
                    ufactor=int(ufactor), metis_adjacency_entries=int(adjncy.size),
                    stage_seconds={"build_graph": round(t_bound - t_graph, 3),
                                   "bound_input": round(t_scale - t_bound, 3),
                                   "scale_weights": round(t_metis - t_scale, 3),
                                   "metis": round(t_refine - t_metis, 3),
                                   "refine": round(time.perf_counter() - t_refine, 3)},
                    stage_cpu_seconds={"build_graph": round(c_bound - c_graph, 3),
                                       "bound_input": round(c_scale - c_bound, 3),
                                       "scale_weights": round(c_metis - c_scale, 3),
                                       "metis": round(c_refine - c_metis, 3),
                                       "refine": round(cpu_seconds() - c_refine, 3)})
    meta["seconds"] = round(time.perf_counter() - t0, 3)

    pmap = PartitionMap(assignment=torch.from_numpy(assign), num_parts=num_parts, method=method,
                        graph_fingerprint=fingerprint, num_nodes=n, fanouts=fanouts, batch_size=bsize, metadata=meta)
    sizes = pmap.part_sizes()
    if bool((sizes == 0).any()):
        log.warning("partition %r left %d of %d parts empty (sizes %s); those ranks will own no vertices",
                    method, int((sizes == 0).sum()), num_parts, sizes.tolist())
    log.info("partitioned %d vertices into %d parts with %r in %.1fs; part sizes %s", n, num_parts, method,
             meta["seconds"], sizes.tolist())
    return pmap
