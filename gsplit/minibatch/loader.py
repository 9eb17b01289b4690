"""``DataLoader``: a drop-in for ``dgl.dataloading.DataLoader(use_ddp=True)`` that splits instead.

Every iteration all ranks agree on ONE global mini-batch (``batch_size * world_size`` targets, the same
global order on every rank, from ``ddp_seed`` and the epoch), sample their split of it with
:func:`gsplit.split.sp_sample`, load features only for the vertices they own at the input level (from
the rank's :class:`~gsplit.data.feature_store.FeatureStore`: its GPU cache, else host memory), and shuffle
them into the first block's source rows. With several hosts (``replica_group=``) each host is one split
group and splits its own consecutive slice of a global mini-batch ``num_replicas`` times larger.

With ``prefetch=True`` a background thread samples and loads the next mini-batch while the current
one trains. Sampling and loading do collectives (id exchanges, the feature shuffle) and so does training
(shuffles in forward and backward, the gradient all-reduce); two threads issuing collectives on one
process group would interleave them differently on different ranks. The prefetching loader therefore
runs its collectives on a process group of its own, created in the constructor, while the blocks'
shuffle indices keep the training communicator (``loader.comm``).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from gsplit import ops
from gsplit.comm.communicator import Communicator, TrafficCounter
from gsplit.comm.shuffle import shuffle_rows
from gsplit.data.feature_store import CacheCounts, FeatureStore, parse_size
from gsplit.data.finite import first_non_finite_row
from gsplit.data.graph import Graph
from gsplit.interop import dgl as dgl_interop  # imports no dgl: DGL inputs and DGL's keywords
from gsplit.interop.graphs import graph_input  # DGLGraph / PyG Data in, imports neither library
from gsplit.interop.pyg import warn_fanout_order  # imports no torch_geometric
from gsplit.link import loading as link_loading
from gsplit.link.sampler import attach_pairs
from gsplit.partitioning.auto import default_partition
from gsplit.partitioning.partition_map import owner_tensor
from gsplit.minibatch.prefetch import PREFETCH_DEPTH, Producer
from gsplit.minibatch.rank_loader import (IterationStats, PreparedBatch, PreparedMacrobatch,  # noqa: F401
                                         RankLoader, _group_like)  # IterationStats: imported from here too
from gsplit.sampling.block import MiniBatch, ShuffleIndex
from gsplit.sampling.neighbor import NeighborSampler
from gsplit.ops.torch_ops import to_device
from gsplit.sampling.macrobatch import BatchInputs, num_macrobatches
from gsplit.split.inputs import macro_inputs
from gsplit.split.split_sampling import local_targets, sp_sample_many
from gsplit.runtime.timing import timed_step

log = logging.getLogger(__name__)

class DataLoader(RankLoader):
    """Split-parallel mini-batch loader; iterate it like DGL's ``DataLoader``.

    Args:
        graph: the full graph (every rank holds it): a :class:`gsplit.Graph`, or a homogeneous
            ``DGLGraph`` (``gsplit[dgl]``), converted once to gsplit's CSC of in-edges (keeping DGL's
            edge ids, see :mod:`gsplit.interop.dgl`); features and labels then come from its ``ndata``
            unless given, and the loader yields real DGL blocks (``dgl.create_block``) with
            ``srcdata``/``dstdata``, ``srcdata[dgl.NID]``/``dstdata[dgl.NID]`` (global vertex ids) and
            ``edata[dgl.EID]``, on which ``dgl.nn`` layers run unchanged.
        indices: target vertices (e.g. ``train_idx``), or a boolean mask (e.g. ``g.ndata["train_mask"]``);
            with an edge sampler, training edge ids (``train_eids``: positions in ``graph.indices``).
        sampler: a :class:`gsplit.NeighborSampler`, or DGL's ``NeighborSampler`` /
            ``MultiLayerFullNeighborSampler``, replaced by a gsplit sampler with the same fanouts
            (:func:`gsplit.interop.dgl.sampler_from_dgl`; its ``prefetch_node_feats`` /
            ``prefetch_labels`` apply when the loader's are not given). Link prediction: an edge sampler of
            :func:`gsplit.as_edge_prediction_sampler`; the loader then yields DGL's
            ``(input_nodes, pair_graph, neg_pair_graph, blocks)`` (:class:`gsplit.link.LinkMiniBatch`), a
            global mini-batch being ``batch_size * world size`` edges (see :mod:`gsplit.link`).
        partition: a :class:`gsplit.PartitionMap` with ``num_parts == world size`` (or an owner
            tensor); optional at world size 1.
        device: where blocks, features and labels are delivered.
        use_ddp: as in DGL; must be ``True`` when a process group of more than one rank exists.
        ddp_seed: seed of the global order (identical on every rank).
        batch_size: targets **per rank** per iteration, as with DGL's ``use_ddp=True``.
        shuffle, drop_last: as in DGL.
        features, labels: host tensors indexed by global vertex id; features land in
            ``blocks[0].srcdata["feat"]`` and labels in ``blocks[-1].dstdata["label"]`` (the key is the
            first name of ``prefetch_node_feats`` / ``prefetch_labels``). ``features``
            may also be a :class:`~gsplit.data.feature_store.FeatureStore` (e.g. ``other_loader.feature_store``)
            to share one cache between loaders; ``cache_size`` and ``cache_weights`` must then be left out.
        group: the ``torch.distributed`` process group (default: the default group if initialised); with
            several hosts, this host's split group (see ``replica_group``).
        replica_group: several hosts (data parallelism across hosts, split parallelism within each): the
            group of every rank of the job, e.g. from :func:`gsplit.host_groups`; ``group`` is then this
            host's split group, one of ``num_replicas`` equal, disjoint groups. An iteration's global
            mini-batch holds ``batch_size * G * num_replicas`` targets (``G`` ranks per host), each host
            splits its consecutive slice, and ``blocks[-1].global_num_dst`` is the size of the whole
            global mini-batch (the union of the hosts' slices), so that summing
            :func:`gsplit.split_cross_entropy` and the gradients over ``replica_group``
            (``gsplit.allreduce_gradients(model, replica_group)``) is single-process training on the
            union. The partition map has ``G`` parts and is the same on every host. Default ``None``:
            one host.
        cache_size: bytes of device memory for this rank's feature cache (int or e.g. ``"10G"``); it holds
            the hottest vertices this rank owns. ``0``: every feature row is read from host memory.
        cache_weights: hotness of every vertex for the cache, e.g. ``PresampleWeights.vertex_weights``
            or the ``vertex_weights.npy`` written by ``gsplit prepare``; default: in-degree.
        prefetch: sample and load the next mini-batch in a background thread while the current one
            trains (on CUDA, on a side stream). The batches are the same as without. It creates a
            process group for the loader's collectives, so with several ranks every rank must construct
            its prefetching loaders in the same order. Only one pass over a prefetching loader can run at
            a time: starting a new one first finishes the previous one. Default: ``use_prefetch_thread``,
            else ``num_workers > 0``.
        overlap: sample for overlapped layers (:mod:`gsplit.minibatch.overlap`): every block but the last carries a
            plan with which gsplit's models (:func:`gsplit.sp_forward`) compute the rows other ranks need
            first and shuffle them while computing the rest. Same batches and results (up to rounding);
            models wrapped by :class:`gsplit.SplitParallel` ignore the plan. Default ``False``.
        input_features: how a rank gets its first layer's input rows. ``"shuffle"``: it loads the rows of
            the input vertices it owns and an all-to-all moves them to the ranks that need them (the
            paper's split: each row loaded once, from a GPU's cache or over PCIe); ``"direct"``: it reads
            every row it needs from the feature table, which every rank holds, with no id exchange at the
            bottom layer and no feature shuffle; ``"auto"``: ``"direct"`` for CPU ranks with no cache (a
            read of the shared table costs what the shuffle's copy would, without its collective), else
            ``"shuffle"`` (``gsplit train``'s default). Same blocks and features either way; with
            ``"direct"`` ``input_nodes`` is ``blocks[0].src_nodes`` (the ranks' sets overlap). Default
            ``"shuffle"``: every input row loaded by exactly one rank, the split's contract. A single rank
            (world size 1) always reads directly: it owns every row, so there is nothing to exchange.
        macrobatch: sample and load this many consecutive mini-batches together (BatchGNN's macrobatches,
            :mod:`gsplit.sampling.macrobatch`): their ids are exchanged in one all-to-all per layer, the union
            of their input rows is loaded (and shuffled) once, and the mini-batches are then yielded one at a
            time, each exactly as with ``macrobatch=1`` (the features must not change during training). CPU
            ranks that read their rows from the shared table (``input_features="direct"``) read each batch's
            rows when it is yielded: there a copy out of the union would cost what the read does.
            Macrobatches are aligned to iteration numbers (iterations ``[k*B, (k+1)*B)``), so a pass that
            starts in the middle of one (``set_epoch(epoch, start)``) starts with the rest of it. A size whose
            estimated memory (:func:`~gsplit.sampling.macrobatch.macrobatch_bytes`) exceeds the budget is
            lowered, with one WARNING line. Default 1: each mini-batch alone.
        macrobatch_memory: the budget of a macrobatch on this rank (bytes, or e.g. ``"2G"``); default a quarter
            of the memory available when the loader is built (host memory shared by the host's ranks, or
            the GPU's free memory).

    DGL's ``DataLoader`` keywords, so that a DGL call site ports unchanged (``device``, ``use_ddp``,
    ``ddp_seed``, ``batch_size``, ``shuffle`` and ``drop_last`` above mean what they mean in DGL):

        num_workers: accepted; sampling always runs in the rank's own process, because splitting a
            mini-batch exchanges vertex ids with the other ranks over the rank's process group, which
            worker processes do not hold. ``num_workers > 0`` turns on ``prefetch`` (a background
            thread of the rank) unless ``prefetch`` / ``use_prefetch_thread`` say otherwise.
        use_uva: pin the graph in host memory (:meth:`gsplit.Graph.pin_memory`) so that the GPU
            samples it in place (see :func:`gsplit.ops.sampling_device`); needs a CUDA ``device``.
            Features stay where they are (pass ``cache_size`` to keep the hottest rows on the GPU).
        use_prefetch_thread: the same as ``prefetch``.
        prefetch_node_feats: names of the input tensors put in ``blocks[0].srcdata`` (in DGL an
            argument of the sampler). With a ``DGLGraph``: keys of ``graph.ndata`` (default
            ``["feat"]`` when present; ``features=`` replaces the first one's tensor). With a
            ``gsplit.Graph``: one name, the key under which ``features`` land.
        prefetch_labels: the same for ``blocks[-1].dstdata`` (default ``["label"]``; ``labels=``
            replaces the first one's tensor).

    Other DGL keywords (``use_alternate_streams``, ``pin_prefetcher``, ``gpu_cache``, ...) raise
    ``TypeError``: gsplit's equivalents are ``prefetch`` (which uses a side stream on CUDA) and
    ``cache_size``.

    Yields :class:`~gsplit.MiniBatch` records that unpack as DGL's ``(input_nodes, output_nodes, blocks)``:
    ``input_nodes`` are the vertices whose features
    this rank loaded (its bottom local frontier, disjoint across ranks; with ``input_features="direct"``
    ``blocks[0].src_nodes``), ``output_nodes`` its targets.
    With a ``DGLGraph`` the blocks are DGL blocks; :class:`gsplit.SplitParallel` finds their shuffle
    plans, so pass them to the model as they come (a copy such as ``block.to(other_device)`` loses it).

    Communication counters: ``loader.comm.traffic`` counts everything this rank sent for the batches
    it yielded (id exchanges and the feature shuffle, added when the batch is yielded, plus the
    training shuffles that run on ``loader.comm``). With prefetch, ``loader.sampling_comm.traffic``
    counts what the background thread actually sent on the loader's own group, including a batch that
    was prefetched but never consumed; without prefetch ``sampling_comm is comm``.

    Example:
        >>> loader = gsplit.DataLoader(ds.graph, ds.train_idx, sampler, partition=pmap, use_ddp=True,
        ...                            batch_size=1024, shuffle=True, features=ds.features,
        ...                            labels=ds.labels, cache_size="4G", prefetch=True)  # doctest: +SKIP
        >>> for input_nodes, output_nodes, blocks in loader:                   # doctest: +SKIP
        ...     logits = model(blocks, blocks[0].srcdata["feat"])
    """

    def __init__(self, graph: Graph, indices, sampler: NeighborSampler, *, partition=None,
                 device: Union[str, torch.device, None] = None, use_ddp: bool = False, ddp_seed: int = 0,
                 batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 features: Union[torch.Tensor, FeatureStore, None] = None, labels: Optional[torch.Tensor] = None,
                 group=None, cache_size: Union[int, str] = 0, cache_weights=None, prefetch: Optional[bool] = None,
                 num_workers: int = 0, use_uva: bool = False, use_prefetch_thread: Optional[bool] = None,
                 prefetch_node_feats: Optional[Sequence[str]] = None, prefetch_labels: Optional[Sequence[str]] = None,
                 replica_group=None, overlap: bool = False, input_features: str = "shuffle", macrobatch: int = 1,
                 macrobatch_memory: Union[int, str, None] = None):
        given, source = graph, graph_input(graph)  # a gsplit Graph, a DGLGraph or a PyG Data
        self.edge_sampler, sampler = link_loading.unwrap_edge_sampler(sampler, source.kind, replica_group)
        """Link prediction: the edge sampler (``indices`` are then edge ids), else None."""
        dgl_graph = graph if source.kind == "dgl" else None
        self.dgl_source = source.dgl_source
        """The DGLGraph's conversion when one was given (the loader then yields DGL blocks), else None."""
        graph = source.graph
        if source.kind == "pyg":  # a PyG Data: its x and y unless given
            features = source.features if features is None else features
            labels = source.labels if labels is None else labels
            warn_fanout_order(sampler)
        self.device = torch.device(device) if device is not None else graph.device
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if use_uva:
            if self.device.type != "cuda":
                raise ValueError(f"use_uva=True lets the GPU sample a graph pinned in host memory, but device is "
                                 f"{self.device}; pass a CUDA device, or use_uva=False")
            if graph.device.type == "cpu":
                graph = graph.pin_memory()
        sampler, prefetch_node_feats, prefetch_labels = dgl_interop.loader_sampler(sampler, prefetch_node_feats,
                                                                                   prefetch_labels)
        if self.edge_sampler is not None and source.kind != "gsplit":  # DGL's / PyG's edge ids in, gsplit's inside
            indices, self.edge_sampler = link_loading.from_input_edge_ids(
                indices, self.edge_sampler, graph, link_loading.native_edge_ids(source, given), given)
        self._init_rank(graph, indices, group, use_ddp, batch_size, ddp_seed, shuffle, drop_last, replica_group,
                        edges=self.edge_sampler is not None)
        self.sampler = sampler
        targets = self.schedule.indices
        if self.edge_sampler is not None:
            self.edge_sampler, targets = link_loading.bind_node_sampler(self.edge_sampler, sampler, graph, targets)
        # a graph on the GPU, or pinned in host memory, is sampled on the GPU (ops.sampling_device)
        self.sample_device = ops.sampling_device(graph, self.device)
        if partition is None and self.comm.world_size > 1:  # as DGL's call site: no map given, make one
            partition = default_partition(graph, targets, sampler, batch_size, self.comm)
        owner = owner_tensor(partition, graph, self.comm.world_size)
        with timed_step(f"moving the owner map to {self.sample_device}", logger=log):
            self.owner = owner.to(self.sample_device)
        # on the host too: each batch's local targets (and their labels) are picked there, without a device
        # sync; the map itself when it is on the host (owner_tensor keeps its narrow type: 1 byte per vertex)
        self._host_owner = owner if owner.device.type == "cpu" else owner.cpu()
        node_feats = dgl_interop.named_node_data(dgl_graph, prefetch_node_feats, "prefetch_node_feats", "feat",
                                 features, "features")
        label_data = dgl_interop.named_node_data(dgl_graph, prefetch_labels, "prefetch_labels", "label",
                                 labels, "labels")
        # the first input tensor goes through the feature store (cache, counters); others are gathered as is
        self.feat_key = next(iter(node_feats), "feat")
        self.feature_store = self._feature_store(node_feats.pop(self.feat_key, None), cache_size, cache_weights)
        self.features = None if self.feature_store is None else self.feature_store.features
        self.extra_node_feats: Dict[str, torch.Tensor] = node_feats
        """More ``blocks[0].srcdata`` tensors (``prefetch_node_feats`` beyond the first), by key."""
        self.label_data: Dict[str, torch.Tensor] = label_data
        """The ``blocks[-1].dstdata`` tensors, by key (``labels`` is the first one's)."""
        self.labels = next(iter(label_data.values()), None)
        if self.labels is not None and self.labels.shape[0] != graph.num_nodes:
            raise ValueError(f"labels has {self.labels.shape[0]} rows but the graph has {graph.num_nodes} vertices; "
                             f"pass one row per vertex")
        self.prefetch = dgl_interop.prefetch_flag(prefetch, use_prefetch_thread, num_workers)
        self.sampling_comm = self.comm
        if self.prefetch and self.comm.world_size > 1:
            self.sampling_comm = Communicator(_group_like(self.comm))
            if self.sampling_comm.rank != self.comm.rank:
                raise RuntimeError(f"internal error: the loader's group numbers this rank {self.sampling_comm.rank} "
                                   f"but the training group {self.comm.rank}")
        self._producer: Optional[Producer] = None
        self.last_stats = IterationStats()
        self.overlap = bool(overlap) and self.comm.world_size > 1
        """Whether batches carry overlap plans (see ``overlap`` above; a single rank has no shuffle to hide)."""
        self.reads_inputs = self._reads_inputs(input_features)
        """Whether this rank reads all its input rows from the table (``input_features`` resolved)."""
        self.loads_union = self.features is not None and (self.features.device != self.device or
                                                           not self.reads_inputs)
        """Whether a macrobatch loads the union of its batches' input rows once, as it does where rows travel (the
        feature shuffle; host memory to a GPU), rather than each batch's rows when it is yielded: where a rank
        reads the table on its own device itself, a copy out of the union would cost what the read does
        (measured on a CPU: 16 batches of the 100k graph, 88 ms read one by one, 120 ms through their union)."""
        tables = ([self.features] if self.features is not None else []) + list(self.extra_node_feats.values())
        per_target = 1 if self.edge_sampler is None else self.edge_sampler.targets_per_edge()  # edges: endpoints
        self.macrobatch = self._init_macrobatch(macrobatch, macrobatch_memory, sampler, batch_size * per_target,
                                                sum(math.prod(t.shape[1:]) * t.element_size() for t in tables),
                                                shuffled=not self.reads_inputs)
        """Mini-batches sampled and loaded together (``macrobatch``, after the memory bound)."""

    def _reads_inputs(self, mode: str) -> bool:
        if mode not in ("auto", "direct", "shuffle"):
            raise ValueError(f"input_features={mode!r}; pass 'auto', 'direct' or 'shuffle'")
        cached = self.feature_store is not None and self.feature_store.cache_bytes > 0
        if mode == "direct" and cached:
            raise ValueError("input_features='direct' reads every input row from the feature table, but a cache "
                             "(cache_size) holds only the rows this rank owns, which 'shuffle' serves; pass "
                             "cache_size=0 or input_features='shuffle'")
        if self.comm.world_size == 1:
            # one rank owns every row: "shuffling" them to itself would only permute a copy of what it read
            # (measured: 20-34 ms against 6-7 ms per iteration for the 86k rows of a 100k-graph batch on a CPU)
            return True
        if mode == "auto":
            return self.device.type == "cpu" and self.feature_store is not None and not cached \
                and self.feature_store.features.device.type == "cpu"
        return mode == "direct"

    def _feature_store(self, features, cache_size, cache_weights) -> Optional[FeatureStore]:
        if isinstance(features, FeatureStore):
            if parse_size(cache_size) or cache_weights is not None:
                raise ValueError("features is a FeatureStore, whose cache is already set up; leave cache_size and "
                                 "cache_weights out (or pass the feature tensor instead)")
            if features.num_nodes != self.graph.num_nodes:
                raise ValueError(f"the feature store has {features.num_nodes} rows but the graph has "
                                 f"{self.graph.num_nodes} vertices; pass one row per vertex")
            return features
        if features is None:
            if parse_size(cache_size):
                raise ValueError(f"cache_size={cache_size!r} but no features were given; pass features= to cache")
            return None
        if features.shape[0] != self.graph.num_nodes:
            raise ValueError(f"features has {features.shape[0]} rows but the graph has {self.graph.num_nodes} "
                             f"vertices; pass one row per vertex")
        bad = first_non_finite_row(features)  # chunked: no full-size temporary
        if bad is not None:
            raise ValueError(f"features row {bad} holds NaN or inf; clean the features before training")
        owner = self.owner if self.comm.world_size > 1 else None
        # features already on a GPU stay there (the store serves them as they are); rows then move to self.device
        device = self.device if features.device.type == "cpu" else features.device
        return FeatureStore(features, device=device, cache_size=cache_size, weights=cache_weights,
                            graph=self.graph, owner=owner, rank=self.comm.rank)

    def __iter__(self) -> Iterator[MiniBatch]:
        if self.dgl_source is None:
            yield from super().__iter__()
            return
        for batch in super().__iter__():  # in the consumer's thread, after the batch's group is bound
            yield dgl_interop.to_dgl_batch(batch, self.dgl_source)

    def _batches(self, epoch: int, start: int) -> Iterator[MiniBatch]:
        if self.prefetch:
            yield from self._iter_prefetch(epoch, start)
        else:
            yield from self._iter_inline(epoch, start)

    # ------------------------------------------------------------------ producing one macrobatch
    def _prepare(self, epoch: int, group: List[Tuple[int, torch.Tensor]]) -> PreparedMacrobatch:
        """Sample and load the mini-batches ``group`` (``(iteration, global seeds)`` pairs: one, or a
        macrobatch's) with the loader's communicator (any thread): one id exchange per layer for all of them,
        one load of their input rows. The macrobatch's costs are booked on its first batch."""
        comm = self.sampling_comm
        own_group = comm is not self.comm
        before = comm.traffic.snapshot(seconds=True) if own_group else None
        t0 = time.perf_counter()
        sampler, edge_batches = self.sampler, None
        if self.edge_sampler is not None:  # a global mini-batch of edges: its targets are its pairs' endpoints
            group, sampler, edge_batches = link_loading.plan_group(self.edge_sampler, self.graph, group, epoch)
        # seeds: the whole global mini-batch (the union over replicas); this host splits its slice
        mine = [self.schedule.replica_slice(seeds, self.replica_rank) if self.num_replicas > 1 else seeds
                for _, seeds in group]
        targets = [local_targets(m, self._host_owner, self.rank) for m in mine]  # on the host: no device sync
        batches = sp_sample_many(self.graph, mine, self.owner, sampler, comm, epoch=epoch,
                                 iterations=[it for it, _ in group], num_global_targets=[s.numel() for _, s in group],
                                 targets=[to_device(t, self.sample_device) for t in targets], overlap=self.overlap,
                                 exchange_inputs=not self.reads_inputs)
        if edge_batches is not None:
            batches = [attach_pairs(e, b, self._host_owner, self.rank, self.world_size)
                       for e, b in zip(edge_batches, batches)]
        union = len(batches) > 1 and self.loads_union
        plan = macro_inputs(batches, self.owner, self.rank, self.world_size, self.graph.num_nodes,
                            read_directly=self.reads_inputs) if union else None
        if self.device != self.sample_device:
            batches = [b.to(self.device) for b in batches]
            plan = None if plan is None else plan.to(self.device)
        t1 = time.perf_counter()
        counts, inputs, loaded = None, [None] * len(batches), [b.input_nodes.numel() for b in batches]
        if plan is not None:  # the union of the macrobatch's rows, loaded and moved once
            rows = {}
            if self.feature_store is not None:
                loaded_rows, counts = self.feature_store.gather_with_counts(plan.input_nodes)
                rows[self.feat_key] = self._input_rows(loaded_rows, plan.shuffle_index, comm)
            for key, table in self.extra_node_feats.items():
                rows[key] = self._input_rows(table.index_select(0, plan.input_nodes.to(table.device)),
                                             plan.shuffle_index, comm)
            # each batch picks its rows when it is yielded; the rows are booked on the first batch
            inputs = [BatchInputs(rows, positions) for positions in plan.positions]
            loaded = [plan.input_nodes.numel()] + [0] * (len(batches) - 1)
        elif len(batches) == 1:  # one mini-batch: its rows straight into its first block
            counts = self._load_inputs(batches[0], comm)
        for target, batch in zip(targets, batches):
            for key, table in self.label_data.items():
                # host labels are gathered with the host targets and copied once, asynchronously
                ids = target if table.device.type == "cpu" else batch.output_nodes.to(table.device)
                batch.blocks[-1].dstdata[key] = to_device(table.index_select(0, ids), self.device)
        t2 = time.perf_counter()
        items = []
        for k, (batch, batch_inputs, rows_loaded) in enumerate(zip(batches, inputs, loaded)):
            first = k == 0
            stats = IterationStats.of_batch(batch, t1 - t0 if first else 0.0, t2 - t1 if first else 0.0,
                                            counts if first else None, macrobatch=len(batches))
            stats.input_rows = rows_loaded
            items.append(PreparedBatch(batch, stats, batch_inputs, load_when_yielded=len(batches) > 1 and not union))
        traffic = TrafficCounter.delta(comm.traffic.snapshot(seconds=True), before) if own_group else None
        return PreparedMacrobatch(items, traffic)

    def _load_inputs(self, batch: MiniBatch, comm: Communicator) -> Optional[CacheCounts]:
        """One mini-batch's input rows into its first block: loaded from the store (and the extra tables), then
        shuffled unless this rank reads them all itself; returns the store's counts."""
        bottom, counts = batch.blocks[0], None
        if self.feature_store is not None:
            rows, counts = self.feature_store.gather_with_counts(batch.input_nodes)
            bottom.srcdata[self.feat_key] = self._input_rows(rows, bottom.shuffle_index, comm)
        for key, table in self.extra_node_feats.items():
            rows = table.index_select(0, batch.input_nodes.to(table.device))
            bottom.srcdata[key] = self._input_rows(rows, bottom.shuffle_index, comm)
        return counts

    def _input_rows(self, rows: torch.Tensor, index: Optional[ShuffleIndex], comm: Communicator) -> torch.Tensor:
        """The first blocks' source rows from the rows loaded for their input nodes: the same rows when this
        rank read them all itself, else those it owns shuffled by ``index`` to the ranks that need them."""
        rows = rows.to(self.device, non_blocking=True)
        return rows if self.reads_inputs or index is None else shuffle_rows(rows, index, comm)

    def _deliver(self, macro: PreparedMacrobatch, k: int) -> MiniBatch:
        """Hand batch ``k`` of a prepared macrobatch to the consumer (its thread): stream order (at its first
        batch), its input rows, counters, ``last_stats``."""
        if k == 0:
            if macro.ready is not None:
                stream = torch.cuda.current_stream(self.device)
                stream.wait_event(macro.ready)
                for t in macro.tensors():
                    if t.is_cuda:
                        # allocated on the side stream: do not let the allocator reuse the memory there
                        # while this stream may still read it
                        t.record_stream(stream)
            if macro.traffic is not None:
                self.comm.traffic.merge(macro.traffic)
        item = macro.batches[k]
        t0 = time.perf_counter()
        if item.inputs is not None:
            item.inputs.attach(item.batch.blocks[0])
            item.inputs = None  # the macrobatch's rows are freed with its last batch
        elif item.load_when_yielded:  # read directly from the table: no collective, so in any thread
            counts = self._load_inputs(item.batch, self.sampling_comm) or CacheCounts()
            item.stats.cache_hits, item.stats.cache_misses, item.stats.host_bytes = \
                counts.hits, counts.misses, counts.host_bytes
        item.stats.load_s += time.perf_counter() - t0
        self.last_stats = item.stats
        return item.batch

    def _iter_inline(self, epoch: int, start: int):
        for group in self._macrobatches(epoch, start):
            t0 = time.perf_counter()
            macro = self._prepare(epoch, group)
            for k in range(len(macro.batches)):
                batch = self._deliver(macro, k)
                macro.batches[k].stats.wait_s = time.perf_counter() - t0
                yield batch
                t0 = time.perf_counter()

    def _iter_prefetch(self, epoch: int, start: int):
        if self._producer is not None:  # an earlier pass that was never finished nor closed
            self._producer.stop()
        producer = Producer(self._prepare, lambda e: self._macrobatches(e, start), epoch, self.device,
                            self.rank, exclusive_collectives=self.sampling_comm.nccl_for_cuda)
        self._producer = producer
        producer.start()
        try:
            for j in range(num_macrobatches(start, len(self), self.macrobatch)):
                # Macrobatch j is wanted now; allow the thread to prepare up to PREFETCH_DEPTH more. Credits,
                # not timing, decide how many the thread prepares, so every rank's thread runs the same
                # collectives even when the consumer stops early.
                producer.grant(j + 1 + PREFETCH_DEPTH)
                t0 = time.perf_counter()
                macro = producer.get()
                for k in range(len(macro.batches)):
                    batch = self._deliver(macro, k)
                    macro.batches[k].stats.wait_s = time.perf_counter() - t0
                    yield batch
                    t0 = time.perf_counter()
        finally:
            producer.stop()
            if self._producer is producer:
                self._producer = None
