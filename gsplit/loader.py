"""``DataLoader``: a drop-in for ``dgl.dataloading.DataLoader(use_ddp=True)`` that splits instead.

Every iteration all ranks agree on ONE global mini-batch (``batch_size * world_size`` targets, the same
global order on every rank, from ``ddp_seed`` and the epoch), sample their split of it with
:func:`gsplit.split.sp_sample`, load features only for the vertices they own at the input level, and
shuffle them into the first block's source rows.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple, Union

import torch

from gsplit.comm.communicator import Communicator
from gsplit.comm.shuffle import shuffle_rows
from gsplit.graph import Graph
from gsplit.sampling.batches import epoch_permutation, num_iterations
from gsplit.sampling.block import Block
from gsplit.sampling.neighbor import NeighborSampler
from gsplit.split.sp_sample import sp_sample

log = logging.getLogger(__name__)


@dataclass
class IterationStats:
    """What one iteration did on this rank, counted on the code path itself."""

    sample_s: float = 0.0
    """Seconds spent sampling (including the id exchanges)."""
    load_s: float = 0.0
    """Seconds spent loading input features (gather, device copy, first shuffle)."""
    input_rows: int = 0
    """Input-feature rows this rank loaded from its feature store."""
    edges: List[int] = field(default_factory=list)
    """Edges this rank computes, per layer (index 0 = input layer)."""
    dst_vertices: List[int] = field(default_factory=list)
    """Vertices this rank computes (block destinations), per layer."""
    targets: int = 0
    """Targets (loss rows) of this rank."""


def _owner_tensor(partition, graph: Graph, world_size: int) -> torch.Tensor:
    if partition is None:
        if world_size > 1:
            raise ValueError(f"world size is {world_size} but no partition map was given; pass "
                             "partition=gsplit.partition(graph, num_parts=world_size, ...) or a saved PartitionMap")
        return torch.zeros(graph.num_nodes, dtype=torch.int64)
    if isinstance(partition, torch.Tensor):
        owner = partition
        num_parts = int(owner.max()) + 1 if owner.numel() else 1
        if owner.numel() != graph.num_nodes:
            raise ValueError(f"the partition tensor has {owner.numel()} entries but the graph has "
                             f"{graph.num_nodes} vertices; pass one owner per vertex")
        if owner.numel() and int(owner.min()) < 0:
            raise ValueError("the partition tensor holds negative ranks; owners must be in [0, world_size)")
    else:
        partition.check_graph(graph)
        owner, num_parts = partition.assignment, partition.num_parts
    if num_parts > world_size or (not isinstance(partition, torch.Tensor) and num_parts != world_size):
        raise ValueError(f"the partition map has {num_parts} parts but the world has {world_size} ranks; "
                         f"prepare a map with num_parts={world_size}")
    return owner.to(torch.int64)


class DataLoader:
    """Split-parallel mini-batch loader; iterate it like DGL's ``DataLoader``.

    Args:
        graph: the full graph (every rank holds it).
        indices: target vertices (e.g. ``train_idx``).
        sampler: a :class:`gsplit.NeighborSampler`.
        partition: a :class:`gsplit.PartitionMap` with ``num_parts == world size`` (or an owner
            tensor); optional at world size 1.
        device: where blocks, features and labels are delivered.
        use_ddp: as in DGL; must be ``True`` when a process group of more than one rank exists.
        ddp_seed: seed of the global order (identical on every rank).
        batch_size: targets **per rank** per iteration, as with DGL's ``use_ddp=True``.
        shuffle, drop_last: as in DGL.
        features, labels: host tensors indexed by global vertex id; features land in
            ``blocks[0].srcdata["feat"]`` and labels in ``blocks[-1].dstdata["label"]``.
        group: the ``torch.distributed`` process group (default: the default group if initialised).

    Yields ``(input_nodes, output_nodes, blocks)``: ``input_nodes`` are the vertices whose features
    this rank loaded (its bottom local frontier; disjoint across ranks), ``output_nodes`` its targets.

    Example:
        >>> loader = gsplit.DataLoader(ds.graph, ds.train_idx, sampler, partition=pmap, use_ddp=True,
        ...                            batch_size=1024, shuffle=True, features=ds.features,
        ...                            labels=ds.labels)                      # doctest: +SKIP
        >>> for input_nodes, output_nodes, blocks in loader:                   # doctest: +SKIP
        ...     logits = model(blocks, blocks[0].srcdata["feat"])
    """

    def __init__(self, graph: Graph, indices, sampler: NeighborSampler, *, partition=None,
                 device: Union[str, torch.device, None] = None, use_ddp: bool = False, ddp_seed: int = 0,
                 batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 features: Optional[torch.Tensor] = None, labels: Optional[torch.Tensor] = None,
                 group=None):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}; it must be at least 1 (targets per rank per iteration)")
        self.comm = Communicator(group)
        if self.comm.world_size > 1 and not use_ddp:
            raise ValueError(f"a process group of {self.comm.world_size} ranks is initialised but use_ddp=False; "
                             "pass use_ddp=True so the ranks split one global mini-batch")
        self.graph = graph
        self.indices = torch.as_tensor(indices, dtype=torch.int64).cpu()
        graph.check_ids(self.indices, "indices")
        if torch.unique(self.indices).numel() != self.indices.numel():
            raise ValueError("indices contain repeated vertex ids; pass each target vertex once")
        self.sampler = sampler
        self.owner = _owner_tensor(partition, graph, self.comm.world_size).to(graph.device)
        self.device = torch.device(device) if device is not None else graph.device
        self.ddp_seed = int(ddp_seed)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        for name, t in (("features", features), ("labels", labels)):
            if t is not None and t.shape[0] != graph.num_nodes:
                raise ValueError(f"{name} has {t.shape[0]} rows but the graph has {graph.num_nodes} vertices; "
                                 f"pass one row per vertex")
        if features is not None and features.dtype.is_floating_point and not bool(torch.isfinite(features).all()):
            bad = int((~torch.isfinite(features)).any(1).nonzero()[0])
            raise ValueError(f"features row {bad} holds NaN or inf; clean the features before training")
        self.features = features
        self.labels = labels
        self._next_epoch = 0
        self.last_stats = IterationStats()

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def rank(self) -> int:
        return self.comm.rank

    def set_epoch(self, epoch: int) -> None:
        """Fix the epoch of the next pass (else every pass advances the epoch by one)."""
        self._next_epoch = int(epoch)

    def __len__(self) -> int:
        return num_iterations(self.indices.numel(), self.batch_size, self.world_size, self.drop_last)

    def global_batches(self, epoch: int) -> Iterator[torch.Tensor]:
        """The global mini-batches (identical on every rank) of ``epoch``."""
        order = epoch_permutation(self.indices, self.ddp_seed, epoch, self.shuffle)
        gb = self.batch_size * self.world_size
        for t in range(len(self)):
            yield order[t * gb:(t + 1) * gb]

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor, List[Block]]]:
        epoch = self._next_epoch
        self._next_epoch += 1
        for it, seeds in enumerate(self.global_batches(epoch)):
            stats = IterationStats()
            t0 = time.perf_counter()
            batch = sp_sample(self.graph, seeds.to(self.graph.device), self.owner, self.sampler, self.comm,
                              epoch=epoch, iteration=it)
            blocks = [b.to(self.device) for b in batch.blocks] if self.device != self.graph.device else batch.blocks
            t1 = time.perf_counter()
            if self.features is not None:
                local = self.features[batch.input_nodes.to(self.features.device)].to(self.device, non_blocking=True)
                blocks[0].srcdata["feat"] = shuffle_rows(local, blocks[0].shuffle_index)
            if self.labels is not None:
                blocks[-1].dstdata["label"] = self.labels[batch.output_nodes.to(self.labels.device)].to(self.device)
            t2 = time.perf_counter()
            stats.sample_s, stats.load_s = t1 - t0, t2 - t1
            stats.input_rows = batch.input_nodes.numel()
            stats.edges = [b.num_edges() for b in blocks]
            stats.dst_vertices = [b.num_dst_nodes() for b in blocks]
            stats.targets = batch.output_nodes.numel()
            self.last_stats = stats
            yield batch.input_nodes.to(self.device), batch.output_nodes.to(self.device), blocks
