"""Pre-sampling: estimate how often each vertex and edge takes part in a mini-batch.

GSplit's partitioner needs, per vertex, the expected computation it causes and, per edge, the expected
communication it causes if its endpoints land on different GPUs. Both are estimated by running the
training sampler for a few epochs and counting (see :class:`PresampleWeights` for the exact counts).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from gsplit.graph import Graph, as_vertex_ids
from gsplit.interop.graphs import as_graph, as_sampler  # DGLGraph / PyG Data in; imports neither library
from gsplit.io import load_npy, read_meta, write_array_dir
from gsplit.sampling.batches import global_batches

log = logging.getLogger(__name__)

# Sampled ids are buffered and counted with one bincount per chunk: a bincount per mini-batch would
# allocate a full ``[num_edges]`` result every time, which dominates on large graphs. A chunk holds at
# least as many ids as the count has entries (so that cost is amortised), and at least this many.
_MIN_FLUSH_ENTRIES = 1 << 22


def check_train_idx(graph: Graph, train_idx, what: str = "train_idx") -> torch.Tensor:
    """``train_idx`` (ids or a boolean mask) as a non-empty int64 tensor of valid, distinct vertex ids."""
    if train_idx is None:
        raise ValueError(f"{what} is None; pass the ids of the training vertices")
    t = as_vertex_ids(train_idx, graph.num_nodes, what, unique=True)
    if t.numel() == 0:
        raise ValueError(f"{what} is empty; pass at least one training vertex")
    return t.to(graph.device)


@dataclass
class PresampleWeights:
    """Per-vertex and per-edge sampling frequencies from pre-sampling (:func:`presample`).

    A mini-batch of a ``L``-layer sampler has ``L + 1`` *levels*: level 0 is ``blocks[0].src_nodes`` (the
    input vertices, whose features are loaded) and level ``l >= 1`` is ``blocks[l - 1].dst_nodes`` (the
    vertices whose layer-``l`` output is computed; level ``L`` are the targets). A vertex *appears at a
    level* when it is among that level's (distinct) vertices. All weights are averages per mini-batch:
    ``count / num_batches``.
    """

    vertex_weights: torch.Tensor
    """float32 ``[num_nodes]``: appearances of each vertex summed over all levels, per mini-batch."""
    edge_weights: torch.Tensor
    """float32 ``[num_edges]``: times each edge (by edge id) is in some block, summed over layers, per mini-batch."""
    level_vertex_weights: torch.Tensor
    """float32 ``[L + 1, num_nodes]``: appearances per level (row 0 = input level), per mini-batch."""
    layer_edge_load: torch.Tensor
    """float32 ``[L, num_nodes]``: sampled in-edges of each vertex in block ``l`` (its layer-``l`` work), per mini-batch."""
    num_batches: int
    """Number of mini-batches sampled (``N`` in ``w = count / N``); 0 for expected weights (nothing sampled)."""
    batch_size: int
    """Targets per mini-batch (the global one: all ranks together)."""
    epochs: int
    """Epochs pre-sampled; 0 for expected weights."""
    fanouts: Optional[List[int]] = None
    """The sampler's fanouts (input layer first), when it has them."""
    graph_fingerprint: Optional[str] = None
    """``Graph.fingerprint()`` of the graph that was sampled."""
    metadata: Dict[str, Any] = field(default_factory=dict)
    """Free-form details (seed, time taken, sampler config)."""

    @property
    def num_layers(self) -> int:
        return self.layer_edge_load.shape[0]

    def check_graph(self, graph: Graph) -> None:
        """Raise ``ValueError`` if these weights were not computed on ``graph`` (sizes, then fingerprint)."""
        n, e = self.vertex_weights.numel(), self.edge_weights.numel()
        if n != graph.num_nodes or e != graph.num_edges:
            raise ValueError(f"the pre-sampling weights hold {n} vertex and {e} edge weights but the graph has "
                             f"{graph.num_nodes} vertices and {graph.num_edges} edges; run presample on this graph")
        if self.graph_fingerprint is not None and self.graph_fingerprint != graph.fingerprint():
            raise ValueError(f"pre-sampling weights are for the graph with fingerprint {self.graph_fingerprint}, this "
                             f"graph has {graph.fingerprint()}; run presample on this graph")

    # ------------------------------------------------------------------ persistence
    _META = "presample.json"

    def save(self, path) -> None:
        """Write the weights into folder ``path`` (``vertex_weights.npy`` ... then ``presample.json`` last).

        Each file is written atomically; ``presample.json`` lands last, so :meth:`load` recognises an
        interrupted write. The folder may be shared with a partition map (``gsplit prepare`` does so).
        """
        arrays = {"vertex_weights.npy": self.vertex_weights, "edge_weights.npy": self.edge_weights,
                  "level_vertex_weights.npy": self.level_vertex_weights, "layer_edge_load.npy": self.layer_edge_load}
        meta = {"format": "gsplit-presample", "version": 1, "num_batches": self.num_batches,
                "batch_size": self.batch_size, "epochs": self.epochs, "fanouts": self.fanouts,
                "graph_fingerprint": self.graph_fingerprint, "num_nodes": self.vertex_weights.numel(),
                "num_edges": self.edge_weights.numel(), "metadata": self.metadata}
        write_array_dir(path, {k: v.cpu().numpy() for k, v in arrays.items()}, meta, meta_name=self._META,
                        default=str)

    _FIX = "pre-sample again (`gsplit prepare`) to rewrite it"

    @classmethod
    def _read_meta(cls, p: Path) -> dict:
        return read_meta(p, ["num_batches", "batch_size", "epochs", "num_nodes", "num_edges"],
                         "set of pre-sampling weights", cls._FIX, meta_name=cls._META,
                         written_first=["edge_weights.npy", "level_vertex_weights.npy", "layer_edge_load.npy"])

    @classmethod
    def _check_weights(cls, a: np.ndarray, file: Path) -> None:
        if not np.isfinite(a).all() or (a < 0).any():
            raise ValueError(f"{file} holds negative or non-finite weights; {cls._FIX}")

    @classmethod
    def load(cls, path) -> "PresampleWeights":
        """Read weights written by :meth:`save`, checking dtypes, shapes and that no weight is negative or NaN.

        Example:
            >>> import tempfile
            >>> from gsplit.sampling.neighbor import NeighborSampler
            >>> g = Graph.from_edges([0, 1, 2], [1, 2, 0], symmetric=True)
            >>> w = presample(g, torch.tensor([0, 1]), NeighborSampler([2]), batch_size=2, epochs=1)
            >>> d = tempfile.mkdtemp(); w.save(d)
            >>> torch.equal(PresampleWeights.load(d).vertex_weights, w.vertex_weights)
            True
        """
        p, fix = Path(path), cls._FIX
        meta = cls._read_meta(p)
        n, e = meta["num_nodes"], meta["num_edges"]
        arrays = {}
        for name, rows in (("vertex_weights", None), ("edge_weights", None), ("level_vertex_weights", -1),
                           ("layer_edge_load", -1)):
            a = load_npy(p / f"{name}.npy", fix, kind="f", ndim=1 if rows is None else 2)
            width = n if name != "edge_weights" else e
            if a.shape[-1] != width:
                raise ValueError(f"{p / (name + '.npy')} has shape {a.shape} but the graph of {p / cls._META} has "
                                 f"{width} {'edges' if name == 'edge_weights' else 'vertices'}; {fix}")
            cls._check_weights(a, p / f"{name}.npy")
            arrays[name] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
        if arrays["level_vertex_weights"].shape[0] != arrays["layer_edge_load"].shape[0] + 1:
            raise ValueError(f"{p}: level_vertex_weights.npy has {arrays['level_vertex_weights'].shape[0]} levels "
                             f"but layer_edge_load.npy {arrays['layer_edge_load'].shape[0]} layers (levels must be "
                             f"layers + 1); {fix}")
        return cls(**arrays, num_batches=meta["num_batches"], batch_size=meta["batch_size"], epochs=meta["epochs"],
                   fanouts=meta.get("fanouts"), graph_fingerprint=meta.get("graph_fingerprint"),
                   metadata=meta.get("metadata", {}))

    @classmethod
    def load_vertex_weights(cls, path, graph: Optional[Graph] = None) -> torch.Tensor:
        """Only ``vertex_weights`` of weights written by :meth:`save` (checked like :meth:`load`, and against
        ``graph`` when given): what the feature cache orders vertices by, without reading the per-edge and
        per-level arrays (4 B per edge + 28 B per vertex at 3 layers: 740 MB at 8M vertices / 120M edges,
        which ``gsplit train`` read before every run only to drop them).

        Example:
            >>> import tempfile
            >>> from gsplit.sampling.neighbor import NeighborSampler
            >>> g = Graph.from_edges([0, 1, 2], [1, 2, 0], symmetric=True)
            >>> w = presample(g, torch.tensor([0, 1]), NeighborSampler([2]), batch_size=2, epochs=1)
            >>> d = tempfile.mkdtemp(); w.save(d)
            >>> torch.equal(PresampleWeights.load_vertex_weights(d, g), w.vertex_weights)
            True
        """
        p, fix = Path(path), cls._FIX
        meta = cls._read_meta(p)
        a = load_npy(p / "vertex_weights.npy", fix, kind="f", ndim=1, length=meta["num_nodes"])
        cls._check_weights(a, p / "vertex_weights.npy")
        if graph is not None:
            if meta["num_nodes"] != graph.num_nodes or meta["num_edges"] != graph.num_edges:
                raise ValueError(f"the pre-sampling weights in {p} are for {meta['num_nodes']} vertices and "
                                 f"{meta['num_edges']} edges but the graph has {graph.num_nodes} vertices and "
                                 f"{graph.num_edges} edges; run presample on this graph")
            fingerprint = meta.get("graph_fingerprint")
            if fingerprint is not None and fingerprint != graph.fingerprint():
                raise ValueError(f"pre-sampling weights in {p} are for the graph with fingerprint {fingerprint}, "
                                 f"this graph has {graph.fingerprint()}; run presample on this graph")
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


