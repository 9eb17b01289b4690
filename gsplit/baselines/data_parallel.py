"""The data-parallel baseline: what ``dgl.dataloading.DataLoader(use_ddp=True)`` does.

Each rank samples its own micro-batch of ``batch_size`` targets with the same sampler, loads every
input feature of that micro-batch and computes all of it; gradients are averaged across ranks. The
micro-batches of one iteration are consecutive slices of the same global order that
:class:`gsplit.DataLoader` splits, so their union is exactly the split loader's global mini-batch and
the two systems' counters compare like for like. The overlap between the micro-batches' k-hop
neighbourhoods is the redundancy that split parallelism removes.

With an edge sampler (:func:`gsplit.as_edge_prediction_sampler`, link prediction) the micro-batch of a rank is
its slice of the global mini-batch's edges, with its share of the negatives
(:meth:`~gsplit.link.sampler.EdgePredictionSampler.plan_slice`), sampled and scored by the rank alone, as each
rank of DGL's data-parallel loader does.
"""

from __future__ import annotations

import time
from typing import Iterator, Optional, Tuple, Union

import torch

from gsplit.data.feature_store import CacheCounts, FeatureStore
from gsplit.data.graph import Graph
from gsplit.link.loading import unwrap_edge_sampler
from gsplit.link.sampler import attach_pairs
from gsplit.minibatch.rank_loader import IterationStats, RankLoader
from gsplit.sampling.block import MiniBatch
from gsplit.sampling.macrobatch import BatchInputs, union_positions
from gsplit.sampling.neighbor import NeighborSampler


