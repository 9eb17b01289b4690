"""Cooperative batching (GraNNDis): full-graph training of a host's share in co-batches of target chunks.

When a host's share (one host: the whole graph; shared preloading: its inner vertices plus their halo) does
not fit its ranks' memory, the host trains it in ``N`` *co-batches*: its training vertices are cut into ``N``
chunks (in the order of an ``N``-way METIS map of the share, so that a chunk's vertices are close and its
dependency subgraph small), and each chunk is one split mini-batch with every in-edge
(``NeighborSampler([-1] * L)``, :func:`gsplit.sp_sample`): its L-hop dependency subgraph is fetched once per
host and split over the host's ranks by their map (*fetch-then-split*: each rank loads the input rows it owns
and the shuffles bring the rest, no row loaded twice), rather than each rank fetching the dependencies of its
own targets. The loss of a co-batch is its targets' cross-entropy divided by the training vertices of the
whole graph; the gradients of the ``N`` co-batches accumulate, and one optimiser step ends the epoch
(:attr:`CoBatchLoader.accumulates`), so an epoch equals one full-graph step (up to float rounding).

Only one co-batch's blocks, input rows and activations exist at a time. How many: :func:`choose_co_batches`
takes the fewest of 1, 2, 4, ... whose largest co-batch fits the memory budget by the project's full-graph
estimate (:func:`gsplit.fullgraph.estimate_memory` of the co-batch's dependency subgraph: an upper bound,
as a co-batch computes layer ``l`` only for the vertices within ``L - 1 - l`` hops of its targets).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Iterator, List, Optional, Sequence, Union

import torch

from gsplit.comm.communicator import as_communicator, bind_group
from gsplit.comm.shuffle import shuffle_rows
from gsplit.data.graph import Graph
from gsplit.fullgraph.hosts import host_subgraph
from gsplit.fullgraph.loader import FullGraphMemoryError, MemoryEstimate, check_split_safe, estimate_memory
from gsplit.fullgraph.loader import layer_dims  # noqa: F401 - full_graph_loader's example calls it
from gsplit.minibatch.rank_loader import IterationStats
from gsplit.partitioning.full_graph import partition_full_graph
from gsplit.partitioning.stats import full_graph_stats
from gsplit.sampling.block import MiniBatch
from gsplit.sampling.neighbor import NeighborSampler
from gsplit.split.split_sampling import sp_sample

log = logging.getLogger(__name__)

__all__ = ["CoBatchLoader", "CoBatchChoice", "CoBatchSource", "choose_co_batches", "co_batch_targets",
           "check_co_batches", "co_batch_estimate", "same_step", "full_graph_loader"]


def same_step(model, co_batch: int) -> None:
    """Before co-batch ``co_batch``'s forward: every co-batch of an epoch is one training step, so a model that
    counts its steps to key vertex dropout (gsplit's models) counts the epoch once, and each vertex draws the
    mask it draws in one full-graph forward. Call it before every co-batch's forward; nothing for other models.

    Example:
        >>> import gsplit
        >>> model = gsplit.nn.SAGE(4, 8, 2, num_layers=2)
        >>> model.step = 5; same_step(model, 1); model.step   # its forward counts the step again: 5
        4
    """
    if co_batch > 0 and isinstance(getattr(model, "step", None), int):
        model.step -= 1


def check_co_batches(num_co_batches, num_targets: int) -> int:
    """``num_co_batches`` as an int, refused below 1 or above the targets it splits.

    Example:
        >>> check_co_batches(4, 10)
        4
        >>> check_co_batches(0, 10)
        Traceback (most recent call last):
        ...
        ValueError: co_batches=0; pass at least 1 (1: the whole share at once), or leave it out for the automatic choice
    """
    n = int(num_co_batches)
    if n < 1:
        raise ValueError(f"co_batches={num_co_batches}; pass at least 1 (1: the whole share at once), or leave it out "
                         "for the automatic choice")
    if num_targets > 0 and n > num_targets:
        raise ValueError(f"co_batches={n} but there are only {num_targets} training vertices to cut into co-batches; "
                         f"pass at most {num_targets}")
    return n


def chunk_order(graph: Graph, num_co_batches: int, seed: int = 0) -> torch.Tensor:
    """A METIS part per vertex of ``graph`` whose order keeps a chunk's targets close (at most one part per 32
    vertices: parts of a few vertices buy no locality and cost METIS time)."""
    parts = max(1, min(int(num_co_batches), graph.num_nodes // 32))
    if parts == 1:
        return torch.zeros(graph.num_nodes, dtype=torch.int64)
    return partition_full_graph(graph, parts, seed=seed).assignment.to(torch.int64)


def co_batch_targets(graph: Graph, targets: torch.Tensor, num_co_batches: int, seed: int = 0,
                     order: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """``targets`` cut into ``num_co_batches`` chunks of near-equal size, each sorted; neighbours go together
    (ordered by an ``num_co_batches``-way full-graph METIS map of ``graph``, or by ``order``: a key per vertex).

    Example:
        >>> g = Graph.from_edges([0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3], symmetric=True)  # two triangles
        >>> [c.tolist() for c in co_batch_targets(g, torch.arange(6), 2)]
        [[0, 1, 2], [3, 4, 5]]
    """
    targets = torch.as_tensor(targets, dtype=torch.int64).cpu().unique()
    n = check_co_batches(num_co_batches, targets.numel())
    if n == 1 or targets.numel() == 0:
        return [targets]
    if order is None:
        order = chunk_order(graph, n, seed)
    key = order[targets] * graph.num_nodes + targets  # by part, then by id
    ordered = targets[torch.argsort(key)]
    return [c.sort().values for c in torch.tensor_split(ordered, n)]


def co_batch_estimate(graph: Graph, chunk: torch.Tensor, owner: torch.Tensor, world_size: int, num_layers: int,
                      feat_dim: int, dims: Sequence[tuple] = (), **options) -> MemoryEstimate:
    """The largest per-rank estimate (:func:`gsplit.fullgraph.estimate_memory`, ``options`` passed on) of one
    co-batch: the dependency subgraph of ``chunk`` split by ``owner``, charged at every layer (an upper bound)."""
    inner = torch.ones(graph.num_nodes, dtype=torch.int64)
    inner[chunk] = 0
    dep = host_subgraph(graph, inner, 0, num_layers)
    stats = full_graph_stats(dep.graph, owner[dep.nodes], world_size)
    per_rank = [estimate_memory(stats, r, feat_dim, dims, **options) for r in range(world_size)]
    return max(per_rank, key=lambda e: e.total)


@dataclass
class CoBatchChoice:
    """How many co-batches a host trains in, and why."""

    num_co_batches: int
    """Co-batches per epoch (1: the share at once)."""
    estimate: Optional[MemoryEstimate]
    """The largest co-batch's estimate on its worst rank (with 1: the whole share's); ``None`` for a forced count
    above 1 (see :func:`co_batch_estimate`)."""
    limit: Optional[int]
    """The budget per rank in bytes it was chosen for (``None``: unknown, not checked)."""
    forced: bool
    """Given by the caller (``--co-batches N``), not chosen from the budget."""


def choose_co_batches(graph: Graph, targets: torch.Tensor, owner: torch.Tensor, world_size: int, num_layers: int,
                      feat_dim: int, dims: Sequence[tuple], limit: Optional[int], whole: MemoryEstimate,
                      forced: Optional[int] = None, seed: int = 0, **options) -> CoBatchChoice:
    """The co-batches to train ``graph``'s ``targets`` in: ``forced``, or the fewest of 1, 2, 4, ... (at most the
    targets) whose largest co-batch fits ``limit`` bytes per rank. ``whole``: the estimate of training the share
    at once (the ordinary full-graph loader's). Raises :class:`FullGraphMemoryError` when not even one target per
    co-batch fits. Deterministic: every rank of a host makes the same choice from the same ``limit``.

    Example:
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> whole = estimate_memory(full_graph_stats(g, torch.zeros(4, dtype=torch.int64), 1), 0, feat_dim=8)
        >>> choose_co_batches(g, torch.arange(4), torch.zeros(4, dtype=torch.int64), 1, 1, 8, [], None,
        ...                   whole).num_co_batches
        1
    """
    targets = torch.as_tensor(targets, dtype=torch.int64).cpu()
    num_targets = targets.numel()
    if forced is not None:  # not estimated: the chunks' dependency subgraphs cost time, and nothing is chosen
        n = check_co_batches(forced, num_targets)
        return CoBatchChoice(n, whole if n == 1 else None, limit, forced=True)
    if limit is None or whole.total <= limit or num_targets <= 1:
        return CoBatchChoice(1, whole, limit, forced=False)
    n, best = 2, whole
    while True:
        n = min(n, num_targets)
        chunks = co_batch_targets(graph, targets, n, seed)
        best = max((co_batch_estimate(graph, c, owner, world_size, num_layers, feat_dim, dims, **options)
                    for c in chunks), key=lambda e: e.total)
        if best.total <= limit:
            return CoBatchChoice(n, best, limit, forced=False)
        if n == num_targets:
            raise FullGraphMemoryError(
                f"full-graph training does not fit even in {n} co-batches of one target each: the largest needs about "
                f"{best.describe()} on a rank, but only {limit / 2**30:.2f} GiB are available; use more ranks, "
                "--recompute, a smaller hidden size, or mini-batch training")
        n *= 2


@dataclass
class CoBatchSource:
    """What a co-batch loader trains over, shared by the evaluation loaders of the same run."""

    graph: Graph
    """The share (one host: the whole graph) in its own vertex ids."""
    owner: torch.Tensor
    """The rank of the host that owns each vertex of ``graph``."""
    features: Optional[torch.Tensor]
    """Input rows of ``graph``'s vertices (the preloaded ones): each rank loads the rows it owns from here."""
    num_co_batches: int
    """Co-batches per epoch."""
    nodes: Optional[torch.Tensor] = None
    """Global id of each vertex of ``graph`` (``None``: the ids are global already)."""
    edge_ids: Optional[torch.Tensor] = None
    """Global id of each edge of ``graph`` (with ``nodes``)."""
    order: Optional[torch.Tensor] = None
    """The METIS part of each vertex that orders targets into chunks (made once, shared)."""
    labels: Optional[torch.Tensor] = None
    """A class per vertex of ``graph`` (evaluation loaders take them from here)."""
    inner: Optional[torch.Tensor] = None
    """Boolean per vertex of ``graph``: the vertices this host trains and evaluates (``None``: all)."""
    num_global_targets: Optional[int] = None
    """The training vertices of the whole graph (the loss denominator)."""

    def local_targets(self, idx) -> torch.Tensor:
        """The vertices of ``graph`` among the global ids ``idx`` that this host computes (its inner ones)."""
        idx = torch.as_tensor(idx, dtype=torch.int64).cpu()
        if self.nodes is None:
            return idx.unique()
        n = int(self.nodes.max()) + 1 if self.nodes.numel() else 0
        local = torch.full((max(n, int(idx.max()) + 1 if idx.numel() else 0),), -1, dtype=torch.int64)
        local[self.nodes] = torch.arange(self.nodes.numel())
        ids = local[idx]
        ids = ids[ids >= 0]
        return (ids[self.inner[ids]] if self.inner is not None else ids).unique()


class CoBatchLoader:
    """Full-graph training in co-batches: yields ``num_co_batches`` split mini-batches per epoch whose gradients
    accumulate into one step (see the module's text).

    Args:
        graph: the share to train (one host: the whole graph; shared preloading: the host's share, local ids).
        num_layers: layers of the model.
        targets: the vertices whose loss counts here (ids of ``graph``: one host's training vertices, or the
            inner training vertices of a preloading host); each is a target of exactly one co-batch.
        partition: the rank of the host that owns each vertex of ``graph`` (a tensor or a PartitionMap).
        num_co_batches: co-batches per epoch (``1 <= N <= len(targets)``).
        features: input rows of ``graph``'s vertices; or another co-batch loader's ``feature_store``.
        labels: a class per vertex of ``graph``.
        group, device, feat_key, label_key: as for :class:`gsplit.FullGraphLoader`.
        num_global_targets: the loss denominator (the whole graph's training vertices; default ``len(targets)``).
        nodes, edge_ids: the global id of each vertex and edge of ``graph``; the blocks then carry global ids
            (dropout masks are keyed by them).
        seed: seeds the METIS map that orders the targets into chunks.

    Example:
        >>> import gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=0)
        >>> loader = CoBatchLoader(ds.graph, 2, targets=ds.train_idx, partition=torch.zeros(300, dtype=torch.int64),
        ...                        num_co_batches=3, features=ds.features, labels=ds.labels)
        >>> model = gsplit.nn.SAGE(ds.feature_dim, 16, ds.num_classes, num_layers=2)
        >>> for _, _, blocks in loader:                     # gradients accumulate over the co-batches
        ...     logits = model(blocks, blocks[0].srcdata["feat"])
        ...     gsplit.split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1]).backward()
        >>> len(loader), loader.accumulates
        (3, True)
    """

    accumulates = True
    """An epoch's co-batches are one optimiser step: the trainer zeroes the gradients before the first, and sums
    them over ranks and steps after the last."""

    def __init__(self, graph: Graph, num_layers: int, *, targets, partition, num_co_batches: int,
                 features=None, labels=None, group=None, device: Union[str, torch.device, None] = None,
                 num_global_targets: Optional[int] = None, nodes: Optional[torch.Tensor] = None,
                 edge_ids: Optional[torch.Tensor] = None, seed: int = 0,
                 feat_key: str = "feat", label_key: str = "label"):
        if int(num_layers) < 1:
            raise ValueError(f"num_layers={num_layers}; pass the number of layers of the model (at least 1)")
        self.graph, self.num_layers = graph, int(num_layers)
        self.comm = as_communicator(group)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.feat_key, self.label_key = feat_key, label_key
        owner = getattr(partition, "assignment", partition)
        self.owner = torch.as_tensor(owner).to("cpu", torch.int64)
        if self.owner.shape != (graph.num_nodes,):
            raise ValueError(f"partition has {self.owner.numel()} entries but the graph has {graph.num_nodes} "
                             "vertices; pass the rank of every vertex")
        targets = torch.as_tensor(targets).to("cpu", torch.int64).unique()
        if isinstance(features, CoBatchSource):
            source = features
        else:
            source = CoBatchSource(graph, self.owner, features, int(num_co_batches), nodes, edge_ids,
                                   labels=None if labels is None else torch.as_tensor(labels),
                                   num_global_targets=num_global_targets)
        n = check_co_batches(num_co_batches, targets.numel())
        if n > 1 and source.order is None:
            source.order = chunk_order(graph, source.num_co_batches, seed)
        self.source = source
        # a host without targets still runs the epoch's step (its ranks join the gradient all-reduce): one empty batch
        self.chunks = co_batch_targets(graph, targets, n, seed, order=source.order) if targets.numel() else [targets]
        self.num_global_targets = targets.numel() if num_global_targets is None else int(num_global_targets)
        self.labels = None if labels is None else torch.as_tensor(labels)
        self.sampler = NeighborSampler([-1] * self.num_layers, seed=seed)
        self.last_stats = IterationStats()
        self._epoch, self._skip = 0, False
        log.info("rank %d trains %d targets in %d co-batches of %s targets", self.comm.rank, targets.numel(), n,
                 "/".join(str(c.numel()) for c in self.chunks[:8]) + ("/..." if n > 8 else ""))

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def feature_store(self) -> CoBatchSource:
        """The share, its map, rows and co-batch count: pass it as an evaluation loader's ``features=``."""
        return self.source

    def set_epoch(self, epoch: int, start_iteration: int = 0) -> None:
        """As :meth:`gsplit.DataLoader.set_epoch`; an epoch's co-batches are one step, so it starts at 0 (or
        ``len(loader)``: skipped, done)."""
        if start_iteration not in (0, len(self)):
            raise ValueError(f"start_iteration={start_iteration}; an epoch of co-batches is one step: resume at its "
                             f"start (0) or after it ({len(self)})")
        self._epoch, self._skip = int(epoch), start_iteration == len(self)

    def __len__(self) -> int:
        return len(self.chunks)

    def _batch(self, k: int, chunk: torch.Tensor) -> MiniBatch:
        t0 = time.perf_counter()
        batch = sp_sample(self.graph, chunk, self.owner, self.sampler, self.comm, epoch=self._epoch, iteration=k,
                          num_global_targets=self.num_global_targets)
        t1 = time.perf_counter()
        blocks = [b.to(self.device) for b in batch.blocks]
        features = self.source.features
        if features is not None:  # fetch-then-split: the rows this rank owns, the shuffle brings the rest
            local = features[batch.input_nodes.to(features.device)].to(self.device)
            blocks[0].srcdata[self.feat_key] = shuffle_rows(local, blocks[0].shuffle_index, self.comm)
        top = blocks[-1]
        top.num_loss_rows = top.num_dst_nodes()
        if self.labels is not None:
            top.dstdata[self.label_key] = self.labels[top.dst_nodes.to(self.labels.device)].to(self.device, torch.int64)
        inputs, outputs = batch.input_nodes, top.dst_nodes
        if self.source.nodes is not None:  # global ids: the shuffle plans are positional, so they are unchanged
            nodes = self.source.nodes.to(self.device)
            edges = None if self.source.edge_ids is None else self.source.edge_ids.to(self.device)
            blocks = [replace(b, src_nodes=nodes[b.src_nodes],
                              edge_ids=b.edge_ids if edges is None else edges[b.edge_ids]) for b in blocks]
            inputs, outputs = self.source.nodes[inputs.cpu()], blocks[-1].dst_nodes
        batch = MiniBatch(inputs, outputs, blocks)
        self.last_stats = IterationStats.of_batch(batch, t1 - t0, time.perf_counter() - t1)
        return batch

    def __iter__(self) -> Iterator[MiniBatch]:
        if self._skip:
            self._skip = False
            return
        for k, chunk in enumerate(self.chunks):
            batch = self._batch(k, chunk)
            bind_group(batch.blocks, self.comm)
            yield batch
        self._epoch += 1

    def check_model(self, model) -> None:
        """Refuse a layer that is not split-safe and a model of another depth (as :class:`gsplit.FullGraphLoader`)."""
        check_split_safe(model)
        layers = getattr(model, "layers", None)
        if layers is not None and len(layers) != self.num_layers:
            raise ValueError(f"the model has {len(layers)} layers but the loader was built for {self.num_layers}; "
                             f"pass num_layers={len(layers)}")


# ---------------------------------------------------------------------------------------------- choose and build
def _agreed_limit(limit: Optional[int], comm) -> Optional[int]:
    """The smallest budget of the host's ranks (each reads its own free memory), so that all choose alike."""
    limits = comm.all_gather_object(limit) if comm.world_size > 1 else [limit]
    return None if any(x is None for x in limits) else min(limits)


def full_graph_loader(graph: Graph, num_layers: int, *, features, labels, train_idx, dims: Sequence[tuple] = (),
                      co_batches: Optional[int] = None, partition=None, host_map=None, group=None,
                      replica_group=None, device: Union[str, torch.device, None] = None,
                      memory_limit: Union[str, int, None] = "auto", recompute: bool = False, dtype_bytes: int = 4,
                      external_hops: Optional[int] = None, external_fanout: Optional[int] = None, seed: int = 0):
    """The training loader of full-graph training on one host (``partition``) or on a preloading host (``host_map``,
    ``replica_group``): the whole share at once (:class:`gsplit.FullGraphLoader` / :class:`PreloadLoader`) where it
    fits ``memory_limit`` per rank by the estimate of a model of layers ``dims`` (:func:`layer_dims`), else a
    :class:`CoBatchLoader` in the co-batches :func:`choose_co_batches` picks; ``co_batches`` forces the count
    (1: the share at once). The loader's ``co_batch_choice`` says what was chosen and why (logged at INFO).

    Example:
        >>> import gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=0)
        >>> model = gsplit.nn.SAGE(ds.feature_dim, 16, ds.num_classes, num_layers=2)
        >>> loader = full_graph_loader(ds.graph, 2, features=ds.features, labels=ds.labels, train_idx=ds.train_idx,
        ...                            dims=layer_dims(model), memory_limit=560_000)  # bytes per rank
        >>> type(loader).__name__, loader.co_batch_choice.num_co_batches > 1
        ('CoBatchLoader', True)
    """
    from gsplit.comm.hosts import replica_layout
    from gsplit.data.graph import as_vertex_ids
    from gsplit.fullgraph.loader import FullGraphLoader, available_memory
    from gsplit.fullgraph.preload import PreloadLoader, host_map_tensor, host_share
    from gsplit.ops import aggregate
    from gsplit.partitioning.partition_map import owner_tensor

    comm = as_communicator(group)
    device = torch.device(device) if device is not None else torch.device("cpu")
    n = graph.num_nodes
    if train_idx is None:
        train = torch.as_tensor(labels).cpu() >= 0 if labels is not None else torch.ones(n, dtype=torch.bool)
    else:
        train = torch.zeros(n, dtype=torch.bool)
        train[as_vertex_ids(train_idx, n, "train_idx", unique=True)] = True
    preload = host_map is not None
    if preload:
        num_hosts, host = replica_layout(group, replica_group)
        hmap = host_map_tensor(host_map, graph, num_hosts)
        share, owner = host_share(graph, hmap, host, num_layers, comm, external_hops=external_hops,
                                  external_fanout=external_fanout, seed=seed)
        sub, nodes, inner = share.graph, share.nodes, share.inner
        targets = (train[nodes] & inner).nonzero().flatten()
        what = f"host {host}'s share ({nodes.numel()} vertices)"
    else:
        owner = owner_tensor(partition, graph, comm.world_size).to("cpu", torch.int64)
        sub, nodes, inner, share = graph, None, None, None
        targets = train.nonzero().flatten()
        what = f"the graph ({n} vertices)"
    feat_dim = 0 if features is None else int(features.shape[1])
    options = {"dtype_bytes": dtype_bytes, "recompute": recompute,
               "fused_attention": device.type == "cpu" and aggregate.extension_available(),
               "feature_bytes": None if features is None else features.element_size()}
    if memory_limit == "auto":
        limit = available_memory(device, comm.world_size if device.type == "cpu" else 1)
    elif isinstance(memory_limit, str):
        from gsplit.data.feature_store import parse_size
        limit = parse_size(memory_limit, "memory_limit")
    else:
        limit = None if memory_limit is None else int(memory_limit)
    limit = _agreed_limit(limit, comm)
    stats = full_graph_stats(sub, owner, comm.world_size)
    whole = max((estimate_memory(stats, r, feat_dim, dims, **options) for r in range(comm.world_size)),
                key=lambda e: e.total)
    choice = choose_co_batches(sub, targets, owner, comm.world_size, num_layers, feat_dim, dims, limit, whole,
                               forced=co_batches, seed=seed, **options)
    budget = "no budget known" if limit is None else f"budget {limit / 2**30:.3f} GiB per rank"
    if choice.num_co_batches == 1:
        log.info("full-graph training of %s at once (%s; estimate %s)", what, budget, whole.describe())
        if preload:
            loader = PreloadLoader(graph, num_layers, host_map=hmap, group=group, replica_group=replica_group,
                                   features=features, labels=labels, train_idx=train_idx, device=device,
                                   memory_limit=limit, seed=seed, share=(share, owner))
        else:
            loader = FullGraphLoader(graph, num_layers, partition=owner, features=features, labels=labels,
                                     train_idx=train_idx, group=group, device=device, memory_limit=limit)
    else:
        log.info("full-graph training of %s in %d co-batches (%s; the whole needs %s%s)", what, choice.num_co_batches,
                 "forced" if choice.forced else budget, whole.describe(),
                 "" if choice.estimate is None else f", the largest co-batch {choice.estimate.describe()}")
        local_feats = features if features is None or nodes is None else features[nodes.to(features.device)]
        local_labels = labels if labels is None or nodes is None else torch.as_tensor(labels)[nodes]
        loader = CoBatchLoader(sub, num_layers, targets=targets, partition=owner,
                               num_co_batches=choice.num_co_batches, features=local_feats, labels=local_labels,
                               group=group, device=device, num_global_targets=int(train.sum()), nodes=nodes,
                               edge_ids=None if share is None else share.edge_ids, seed=seed)
        loader.source.inner = inner
        if preload:
            loader.num_replicas, loader.host = num_hosts, host
    loader.co_batch_choice = choice
    return loader