class _Counter:
    """Accumulates ``bincount`` of id chunks into a running count of fixed length."""

    def __init__(self, size: int, device):
        self.size = size
        self.counts = torch.zeros(size, dtype=torch.int64, device=device)
        self.pending: List[torch.Tensor] = []
        self.num_pending = 0
        self.flush_at = max(_MIN_FLUSH_ENTRIES, size)

    def add(self, ids: torch.Tensor) -> None:
        self.pending.append(ids)
        self.num_pending += ids.numel()
        if self.num_pending >= self.flush_at:
            self.flush()

    def flush(self) -> torch.Tensor:
        if self.pending:
            self.counts += torch.bincount(torch.cat(self.pending), minlength=self.size)
            self.pending, self.num_pending = [], 0
        return self.counts


def _batch_use(blocks) -> Tuple[List[torch.Tensor], List[Tuple[torch.Tensor, torch.Tensor]]]:
    """Per mini-batch: the vertices of each level (input level first), and per layer the (dst global id,
    edge id) of every edge. ``blocks`` is what ``sample_blocks`` returns, input layer first."""
    levels = [blocks[0].src_nodes] + [b.dst_nodes for b in blocks]
    return levels, [(b.dst_nodes[b.edge_dst], b.edge_ids) for b in blocks]


