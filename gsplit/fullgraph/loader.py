"""Full-graph training, split-parallel: one mini-batch whose targets are all vertices, built once.

A full-graph epoch computes every layer for every vertex over all its in-edges (as DGL's and PyG's
full-batch GCN examples do on one GPU) and takes the loss over the training vertices. Split across
ranks, it is one split mini-batch: rank ``r`` computes every layer for the vertices the partition map
gives it (its *owned* vertices), from the rows of its owned vertices plus the *halo* (remote in-neighbours
of owned vertices) that one shuffle per layer brings. The block of every layer has the same structure
(destinations: the owned vertices, sorted; sources: owned vertices then the halo; edges: every in-edge
of an owned vertex), so it is built once with the split sampler (:func:`gsplit.sp_sample` with
``NeighborSampler([-1])``, as :func:`gsplit.layerwise_inference` does per chunk) and shared by every
layer and every epoch: no sampling per epoch.

:class:`FullGraphLoader` yields that one :class:`~gsplit.MiniBatch` per epoch, with the same
``(input_nodes, output_nodes, blocks)`` triple, shuffle plans and group binding as
:class:`gsplit.DataLoader`, so the unchanged models (``gsplit.nn.SAGE``/``GAT``/``GCN``, a DGL-style
model under :class:`gsplit.SplitParallel`, PyG layers through ``BlockConv``) train on it.

**The loss** counts the training vertices only, averaged over the *global* training set: the top
block's labels of non-training vertices are ``-100`` (``IGNORE_INDEX``, the default ``ignore_index``
of ``torch.nn.functional.cross_entropy``), ``blocks[-1].global_num_dst`` is the global number of
training vertices (what :func:`gsplit.split_cross_entropy` divides by) and ``blocks[-1].num_loss_rows``
the rank's own (what :class:`gsplit.SplitParallel` scales a rank's mean loss by).

**Memory**: each rank keeps activations only for its owned vertices plus each layer's halo.
:func:`recompute_layers` trades compute for memory (each layer's aggregation is recomputed in backward
instead of stored); :func:`estimate_memory` says what a rank needs before anything is allocated, and
the loader refuses (:class:`FullGraphMemoryError`) a graph whose blocks and features cannot fit.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Dict, Iterator, List, Optional, Sequence, Union

import torch
from torch import nn

from gsplit.comm.communicator import Communicator, as_communicator, bind_group
from gsplit.comm.shuffle import shuffle_rows
from gsplit.data.finite import first_non_finite_row
from gsplit.fullgraph.overlap import OverlapPlan, boundary_first, build_overlap_plan, overlapped_forward
from gsplit.data.graph import Graph, as_vertex_ids
from gsplit.minibatch.rank_loader import IterationStats
from gsplit.ops import aggregate
from gsplit.partitioning.partition_map import owner_tensor
from gsplit.partitioning.stats import FullGraphStats, full_graph_stats
from gsplit.sampling.block import Block, MiniBatch
from gsplit.sampling.neighbor import NeighborSampler
from gsplit.split.split_sampling import sp_sample

log = logging.getLogger(__name__)

__all__ = ["FullGraphLoader", "FullGraph", "FullGraphMemoryError", "MemoryEstimate", "IGNORE_INDEX",
           "estimate_memory", "layer_dims", "check_split_safe", "recompute_layers", "available_memory"]

IGNORE_INDEX = -100
"""Label of a vertex outside the training set on the top block: ``F.cross_entropy``'s default ``ignore_index``."""


class FullGraphMemoryError(MemoryError):
    """Full-graph training of this graph (or model) would not fit the memory a rank has."""


