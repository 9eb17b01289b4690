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
from typing import Iterator, List, Optional, Tuple, Union

import torch

from gsplit.graph import Graph
from gsplit.loader import IterationStats, RankLoader
from gsplit.sampling.block import Block
from gsplit.sampling.neighbor import NeighborSampler


class DataParallelLoader(RankLoader):
    """Per-rank micro-batch loader with the same arguments and output triple as :class:`gsplit.DataLoader`.

    Example:
        >>> loader = DataParallelLoader(g, train_idx, sampler, use_ddp=True, batch_size=1024,
        ...                             features=feats, labels=labels)          # doctest: +SKIP
        >>> for input_nodes, output_nodes, blocks in loader: ...                # doctest: +SKIP
    """

    def __init__(self, graph: Graph, indices, sampler: NeighborSampler, *,
                 device: Union[str, torch.device, None] = None, use_ddp: bool = False, ddp_seed: int = 0,
                 batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 features: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                 group=None, partition=None):
        del partition  # accepted so both loaders take the same arguments; data parallelism ignores it
        self._init_rank(graph, indices, group, use_ddp, batch_size, ddp_seed, shuffle, drop_last)
        self.sampler = sampler
        self.device = torch.device(device) if device is not None else graph.device
        self.features, self.labels = features, labels
        self.last_stats = IterationStats()

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor, List[Block]]]:
        epoch = self.schedule.next_epoch()
        b = self.schedule.batch_size
        for it, global_batch in enumerate(self.schedule.global_batches(epoch)):
            seeds = global_batch[self.rank * b:(self.rank + 1) * b]  # this rank's micro-batch
            stats = IterationStats()
            t0 = time.perf_counter()
            blocks = self.sampler.sample_blocks(self.graph, seeds.to(self.graph.device), epoch=epoch, iteration=it)
            if self.device != self.graph.device:
                blocks = [blk.to(self.device) for blk in blocks]
            t1 = time.perf_counter()
            input_nodes = blocks[0].src_nodes
            if self.features is not None:
                blocks[0].srcdata["feat"] = self.features[input_nodes.to(self.features.device)].to(self.device)
            if self.labels is not None:
                blocks[-1].dstdata["label"] = self.labels[seeds.to(self.labels.device)].to(self.device)
            t2 = time.perf_counter()
            stats.sample_s, stats.load_s = t1 - t0, t2 - t1
            stats.input_rows = input_nodes.numel()
            stats.edges = [blk.num_edges() for blk in blocks]
            stats.dst_vertices = [blk.num_dst_nodes() for blk in blocks]
            stats.targets = seeds.numel()
            self.last_stats = stats
            yield input_nodes, blocks[-1].dst_nodes, blocks
