"""What pre-sampling estimates (:class:`PresampleWeights`: per vertex, per edge and per level, saved beside a
partition map) and the training vertices it is estimated over (:func:`check_train_idx`).

Both ways of pre-sampling produce it: counting sampled mini-batches (:func:`gsplit.partitioning.presample.presample`)
and the closed form (:func:`gsplit.partitioning.expected.expected_presample`); the partitioner, the split
statistics and the feature cache read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from gsplit.data.graph import Graph, as_vertex_ids
from gsplit.runtime.io import load_npy, read_meta, write_array_dir


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
            >>> from gsplit.partitioning.presample import presample
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
            >>> from gsplit.partitioning.presample import presample
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