# ---------------------------------------------------------------------------------------------- memory
@dataclass
class MemoryEstimate:
    """Bytes one rank needs for full-graph training, by kind (an estimate made before allocating)."""

    structure: int
    """The blocks: edge lists (shared by all layers), source ids and the shuffle plan."""
    features: int
    """Input-feature rows of the first block (owned vertices plus halo)."""
    activations: int
    """Tensors kept for backward over all layers (with ``recompute``: each layer's input rows only)."""
    transient: int
    """The largest per-layer working set that is freed again: one layer's per-edge messages (where the
    aggregation gathers them: on a GPU, or on a CPU without the compiled kernel, so an upper bound
    there), its shuffle buffers, and the gradient rows of backward."""

    @property
    def total(self) -> int:
        return self.structure + self.features + self.activations + self.transient

    def describe(self) -> str:
        gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
        return (f"{gib(self.total)} (blocks {gib(self.structure)}, features {gib(self.features)}, "
                f"activations {gib(self.activations)}, per-layer working set {gib(self.transient)})")


def layer_dims(model) -> List[tuple]:
    """``(in_width, out_width, heads, attention)`` of every layer of ``model.layers`` (gsplit's layers,
    ``BlockConv`` and any layer with ``in_feats``/``out_feats`` attributes); ``None`` widths when a layer
    does not say. ``attention``: the layer keeps per-edge values (GAT's scores). A layer that keeps more
    than its convolution (a deep model's :class:`gsplit.nn.ResPlusLayer`: pre-activation rows of every
    source, the head's rows) gets a fifth entry, ``(values per source, values per destination)`` it keeps.

    Example:
        >>> import gsplit
        >>> layer_dims(gsplit.nn.GAT(10, 8, 3, num_layers=2, heads=2))
        [(10, 8, 2, True), (8, 3, 1, True)]
    """
    layers = getattr(model, "layers", None)
    if layers is None:
        return []
    dims = []
    for layer in layers:
        inner = getattr(layer, "conv", layer)  # BlockConv wraps a PyG layer, ResPlusLayer a gsplit one
        outer = layer if isinstance(getattr(layer, "in_feats", None), int) else inner  # ResPlusLayer's own widths
        d_in = getattr(outer, "in_feats", getattr(inner, "in_channels", None))
        d_out = getattr(outer, "out_feats", getattr(inner, "out_channels", None))
        heads = int(getattr(inner, "num_heads", getattr(inner, "heads", 1)) or 1)
        attention = hasattr(inner, "attn_l") or hasattr(inner, "att_src")
        d_in = d_in if isinstance(d_in, int) else None
        d_out = d_out if isinstance(d_out, int) else None
        dim = (d_in, None if d_out is None else d_out * (heads if outer is inner else 1), heads, attention)
        extra = getattr(layer, "saved_values", None)
        dims.append(dim + (tuple(extra),) if extra is not None else dim)
    return dims


# Tensors a layer keeps for backward, in rows of its output width per destination: the pre-activation,
# the activation and the dropout output of ``between`` plus the layer's own intermediates (measured with
# torch.autograd.graph.saved_tensors_hooks on gsplit's SAGE, GCN and GAT; tests/fullgraph/test_full_graph.py checks
# that the estimate stays within a factor 2 of the measured bytes).
_SAVED_OUT_ROWS = 4
_SAVED_EDGE_VALUES_PER_HEAD = 3  # attention layers: scores, softmax and messages per edge and head