PRESAMPLE_METHODS = ("sampled", "expected")
"""Names accepted by :func:`presample`'s ``method``."""


def presample(graph: Graph, train_idx, sampler, batch_size: int, epochs: int = 10, seed: int = 0,
              progress: bool = False, *, num_parts: int = 1, method: str = "sampled") -> PresampleWeights:
    """How often each vertex and edge takes part in a mini-batch: sampled (counted) or expected (exact).

    ``batch_size`` is targets **per rank** and ``num_parts`` the number of ranks (parts): mini-batches
    have ``batch_size * num_parts`` targets, the global mini-batch of split-parallel training (with the
    default ``num_parts=1``, ``batch_size`` is the whole mini-batch). ``PresampleWeights.batch_size``
    holds that global size; ``metadata`` keeps ``num_parts`` and ``batch_size_per_rank``.

    ``method="sampled"`` runs ``sampler`` over the training vertices for ``epochs`` epochs and counts.
    Each epoch is the loaders' global order of ``train_idx`` for ``(seed, epoch)``
    (:func:`gsplit.sampling.batches.global_batches`) cut into mini-batches (the last may be short);
    batch ``i`` of epoch ``e`` is sampled with ``sampler.sample_blocks(graph, seeds, e, i)``. See
    :class:`PresampleWeights` for what is counted. Any object with
    ``sample_blocks(graph, seeds, epoch, iteration)`` returning the blocks works.

    ``method="expected"`` computes the expectations those counts estimate in closed form
    (:func:`gsplit.partitioning.expected.expected_presample`), a few passes over the edges per layer:
    no sampling noise, seconds instead of minutes on a 20M-edge graph. It needs a
    :class:`~gsplit.sampling.NeighborSampler`; ``epochs``, ``seed`` and ``progress`` do not apply, and
    the result has ``num_batches == epochs == 0`` (every weight is an expected value per mini-batch,
    averaged over an epoch's batches as the sampled counts are).

    Example:
        >>> from gsplit import Graph, NeighborSampler
        >>> g = Graph.from_edges([0, 1, 2], [1, 2, 0], symmetric=True)
        >>> w = presample(g, torch.tensor([0]), NeighborSampler([-1]), batch_size=1, epochs=1)
        >>> w.vertex_weights.tolist(), w.num_batches
        ([2.0, 1.0, 1.0], 1)
        >>> presample(g, torch.tensor([0]), NeighborSampler([-1]), batch_size=1, method="expected").vertex_weights.tolist()
        [2.0, 1.0, 1.0]
    """
    graph, sampler = as_graph(graph), as_sampler(sampler)
    if method not in PRESAMPLE_METHODS:
        raise ValueError(f"unknown pre-sampling method {method!r}; use one of {', '.join(PRESAMPLE_METHODS)}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size={batch_size}; pass a positive number of targets per rank")
    if int(num_parts) < 1:
        raise ValueError(f"num_parts={num_parts}; pass the number of ranks (parts), at least 1")
    per_rank, num_parts = int(batch_size), int(num_parts)
    batch_size = per_rank * num_parts
    if method == "expected":
        from gsplit.partitioning.expected import expected_presample

        weights = expected_presample(graph, train_idx, sampler, batch_size)
        weights.metadata.update(num_parts=num_parts, batch_size_per_rank=per_rank)
        return weights
    train_idx = check_train_idx(graph, train_idx)
    if int(epochs) < 1:
        raise ValueError(f"epochs={epochs}; pre-sampling needs at least one epoch")
    batch_size, epochs = int(batch_size), int(epochs)
    n, dev = graph.num_nodes, graph.device
    per_epoch = -(-train_idx.numel() // batch_size)
    t0 = time.perf_counter()

    levels: Optional[List[_Counter]] = None
    loads: Optional[List[_Counter]] = None
    edges = _Counter(graph.num_edges, dev)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=epochs * per_epoch, desc="pre-sampling", unit="batch")
    num_batches = 0
    for epoch in range(epochs):
        for it, seeds in enumerate(global_batches(train_idx, batch_size, seed, epoch)):
            level_nodes, layer_edges = _batch_use(sampler.sample_blocks(graph, seeds, epoch, it))
            if levels is None:
                levels = [_Counter(n, dev) for _ in range(len(level_nodes))]
                loads = [_Counter(n, dev) for _ in range(len(layer_edges))]
            elif len(level_nodes) != len(levels):
                raise ValueError(f"the sampler returned {len(layer_edges)} blocks after {len(levels) - 1} before; "
                                 "it must return one block per layer every time")
            for l, nodes in enumerate(level_nodes):
                levels[l].add(nodes)
            for l, (dst, eids) in enumerate(layer_edges):
                loads[l].add(dst)
                edges.add(eids)
            num_batches += 1
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()

    inv = 1.0 / num_batches
    level_w = torch.stack([c.flush() for c in levels]).to(torch.float32).mul_(inv).cpu()
    load_w = torch.stack([c.flush() for c in loads]).to(torch.float32).mul_(inv).cpu()
    edge_w = edges.flush().to(torch.float32).mul_(inv).cpu()
    elapsed = time.perf_counter() - t0
    log.info("pre-sampled %d mini-batches (%d epochs of %d targets) in %.1fs", num_batches, epochs, batch_size, elapsed)
    fanouts = getattr(sampler, "fanouts", None)
    cfg = sampler.to_config() if hasattr(sampler, "to_config") else {"repr": repr(sampler)}
    return PresampleWeights(
        vertex_weights=level_w.sum(0),
        edge_weights=edge_w,
        level_vertex_weights=level_w,
        layer_edge_load=load_w,
        num_batches=num_batches,
        batch_size=batch_size,
        epochs=epochs,
        fanouts=None if fanouts is None else [int(f) for f in fanouts],
        graph_fingerprint=graph.fingerprint(),
        metadata={"method": "sampled", "seed": int(seed), "seconds": round(elapsed, 3), "sampler": cfg,
                  "num_train": int(train_idx.numel()), "num_parts": num_parts, "batch_size_per_rank": per_rank},
    )