class DataParallelLoader(RankLoader):
    """Per-rank micro-batch loader with the same arguments and output triple as :class:`gsplit.DataLoader`.

    Input features are read through a :class:`~gsplit.data.feature_store.FeatureStore` with no owner map, as DGL's
    multi-GPU example reads them: on a GPU the rows are gathered by the GPU from pinned host memory (or from
    device memory, for a table already there); ``cache_size`` keeps the hottest rows (every row, when it
    covers the table) in each rank's device memory. ``features`` may be another loader's store (shared).

    ``macrobatch=B`` (and ``macrobatch_memory``) as in :class:`gsplit.DataLoader`: the rank samples its
    micro-batches of ``B`` consecutive iterations, gathers the union of their input rows once and yields them
    one at a time, each exactly as with ``B = 1``.

    Example:
        >>> loader = DataParallelLoader(g, train_idx, sampler, use_ddp=True, batch_size=1024,
        ...                             features=feats, labels=labels)          # doctest: +SKIP
        >>> for input_nodes, output_nodes, blocks in loader: ...                # doctest: +SKIP
    """

    def __init__(self, graph: Graph, indices, sampler: NeighborSampler, *,
                 device: Union[str, torch.device, None] = None, use_ddp: bool = False, ddp_seed: int = 0,
                 batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 features: Union[torch.Tensor, FeatureStore, None] = None, labels: Optional[torch.Tensor] = None,
                 group=None, partition=None, cache_size: Union[int, str] = 0, cache_weights=None,
                 macrobatch: int = 1, macrobatch_memory=None):
        del partition  # accepted so both loaders take the same arguments; data parallelism ignores it
        self.edge_sampler, sampler = unwrap_edge_sampler(sampler, "gsplit", None)
        self._init_rank(graph, indices, group, use_ddp, batch_size, ddp_seed, shuffle, drop_last,
                        edges=self.edge_sampler is not None)
        if self.edge_sampler is not None:
            self.edge_sampler.check(graph)
            self._no_owner = torch.zeros(graph.num_nodes, dtype=torch.int64)  # a rank's pairs: all its own
        self.sampler = sampler
        self.device = torch.device(device) if device is not None else graph.device
        # as DGL's multi-GPU example: rows gathered on the GPU from pinned host memory (or from device memory,
        # for a table already there or cached whole); every rank may need every row, so no owner map
        self.feature_store = FeatureStore.for_loader(features, self.device, cache_size, cache_weights, graph)
        self.features = None if self.feature_store is None else self.feature_store.features
        self.labels = labels
        self.last_stats = IterationStats()
        row_bytes = 0 if self.feature_store is None else self.feature_store.row_bytes
        per_target = 1 if self.edge_sampler is None else self.edge_sampler.targets_per_edge()
        self.macrobatch = self._init_macrobatch(macrobatch, macrobatch_memory, sampler, batch_size * per_target,
                                                row_bytes, shuffled=False)
        self.loads_union = self.features is not None and self.features.device != self.device
        """Whether a macrobatch reads the union of its micro-batches' input rows once (they travel: host memory to a
        GPU) rather than each batch's rows when it is yielded (a CPU rank reading the table: a copy out of the
        union would cost what the read does)."""

    def _batches(self, epoch: int, start: int) -> Iterator[MiniBatch]:
        b = self.schedule.batch_size
        for group in self._macrobatches(epoch, start):
            t0 = time.perf_counter()
            if self.edge_sampler is not None:
                seeds, batches = self._sample_edges(group, epoch)
            else:
                seeds = [global_batch[self.rank * b:(self.rank + 1) * b] for _, global_batch in group]  # this rank's
                batches = self.sampler.sample_many(self.graph, seeds, epoch, [it for it, _ in group])
            if self.device != self.graph.device:
                batches = [batch.to(self.device) for batch in batches]
            t1 = time.perf_counter()
            inputs, loaded = [None] * len(batches), [batch.input_nodes.numel() for batch in batches]
            union_counts = None
            if len(batches) > 1 and self.loads_union:
                union, positions = union_positions([batch.input_nodes for batch in batches], self.graph.num_nodes)
                union_rows, union_counts = self._gather(union)
                rows = {"feat": union_rows}
                inputs, loaded = [BatchInputs(rows, p) for p in positions], [union.numel()] + [0] * (len(batches) - 1)
            if self.labels is not None:
                for s, batch in zip(seeds, batches):
                    batch.blocks[-1].dstdata["label"] = self.labels[s.to(self.labels.device)].to(self.device)
            load_s = time.perf_counter() - t1
            for k, (batch, batch_inputs, rows_loaded) in enumerate(zip(batches, inputs, loaded)):
                t2 = time.perf_counter()
                first = k == 0
                counts = union_counts if first else None  # the union's rows count once, with the first batch
                if batch_inputs is not None:
                    batch_inputs.attach(batch.blocks[0])
                elif self.features is not None:
                    batch.blocks[0].srcdata["feat"], counts = self._gather(batch.input_nodes)
                self.last_stats = IterationStats.of_batch(batch, t1 - t0 if first else 0.0,
                                                          (load_s if first else 0.0) + time.perf_counter() - t2,
                                                          counts, macrobatch=len(batches))
                self.last_stats.input_rows = rows_loaded
                yield batch

    def _sample_edges(self, group, epoch: int):
        """This rank's micro-batches of edges of the global mini-batches ``group``: their targets (the pairs'
        endpoints) and their :class:`~gsplit.link.LinkMiniBatch` es (every pair scored by this rank)."""
        b = self.schedule.batch_size
        planned = [self.edge_sampler.plan_slice(self.graph, eids, epoch, it, self.rank * b, (self.rank + 1) * b)
                   for it, eids in group]
        seeds = [p.seeds for p in planned]
        sampler = self.edge_sampler.node_sampler(self.graph, planned)
        batches = sampler.sample_many(self.graph, seeds, epoch, [p.iteration for p in planned])
        return seeds, [attach_pairs(p, mb, self._no_owner, 0, 1) for p, mb in zip(planned, batches)]

    def _gather(self, ids: torch.Tensor) -> Tuple[torch.Tensor, CacheCounts]:
        """The feature rows of ``ids`` on the loader's device (through the store: cache, GPU gather), and their counts."""
        rows, counts = self.feature_store.gather_with_counts(ids)
        return rows.to(self.device, non_blocking=True), counts