def estimate_memory(stats: FullGraphStats, rank: int, feat_dim: int, dims: Sequence[tuple] = (),
                    dtype_bytes: int = 4, recompute: bool = False, fused_attention: bool = False,
                    feature_bytes: Optional[int] = None) -> MemoryEstimate:
    """What rank ``rank`` needs for full-graph training on the map measured by ``stats``.

    ``dims`` are the model's ``(in, out, heads, attention)`` per layer (:func:`layer_dims`; empty: blocks
    and features only). ``recompute`` estimates :func:`recompute_layers`: per layer only its input rows
    are kept, and one layer's intermediates exist at a time in backward. The first layer's input rows
    are the features (counted once, in ``features``); the input features need no gradient.
    ``fused_attention``: attention layers run the compiled fused kernel (CPU with the extension built),
    which keeps no per-edge message rows for backward; the gather/scatter path (GPU, or CPU without the
    kernel) keeps one per edge, so the default (``False``) counts them. ``feature_bytes``: bytes per stored
    feature value (2 for bfloat16/float16 features; default ``dtype_bytes``); narrower features than the
    model's dtype are upcast at the first layer, whose copy (``dtype_bytes`` per value) is kept for backward.

    Example:
        >>> import gsplit
        >>> g = gsplit.Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> s = gsplit.partitioning.stats.full_graph_stats(g, torch.tensor([0, 0, 1, 1]), 2)
        >>> estimate_memory(s, 0, feat_dim=16).features        # (2 owned + 2 halo rows) x 16 floats x 4 bytes
        256
    """
    owned = int(stats.vertices[rank])
    rows = owned + int(stats.halo_rows[rank])
    edges = int(stats.in_edges[rank])
    sent = int(stats.sent_rows[rank]) + owned
    structure = 8 * (3 * edges + rows + rows + sent) + 8 * (owned + rows)  # edges, src ids, plan, masks/labels
    feature_bytes = dtype_bytes if feature_bytes is None else int(feature_bytes)
    features = rows * int(feat_dim) * feature_bytes
    # half-precision features: the first layer's upcast copy of them (model_input), kept for backward
    kept, peak_layer, grad_rows = (rows * int(feat_dim) * dtype_bytes if feature_bytes < dtype_bytes and dims else 0), 0, 0
    # one rank's shuffles are the identity (ShuffleIndex.identity): a layer's input rows are the previous
    # layer's output rows, counted with it, and no buffer is made
    shuffled = len(stats.vertices) > 1
    for i, dim in enumerate(dims):
        d_in, d_out, heads = dim[:3]
        attention = bool(dim[3]) if len(dim) > 3 else heads > 1
        d_in = int(d_in or feat_dim)
        d_out = int(d_out or d_in)
        inputs = rows * d_in * dtype_bytes if i > 0 and shuffled else 0  # layer 0 reads the features
        per_src, per_dst = dim[4] if len(dim) > 4 else (0, 0)  # a residual layer's pre-activation and head
        inner = (_SAVED_OUT_ROWS * owned * d_out + rows * per_src + owned * per_dst
                 + (_SAVED_EDGE_VALUES_PER_HEAD * edges * heads if attention else 0)) * dtype_bytes
        shuffle_buffers = 2 * sent * d_in * dtype_bytes if i > 0 and shuffled else 0
        # one message row per edge where aggregation gathers and scatters (GPU, or CPU without the compiled
        # kernel); SAGE and GCN aggregate at the narrower width, GAT at its output width
        messages = edges * (d_out if attention else min(d_in, d_out)) * dtype_bytes
        if i > 0:  # backward: the gradient of this layer's input rows and of the previous layer's output rows
            grad_rows = max(grad_rows, (rows + owned) * d_in * dtype_bytes)
        if attention and not fused_attention:  # the weighted sum's backward needs the per-edge messages
            inner += messages
        if recompute:
            kept += inputs + owned * d_out * dtype_bytes
            peak_layer = max(peak_layer, inner + shuffle_buffers + messages)
        else:
            kept += inputs + inner
            peak_layer = max(peak_layer, shuffle_buffers + messages)
    return MemoryEstimate(structure=structure, features=features, activations=kept, transient=peak_layer + grad_rows)


