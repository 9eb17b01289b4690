"""The data-parallel baseline: what ``dgl.dataloading.DataLoader(use_ddp=True)`` does.

Each rank samples its own micro-batch of ``batch_size`` targets with the same sampler, loads every
input feature of that micro-batch and computes all of it; gradients are averaged across ranks. The
micro-batches of one iteration are consecutive slices of the same global order that
:class:`gsplit.DataLoader` splits, so their union is exactly the split loader's global mini-batch and
the two systems' counters compare like for like. The overlap between the micro-batches' k-hop
neighbourhoods is the redundancy that split parallelism removes.
"""

from __future__ import annotations

import time
from typing import Iterator, Optional, Union

import torch

from gsplit.feature_store import FeatureStore
from gsplit.graph import Graph
from gsplit.loader import IterationStats, RankLoader
from gsplit.sampling.block import MiniBatch
from gsplit.sampling.neighbor import NeighborSampler


class DataParallelLoader(RankLoader):
    """Per-rank micro-batch loader with the same arguments and output triple as :class:`gsplit.DataLoader`.

    Input features are read through a :class:`~gsplit.feature_store.FeatureStore` with no owner map, as DGL's
    multi-GPU example reads them: on a GPU the rows are gathered by the GPU from pinned host memory (or from
    device memory, for a table already there); ``cache_size`` keeps the hottest rows (every row, when it
    covers the table) in each rank's device memory. ``features`` may be another loader's store (shared).

    Example:
        >>> loader = DataParallelLoader(g, train_idx, sampler, use_ddp=True, batch_size=1024,
        ...                             features=feats, labels=labels)          # doctest: +SKIP
        >>> for input_nodes, output_nodes, blocks in loader: ...                # doctest: +SKIP
    """

    def __init__(self, graph: Graph, indices, sampler: NeighborSampler, *,
                 device: Union[str, torch.device, None] = None, use_ddp: bool = False, ddp_seed: int = 0,
                 batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 features: Union[torch.Tensor, FeatureStore, None] = None, labels: Optional[torch.Tensor] = None,
                 group=None, partition=None, cache_size: Union[int, str] = 0, cache_weights=None):
        del partition  # accepted so both loaders take the same arguments; data parallelism ignores it
        self._init_rank(graph, indices, group, use_ddp, batch_size, ddp_seed, shuffle, drop_last)
        self.sampler = sampler
        self.device = torch.device(device) if device is not None else graph.device
        # as DGL's multi-GPU example: rows gathered on the GPU from pinned host memory (or from device memory,
        # for a table already there or cached whole); every rank may need every row, so no owner map
        self.feature_store = FeatureStore.for_loader(features, self.device, cache_size, cache_weights, graph)
        self.features = None if self.feature_store is None else self.feature_store.features
        self.labels = labels
        self.last_stats = IterationStats()

    def _batches(self, epoch: int, start: int) -> Iterator[MiniBatch]:
        b = self.schedule.batch_size
        for it, global_batch in self.schedule.numbered_batches(epoch, start):
            seeds = global_batch[self.rank * b:(self.rank + 1) * b]  # this rank's micro-batch
            t0 = time.perf_counter()
            batch = self.sampler.sample_layers(self.graph, seeds, epoch, it)
            if self.device != self.graph.device:
                batch = batch.to(self.device)
            t1 = time.perf_counter()
            blocks = batch.blocks
            counts = None
            if self.feature_store is not None:
                rows, counts = self.feature_store.gather_with_counts(batch.input_nodes)
                blocks[0].srcdata["feat"] = rows.to(self.device, non_blocking=True)
            if self.labels is not None:
                blocks[-1].dstdata["label"] = self.labels[seeds.to(self.labels.device)].to(self.device)
            self.last_stats = IterationStats.of_batch(batch, t1 - t0, time.perf_counter() - t1, counts)
            yield batch
