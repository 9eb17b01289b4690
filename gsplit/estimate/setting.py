"""One training setting estimated end to end: graph, map, work of both systems, time and memory per GPU.

:func:`estimate_setting` is what ``gsplit estimate`` and ``experiments/paper_setting.py`` run. A graph given
only by its shape (:data:`SHAPES`, or a vertex count and degree) is generated as gsplit's synthetic power-law
graph with that average degree at a size this machine samples in seconds (``sample_nodes``); the epoch's
iteration count and the graph's memory come from the full-size shape.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from gsplit.estimate.links import LinkProfile
from gsplit.estimate.model import FLOAT_BYTES, DeviceProfile, ModelShape, Prediction, predict
from gsplit.estimate.work import IterationWork, count_work
from gsplit.fullgraph.loader import _SAVED_EDGE_VALUES_PER_HEAD, _SAVED_OUT_ROWS
from gsplit.data.graph import Graph
from gsplit.sampling.neighbor import NeighborSampler


@dataclass(frozen=True)
class GraphShape:
    """A graph known by its published size (the OGB leaderboard's figures)."""

    name: str
    """E.g. ``ogbn-products``."""
    num_nodes: int
    """Vertices."""
    num_edges: int
    """Directed in-edges as gsplit stores the graph (undirected edges counted both ways)."""
    feat_dim: int
    """Feature width."""
    num_classes: int
    """Classes."""
    train: int
    """Training vertices."""

    @property
    def avg_degree(self) -> float:
        return self.num_edges / self.num_nodes


SHAPES: Dict[str, GraphShape] = {
    # ogb.stanford.edu/docs/nodeprop: 2,449,029 nodes, 61,859,140 undirected edges, 100-d, 47 classes, 196,615 train
    "ogbn-products": GraphShape("ogbn-products", 2_449_029, 2 * 61_859_140, 100, 47, 196_615),
    # 111,059,956 nodes, 1,615,685,872 directed citations (gsplit's OGB loader symmetrises them), 128-d, 172
    # classes, 1,207,179 train
    "ogbn-papers100M": GraphShape("ogbn-papers100M", 111_059_956, 2 * 1_615_685_872, 128, 172, 1_207_179),
}
"""The paper's graphs by their published sizes."""


def shaped_graph(shape: GraphShape, sample_nodes: int, seed: int = 0, min_train: int = 0):
    """``(graph, train_idx)``: gsplit's synthetic power-law graph with ``shape``'s average degree and training
    fraction, ``min(shape.num_nodes, sample_nodes)`` vertices; at least ``min_train`` training vertices (a scaled
    down graph with a small training share, such as Papers100M's 1 %, would not fill the mini-batches to count:
    the targets are then a larger random share, which changes no neighbourhood).

    Example:
        >>> g, train = shaped_graph(GraphShape("toy", 10_000, 100_000, 16, 4, 1_000), sample_nodes=2_000)
        >>> g.num_nodes, train.numel()
        (2000, 200)
    """
    from gsplit.datasets.synthetic import synthetic_graph

    n = int(min(shape.num_nodes, sample_nodes))
    graph, _ = synthetic_graph(n, avg_degree=shape.avg_degree, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    count = min(n, max(1, round(n * shape.train / shape.num_nodes), int(min_train)))
    train = torch.randperm(n, generator=gen)[:count].sort().values
    return graph, train


@dataclass
class MemoryPerGPU:
    """Bytes one GPU holds in an iteration (the largest rank), by kind."""

    graph: int
    """The graph's CSC on every GPU (``gsplit train`` copies it unless ``--uva``); 0 with UVA."""
    features: int
    """Input-feature rows of the iteration."""
    activations: int
    """Tensors kept for backward (the model's own factors: :mod:`gsplit.fullgraph.loader`'s memory estimate)."""
    transient: int
    """Largest per-layer working set (per-edge messages, shuffle buffers)."""
    parameters: int
    """Weights, gradients and Adam's two moments."""

    @property
    def total(self) -> int:
        return self.graph + self.features + self.activations + self.transient + self.parameters


def memory_per_gpu(works: Sequence[IterationWork], shape: ModelShape, graph_bytes: int) -> MemoryPerGPU:
    """The largest rank's memory over ``works`` (one system), the graph counted as ``graph_bytes``.

    Example:
        >>> from gsplit.estimate.work import LayerWork
        >>> w = IterationWork("dp", 1, [LayerWork([10], [2], [5], [0], [0])], input_rows=[5], targets=[2])
        >>> memory_per_gpu([w], ModelShape("sage", 4, 4, 2, 1), graph_bytes=0).features
        80
    """
    dims = shape.dims()
    attention = shape.model == "gat"
    best = None
    for work in works:
        for r in range(work.world_size):
            feats = work.input_rows[r] * shape.feat_dim * shape.feature_bytes
            # half-precision features: the first layer's float32 copy of them (model_input), kept for backward
            kept, peak = (work.input_rows[r] * shape.feat_dim if shape.feature_bytes < FLOAT_BYTES else 0), 0
            for li, layer in enumerate(work.layers):
                i, o, heads = dims[li]
                e, d, s = layer.edges[r], layer.dst[r], layer.src[r]
                kept += (0 if li == 0 else s * i) + _SAVED_OUT_ROWS * d * o
                messages = e * (o if attention else min(i, o))
                if attention:
                    kept += _SAVED_EDGE_VALUES_PER_HEAD * e * heads + messages
                shuffle = 2 * (layer.recv_rows[r] + layer.send_rows[r]) * i
                peak = max(peak, messages + shuffle)
            m = MemoryPerGPU(graph=int(graph_bytes), features=feats, activations=kept * FLOAT_BYTES,
                             transient=peak * FLOAT_BYTES, parameters=4 * shape.parameters() * FLOAT_BYTES)
            if best is None or m.total > best.total:
                best = m
    return best


@dataclass
class SettingEstimate:
    """Both systems in one setting."""

    gpus: int
    """Ranks (GPUs)."""
    device: str
    """Device profile name."""
    link: str
    """Link name."""
    shape: ModelShape
    """The model."""
    iterations_per_epoch: int
    """Iterations of a full epoch (full-size training set / (batch x GPUs))."""
    predictions: Dict[str, Prediction]
    """``split`` and ``dp``."""
    memory: Dict[str, MemoryPerGPU]
    """``split`` and ``dp``."""
    counted: Dict[str, dict] = field(default_factory=dict)
    """Per system, mean counted work per iteration (edges, input rows, rows shuffled) over the iterations."""
    graph_info: dict = field(default_factory=dict)
    """What the work was counted on (vertices, edges, map, cross-edge fraction, seconds)."""

    def epoch_s(self, system: str) -> float:
        return self.predictions[system].epoch_s(self.iterations_per_epoch)

    def choice(self, margin: float = 0.05) -> str:
        """``split``, ``dp`` or ``either`` (within ``margin``)."""
        s, d = self.epoch_s("split"), self.epoch_s("dp")
        if abs(s - d) <= margin * min(s, d):
            return "either"
        return "split" if s < d else "dp"

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"gpus": self.gpus, "device": self.device, "link": self.link, "shape": asdict(self.shape),
                "iterations_per_epoch": self.iterations_per_epoch,
                "epoch_s": {k: self.epoch_s(k) for k in self.predictions},
                "predictions": {k: v.to_dict() for k, v in self.predictions.items()},
                "memory": {k: {**asdict(v), "total": v.total} for k, v in self.memory.items()},
                "choice": self.choice(), "counted": self.counted, "graph_info": self.graph_info}


def _counted(works: List[IterationWork]) -> dict:
    n = len(works)
    return {"edges": sum(w.total_edges for w in works) / n, "input_rows": sum(w.total_input_rows for w in works) / n,
            "rows_shuffled": sum(sum(sum(layer.recv_rows) for layer in w.layers) for w in works) / n}


def default_map(graph: Graph, train_idx: torch.Tensor, sampler: NeighborSampler, batch_size: int, parts: int,
                seed: int = 0) -> torch.Tensor:
    """gsplit's map (expected pre-sampling weights, weighted METIS), as ``gsplit prepare`` makes it."""
    from gsplit.partitioning.strategies import partition
    from gsplit.partitioning.presample import presample

    weights = presample(graph, train_idx, sampler, batch_size, seed=seed, num_parts=parts, method="expected")
    return partition(graph, parts, weights=weights, method="gsplit", seed=seed).assignment


@dataclass
class SettingWork:
    """Both systems' counted work in one setting (graph, map, batch, fanouts, GPUs): what every prediction of
    that setting, for any model, device or link, starts from."""

    gpus: int
    """Ranks (GPUs)."""
    works: Dict[str, List[IterationWork]]
    """``split`` and ``dp``: the counted iterations."""
    iterations_per_epoch: int
    """Iterations of a full epoch (full-size training set / (batch x GPUs))."""
    graph_bytes: int
    """The graph's CSC on each GPU."""
    info: dict = field(default_factory=dict)
    """What the work was counted on (vertices, edges, map, rows from other GPUs, seconds)."""


def setting_work(graph: Graph, train_idx: torch.Tensor, fanouts: Sequence[int], batch_size: int, gpus: int,
                 owner: Optional[torch.Tensor] = None, iterations: int = 4, seed: int = 0,
                 input_features: str = "shuffle", full_train: Optional[int] = None,
                 graph_bytes: Optional[int] = None) -> SettingWork:
    """Count both systems' work on ``graph`` for ``gpus`` ranks (see :func:`estimate_setting`)."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}; pass at least 1")
    sampler = NeighborSampler(list(fanouts), seed=seed)
    info = {"num_nodes": graph.num_nodes, "num_edges": graph.num_edges, "train": int(train_idx.numel())}
    t0 = time.perf_counter()
    if owner is None and gpus > 1:
        owner = default_map(graph, train_idx, sampler, batch_size, gpus, seed)
        info["map"] = "gsplit (expected weights), made here"
    elif owner is not None:
        info["map"] = "given"
        if owner.numel() != graph.num_nodes:
            raise ValueError(f"the partition map covers {owner.numel()} vertices but the graph has {graph.num_nodes}")
        if int(owner.max()) >= gpus:
            raise ValueError(f"the partition map has parts up to {int(owner.max())} but --gpus is {gpus}; "
                             f"use a map made for {gpus} GPUs (gsplit prepare --num-parts {gpus})")
    info["map_s"] = time.perf_counter() - t0
    available = -(-int(train_idx.numel()) // (batch_size * gpus))
    if available < 1:
        raise ValueError("the training set is empty")
    works = count_work(graph, train_idx, sampler, batch_size, gpus, owner, iterations=min(iterations, available),
                       seed=seed, input_features=input_features)
    # an iteration with a short global batch (the epoch's last) is not typical: keep the full ones when any
    full = batch_size * gpus
    for system, ws in works.items():
        whole = [w for w in ws if sum(w.targets) == full]
        works[system] = whole or ws
    if owner is not None and gpus > 1:
        info["rows_from_other_gpus_per_iteration"] = sum(
            sum(layer.recv_rows[r] for layer in w.layers for r in range(gpus)) for w in works["split"]) / len(works["split"])
    info["count_s"] = time.perf_counter() - t0 - info["map_s"]
    train_size = int(full_train if full_train is not None else train_idx.numel())
    gbytes = int(graph_bytes if graph_bytes is not None else 8 * (graph.num_nodes + 1 + graph.num_edges))
    return SettingWork(gpus=gpus, works=works, iterations_per_epoch=math.ceil(train_size / (batch_size * gpus)),
                       graph_bytes=gbytes, info=info)


def estimate_from_work(sw: SettingWork, shape: ModelShape, device: DeviceProfile, link: LinkProfile) -> SettingEstimate:
    """Predict both systems of a counted setting for one model, device and link."""
    if len(sw.works["split"][0].layers) != shape.num_layers:
        raise ValueError(f"{len(sw.works['split'][0].layers)} fanouts for a {shape.num_layers}-layer model; pass one "
                         "fanout per layer")
    return SettingEstimate(
        gpus=sw.gpus, device=device.name, link=link.name, shape=shape, iterations_per_epoch=sw.iterations_per_epoch,
        predictions={s: predict(w, shape, device, link) for s, w in sw.works.items()},
        memory={s: memory_per_gpu(w, shape, sw.graph_bytes) for s, w in sw.works.items()},
        counted={s: _counted(w) for s, w in sw.works.items()}, graph_info=sw.info)


def estimate_setting(graph: Graph, train_idx: torch.Tensor, shape: ModelShape, fanouts: Sequence[int], batch_size: int,
                     gpus: int, device: DeviceProfile, link: LinkProfile, owner: Optional[torch.Tensor] = None,
                     iterations: int = 4, seed: int = 0, input_features: str = "shuffle",
                     full_train: Optional[int] = None, graph_bytes: Optional[int] = None) -> SettingEstimate:
    """Count both systems' work on ``graph`` for ``gpus`` ranks and predict their iterations on ``device`` / ``link``.

    ``owner`` is the map (made with :func:`default_map` when ``None`` and ``gpus > 1``); ``full_train`` the
    training set of the full-size graph (default ``train_idx``'s size), which sets the iterations of an epoch;
    ``graph_bytes`` the graph's size on each GPU (default: ``graph``'s CSC).

    Example:
        >>> import gsplit
        >>> from gsplit.estimate import get_device, get_link
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=3000, seed=0)
        >>> est = estimate_setting(ds.graph, ds.train_idx, ModelShape("sage", 64, 32, 8, 2), [5, 5], 64, 2,
        ...                        get_device("h100"), get_link("nvlink4"), iterations=2)
        >>> sorted(est.predictions), est.choice() in ("split", "dp", "either")
        (['dp', 'split'], True)
    """
    if len(fanouts) != shape.num_layers:
        raise ValueError(f"{len(fanouts)} fanouts for a {shape.num_layers}-layer model; pass one fanout per layer")
    sw = setting_work(graph, train_idx, fanouts, batch_size, gpus, owner, iterations, seed, input_features, full_train,
                      graph_bytes)
    return estimate_from_work(sw, shape, device, link)