def available_memory(device: Union[str, torch.device, None], ranks_sharing: int = 1) -> Optional[int]:
    """Free bytes for one rank: the GPU's free memory, or the host's available memory shared by
    ``ranks_sharing`` CPU ranks; ``None`` when it cannot be known."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // max(int(ranks_sharing), 1)
    except OSError:
        return None
    return None


def _check_fits(estimate: MemoryEstimate, limit: Optional[int], what: str) -> None:
    if limit is not None and estimate.total > limit:
        raise FullGraphMemoryError(
            f"full-graph training of {what} needs about {estimate.describe()} on this rank, but only "
            f"{limit / 2**30:.2f} GiB are available; use more ranks (a map with more parts), "
            "recompute_layers(model) (gsplit train --recompute), a smaller hidden size or float32, or "
            "mini-batch training (gsplit.DataLoader)")


# ---------------------------------------------------------------------------------------------- models
def check_split_safe(model: nn.Module) -> None:
    """Raise ``ValueError`` for a layer whose result on a rank's rows differs from single-process training.

    Refused: batch normalisation (its statistics would cover one rank's rows, not all vertices),
    ``GraphConv(norm="both"/"left")`` and PyG layers that normalise by whole-graph degrees (see
    :class:`gsplit.interop.pyg.BlockConv`). ``torch.nn.Dropout`` draws masks from each process's random
    state: allowed, with a warning that training is then not bit-for-bit single-process training
    (gsplit's models use :func:`gsplit.nn.vertex_dropout`, which is).

    Example:
        >>> check_split_safe(torch.nn.Sequential(torch.nn.BatchNorm1d(4)))
        Traceback (most recent call last):
        ...
        ValueError: layer '0' (BatchNorm1d) normalises with statistics over the rows it is given; on a rank those are its own vertices only, so split training is not the single-process model: remove it or use LayerNorm (per row)
    """
    from gsplit.interop.pyg import _whole_batch_reason
    from gsplit.nn.layers import GraphConv

    for name, module in model.named_modules():
        kind = type(module).__name__
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(f"layer {name!r} ({kind}) normalises with statistics over the rows it is given; on a "
                             "rank those are its own vertices only, so split training is not the single-process "
                             "model: remove it or use LayerNorm (per row)")
        if isinstance(module, GraphConv) and module.norm in ("both", "left"):
            raise ValueError(f"layer {name!r} is GraphConv(norm={module.norm!r}), which needs each source's "
                             "out-degree over all ranks' edges; use norm='right' or 'none' (gsplit.nn.GCN does)")
        reason = _whole_batch_reason(module)
        if reason is not None:
            raise ValueError(f"layer {name!r}: {reason}, so it is not split-safe; use normalize=False with a mean "
                             "aggregation or another layer (SAGEConv, GATConv(add_self_loops=False), GraphConv)")
        if isinstance(module, nn.Dropout) and module.p > 0:
            log.warning("layer %r is torch.nn.Dropout(p=%s): its masks come from each rank's random state, so "
                        "training is not bit-for-bit single-process training; gsplit.nn.vertex_dropout is", name,
                        module.p)


def recompute_layers(model: nn.Module) -> nn.Module:
    """Recompute every layer of ``model.layers`` in backward instead of keeping its intermediates.

    Each layer then keeps only its input rows (owned vertices plus halo) for backward; its messages,
    attention and aggregation are computed again when backward reaches it
    (``torch.utils.checkpoint``, non-reentrant, random state preserved). Shuffles run outside the
    recomputed part, so backward sends nothing more. Changes the layers in place (``state_dict`` is
    unchanged) and returns ``model``; calling it twice changes nothing more.

    Example:
        >>> import gsplit
        >>> model = recompute_layers(gsplit.nn.SAGE(4, 8, 2, num_layers=2))
        >>> all(getattr(layer, "_gsplit_recompute", False) for layer in model.layers)
        True
    """
    from torch.utils.checkpoint import checkpoint

    layers = getattr(model, "layers", None)
    if layers is None or len(layers) == 0:
        raise TypeError(f"recompute_layers needs the model's layers as `model.layers` (a list of modules called "
                        f"as layer(block, h)); {type(model).__name__} has none")
    for layer in layers:
        if getattr(layer, "_gsplit_recompute", False):
            continue
        inner = layer.forward

        def forward(block, h, *args, _inner=inner, **kwargs):
            if not torch.is_grad_enabled():
                return _inner(block, h, *args, **kwargs)
            return checkpoint(_inner, block, h, *args, use_reentrant=False, **kwargs)

        layer.forward = forward
        layer._gsplit_recompute = True
    return model


# ---------------------------------------------------------------------------------------------- blocks
@dataclass
class FullGraph:
    """One rank's share of the whole graph, built once: one block per layer, input features attached."""

    nodes: torch.Tensor
    """int64 sorted global ids of the vertices this rank owns: every block's ``dst_nodes`` and the rows
    of every layer's output (the local frontier of every level)."""
    blocks: List[Block]
    """One block per layer (index 0 = input layer), sharing one edge list; no labels attached."""
    num_nodes: int
    """Vertices of the whole graph."""
    world_size: int
    """Ranks the graph is split over."""
    stats: FullGraphStats
    """Cut edges, halo rows and balance of the map (every rank's)."""
    build_s: float = 0.0
    """Seconds spent building the blocks and loading the features."""
    traffic: Dict[str, dict] = field(default_factory=dict)
    """What building sent (id exchange, feature shuffle), as ``TrafficCounter.snapshot()``."""
    overlap_plan: Optional[OverlapPlan] = None
    """With ``overlap=True``: the boundary/interior blocks of :func:`gsplit.fullgraph.overlap.overlapped_forward`
    (the owned vertices are then ordered boundary first in ``nodes`` and every block)."""


def _build(graph: Graph, owner: torch.Tensor, num_layers: int, comm: Communicator, device: torch.device,
           features: Optional[torch.Tensor], feat_key: str, stats: FullGraphStats, overlap: bool = False) -> FullGraph:
    t0 = time.perf_counter()
    before = comm.traffic.snapshot()
    seeds = torch.arange(graph.num_nodes, device=graph.device)
    # One split layer over all in-edges of all vertices: this rank's block and its shuffle plan.
    batch = sp_sample(graph, seeds, owner.to(graph.device), NeighborSampler([-1]), comm)
    base = batch.blocks[0]
    nodes = batch.input_nodes
    # Every owned vertex is a destination of its own block, so the next level's local frontier is exactly
    # the owned vertices, sorted, in the order of the block's destinations: one plan serves every layer.
    if not torch.equal(nodes, base.dst_nodes):
        raise RuntimeError("internal error: the full-graph block's destinations are not the rank's local frontier")
    base = base.to(device)
    num_boundary = None
    if overlap:  # boundary vertices first, so that their rows can be computed and sent first
        base, num_boundary = boundary_first(base, comm.rank)
    nodes = base.dst_nodes
    blocks = [replace(base, layer=i, shuffle_index=replace(base.shuffle_index, tag=f"shuffle/layer{i}"),
                      srcdata={}, dstdata={}, global_num_dst=None) for i in range(num_layers)]
    if features is not None:
        local = features[nodes.to(features.device)].to(device)
        blocks[0].srcdata[feat_key] = shuffle_rows(local, blocks[0].shuffle_index, comm)
        del local
    traffic = {kind: {tag: n - before[kind].get(tag, 0) for tag, n in now.items() if n != before[kind].get(tag, 0)}
               for kind, now in comm.traffic.snapshot().items()}
    plan = build_overlap_plan(blocks, comm.rank, num_boundary) if overlap else None
    return FullGraph(nodes=nodes, blocks=blocks, num_nodes=graph.num_nodes, world_size=comm.world_size,
                     stats=stats, build_s=time.perf_counter() - t0, traffic=traffic, overlap_plan=plan)


class FullGraphLoader:
    """Full-graph training, split-parallel: yields one :class:`~gsplit.MiniBatch` per epoch, built once.

    Args:
        graph: the full graph (every rank holds it).
        num_layers: layers of the model (one block per layer).
        partition: a :class:`gsplit.PartitionMap` with one part per rank (or an owner tensor); optional at
            world size 1. ``gsplit prepare --full-graph`` (:func:`gsplit.partition_full_graph`) makes one
            that balances in-edges and vertices and minimises cut edges; any map gives the same result.
        features: ``[num_nodes, dim]`` host (or device) tensor, landing in ``blocks[0].srcdata["feat"]``;
            or another full-graph loader's ``feature_store`` (a :class:`FullGraph`) to share its blocks.
        labels: ``[num_nodes]`` int64 classes; ``blocks[-1].dstdata["label"]`` holds the owned vertices'
            labels with ``IGNORE_INDEX`` (-100) for every vertex outside ``train_idx``, and
            ``blocks[-1].dstdata["train_mask"]`` marks the training vertices.
        train_idx: the vertices whose loss counts (ids or a boolean mask); default every vertex with a
            label ``>= 0``. ``blocks[-1].global_num_dst`` is their number over all ranks (the loss
            denominator) and ``blocks[-1].num_loss_rows`` this rank's.
        group: the ``torch.distributed`` process group (default: the default group if initialised), or
            a :class:`gsplit.Communicator`.
        device: where blocks, features and labels are delivered (default CPU).
        memory_limit: bytes this rank may use for the blocks and features; ``"auto"`` (default): the
            GPU's free memory, or the host's available memory divided among the ranks; ``None``: no check.
            Checked before anything is allocated (:class:`FullGraphMemoryError`); call
            :meth:`check_model` to check a model's activations too.
        overlap: order each rank's vertices boundary first (those other ranks read) and build the plan of
            :meth:`forward`, which computes the boundary rows first and sends them while the interior
            rows compute (G3's order; backward likewise). ``model(blocks, x)`` still works on the blocks.

    Every epoch yields the same batch: ``input_nodes`` and ``output_nodes`` are the rank's owned
    vertices, ``blocks[i]`` computes layer ``i`` for them over all their in-edges. ``len(loader) == 1``.

    Example:
        >>> import gsplit, torch.nn.functional as F
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=0)
        >>> loader = gsplit.FullGraphLoader(ds.graph, num_layers=2, features=ds.features, labels=ds.labels,
        ...                                 train_idx=ds.train_idx)
        >>> model = gsplit.nn.SAGE(ds.feature_dim, 16, ds.num_classes, num_layers=2)
        >>> opt = torch.optim.Adam(model.parameters(), lr=0.01)
        >>> for epoch in range(2):
        ...     for input_nodes, output_nodes, blocks in loader:
        ...         logits = model(blocks, blocks[0].srcdata["feat"])
        ...         loss = gsplit.split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
        ...         opt.zero_grad(); loss.backward(); opt.step()
        >>> logits.shape[0] == 300, blocks[-1].global_num_dst == ds.train_idx.numel()
        (True, True)
    """

    def __init__(self, graph: Graph, num_layers: int, *, partition=None, features=None, labels=None,
                 train_idx=None, group=None, device: Union[str, torch.device, None] = None,
                 memory_limit: Union[str, int, None] = "auto", feat_key: str = "feat", label_key: str = "label",
                 overlap: bool = False):
        self._skip = False
        if int(num_layers) < 1:
            raise ValueError(f"num_layers={num_layers}; pass the number of layers of the model (at least 1)")
        self.graph = graph
        self.num_layers = int(num_layers)
        self.comm = as_communicator(group)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.owner = owner_tensor(partition, graph, self.comm.world_size)
        self.feat_key, self.label_key = feat_key, label_key
        self._epoch = 0
        self.last_stats = IterationStats()
        self._first = True
        # bytes this rank may use (None: unchecked); the constructor and check_model compare estimates with it
        self.memory_limit = self._limit(memory_limit)
        if isinstance(features, FullGraph):
            full = features
            if full.num_nodes != graph.num_nodes or full.world_size != self.comm.world_size or \
                    len(full.blocks) != self.num_layers:
                raise ValueError(f"features is a FullGraph of {full.num_nodes} vertices, {full.world_size} ranks and "
                                 f"{len(full.blocks)} layers, but this loader has {graph.num_nodes}, "
                                 f"{self.comm.world_size} and {self.num_layers}; share one only between loaders of "
                                 "the same graph, group and model depth")
            self._first = False  # built (and counted) by the loader that made it
        else:
            if features is not None:
                if features.dim() != 2 or features.shape[0] != graph.num_nodes:
                    raise ValueError(f"features has shape {tuple(features.shape)} but the graph has {graph.num_nodes} "
                                     "vertices; pass one feature row per vertex")
                bad = first_non_finite_row(features) if features.dtype.is_floating_point else None
                if bad is not None:  # checked in chunks: no full-size temporary (issue 18)
                    raise ValueError(f"features hold NaN or inf (row {bad}); clean the features before training")
            stats = full_graph_stats(graph, self.owner, self.comm.world_size)
            need = estimate_memory(stats, self.comm.rank, 0 if features is None else features.shape[1],
                                   dtype_bytes=4 if features is None else features.element_size())
            _check_fits(need, self.memory_limit, f"this graph ({graph.num_nodes} vertices, {graph.num_edges} edges)")
            full = _build(graph, self.owner, self.num_layers, self.comm, self.device, features, feat_key, stats,
                          overlap)
            log.info("full graph built in %.2fs: rank %d owns %d vertices, %d in-edges, %d halo rows",
                     full.build_s, self.comm.rank, full.nodes.numel(), full.blocks[0].num_edges(),
                     full.blocks[0].num_src_nodes() - full.nodes.numel())
        self.full_graph = full
        self.blocks = self._with_labels(full, labels, train_idx)

    def _limit(self, memory_limit) -> Optional[int]:
        if memory_limit == "auto":
            return available_memory(self.device, self.comm.world_size if self.device.type == "cpu" else 1)
        if memory_limit is None:
            return None
        if isinstance(memory_limit, str):
            from gsplit.data.feature_store import parse_size
            return parse_size(memory_limit, "memory_limit")
        return int(memory_limit)

    def _with_labels(self, full: FullGraph, labels, train_idx) -> List[Block]:
        """The blocks of this loader: the shared lower blocks and a top block with its own targets."""
        n = self.graph.num_nodes
        if train_idx is None:
            if labels is None:
                train = torch.ones(n, dtype=torch.bool)
            else:
                train = torch.as_tensor(labels).cpu() >= 0
        else:
            train = torch.zeros(n, dtype=torch.bool)
            train[as_vertex_ids(train_idx, n, "train_idx", unique=True)] = True
        nodes_cpu = full.nodes.cpu()
        mask = train[nodes_cpu]
        top = replace(full.blocks[-1], dstdata={"train_mask": mask.to(self.device)},
                      global_num_dst=int(train.sum()), num_loss_rows=int(mask.sum()))
        if labels is not None:
            labels = torch.as_tensor(labels)
            if labels.dim() != 1 or labels.shape[0] != n:
                raise ValueError(f"labels has shape {tuple(labels.shape)} but the graph has {n} vertices; "
                                 "pass one label per vertex")
            if labels.dtype.is_floating_point:
                raise TypeError(f"labels must be integer classes, got {labels.dtype}")
            bad = train & (labels.cpu() < 0)
            if bool(bad.any()):
                raise ValueError(f"training vertex {int(bad.nonzero()[0])} has label {int(labels[bad.nonzero()[0]])}; "
                                 "every training vertex needs a class >= 0")
            own = labels[nodes_cpu.to(labels.device)].to(torch.int64).cpu()
            own = torch.where(mask, own, torch.full_like(own, IGNORE_INDEX))
            top.dstdata[self.label_key] = own.to(self.device)
        return full.blocks[:-1] + [top]

    # ------------------------------------------------------------------ the DataLoader protocol
    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def feature_store(self) -> FullGraph:
        """The built :class:`FullGraph`; pass it as another loader's ``features=`` to share the blocks (the
        training harness's evaluation loaders do, as they share a :class:`gsplit.DataLoader`'s feature store)."""
        return self.full_graph

    @property
    def stats(self) -> FullGraphStats:
        """Cut edges, halo rows per rank and balance of this split."""
        return self.full_graph.stats

    def set_epoch(self, epoch: int, start_iteration: int = 0) -> None:
        """As :meth:`gsplit.DataLoader.set_epoch`; an epoch has one iteration, so ``start_iteration`` 1 skips it."""
        if start_iteration not in (0, 1):
            raise ValueError(f"start_iteration={start_iteration}; a full-graph epoch has one iteration (0)")
        self._epoch = int(epoch)
        self._skip = start_iteration == 1

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[MiniBatch]:
        if self._skip:
            self._skip = False
            return
        batch = MiniBatch(self.full_graph.nodes, self.blocks[-1].dst_nodes, self.blocks)
        bind_group(batch.blocks, self.comm)
        # The blocks were built (and the features loaded) once, by the constructor: an epoch samples and loads
        # nothing, so its seconds are 0 and the build's are the loader's (``full_graph.build_s``), not the
        # first epoch's, whose total does not cover them (issue 31: "time 0.15s (sample 23.01 ...)").
        self.last_stats = IterationStats.of_batch(batch, 0.0, 0.0)
        if not self._first:
            self.last_stats.input_rows = 0  # the rows loaded by the build count once, with the first epoch
        self._first = False
        self._epoch += 1
        yield batch

    def forward(self, model: nn.Module, x: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``model``'s output over this rank's vertices, boundary rows first with their shuffle overlapped
        (needs ``overlap=True``; the model follows :mod:`gsplit.minibatch.inference`'s protocol, as gsplit's do).
        Equals ``model(blocks, blocks[0].srcdata["feat"])``; ``x`` replaces the input rows.

        Example:
            >>> logits = loader.forward(model)       # instead of model(blocks, blocks[0].srcdata["feat"])  # doctest: +SKIP
        """
        plan = self.full_graph.overlap_plan
        if plan is None:
            raise ValueError("loader.forward needs the boundary-first plan; build the loader with overlap=True "
                             "(or call model(blocks, x) for the plain forward)")
        if x is None:
            x = self.blocks[0].srcdata[self.feat_key]
        return overlapped_forward(model, plan, x, self.comm)

    # ------------------------------------------------------------------ checks
    def estimate_memory(self, model: Optional[nn.Module] = None, recompute: Optional[bool] = None,
                        dtype_bytes: Optional[int] = None) -> MemoryEstimate:
        """This rank's memory for training ``model`` on this loader (see :func:`estimate_memory`).

        ``recompute`` defaults to whether :func:`recompute_layers` was applied to ``model``.
        """
        feats = self.full_graph.blocks[0].srcdata.get(self.feat_key)
        feat_dim = 0 if feats is None else int(feats.shape[1])
        if dtype_bytes is None:
            params = list(model.parameters()) if model is not None else []
            dtype_bytes = params[0].element_size() if params else (4 if feats is None else feats.element_size())
        dims = layer_dims(model) if model is not None else []
        if recompute is None:
            recompute = model is not None and all(getattr(l, "_gsplit_recompute", False)
                                                  for l in getattr(model, "layers", []))
        fused = self.device.type == "cpu" and aggregate.extension_available()
        return estimate_memory(self.stats, self.rank, feat_dim, dims, dtype_bytes, recompute, fused,
                               feature_bytes=None if feats is None else feats.element_size())

    def check_model(self, model: nn.Module) -> MemoryEstimate:
        """Before the first forward: refuse a layer that is not split-safe (:func:`check_split_safe`), a
        model whose depth is not the loader's, and a model whose activations would not fit
        (:class:`FullGraphMemoryError`, saying how much it needs). Returns the estimate."""
        check_split_safe(model)
        layers = getattr(model, "layers", None)
        if layers is not None and len(layers) != self.num_layers:
            raise ValueError(f"the model has {len(layers)} layers but the loader was built for {self.num_layers}; "
                             f"pass num_layers={len(layers)}")
        need = self.estimate_memory(model)
        _check_fits(need, self.memory_limit, f"this model on this graph ({self.graph.num_nodes} vertices)")
        log.info("full-graph memory estimate of rank %d: %s", self.rank, need.describe())
        return need
