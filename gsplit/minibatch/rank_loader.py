"""The per-rank side every loader shares (the split loader, the data-parallel baseline, the full-graph and
preload loaders' counters): :class:`RankLoader` (a communicator, the global batch schedule, macrobatch sizing,
epochs), what one iteration did (:class:`IterationStats`) and what a loader hands over
(:class:`PreparedBatch`, :class:`PreparedMacrobatch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from gsplit.comm.communicator import Communicator, bind_group
from gsplit.comm.hosts import replica_layout
from gsplit.data.feature_store import CacheCounts, parse_size
from gsplit.data.graph import Graph, as_vertex_ids
from gsplit.interop.pyg import refuse_pyg_loader_keywords  # imports no torch_geometric
from gsplit.link.pairs import LinkMiniBatch
from gsplit.link.sampler import as_edge_ids
from gsplit.sampling.batches import BatchSchedule
from gsplit.sampling.block import MiniBatch
from gsplit.sampling.macrobatch import (BatchInputs, default_budget, fit_macrobatch, macrobatch_bytes,
                                       macrobatch_groups)
from gsplit.sampling.neighbor import NeighborSampler

__all__ = ["IterationStats", "PreparedBatch", "PreparedMacrobatch", "RankLoader"]


@dataclass
class IterationStats:
    """What one iteration did on this rank, counted on the code path itself."""

    sample_s: float = 0.0
    """Seconds spent sampling (including the id exchanges); with prefetch, in the background thread."""
    load_s: float = 0.0
    """Seconds spent loading input features (gather, device copy, first shuffle) and labels."""
    input_rows: int = 0
    """Input-feature rows this rank loaded from its feature store (in a macrobatch: the union of its batches'
    rows, booked on its first batch, 0 on the others)."""
    edges: List[int] = field(default_factory=list)
    """Edges this rank computes, per layer (index 0 = input layer)."""
    dst_vertices: List[int] = field(default_factory=list)
    """Vertices this rank computes (block destinations), per layer."""
    targets: int = 0
    """Targets (loss rows) of this rank."""
    cache_hits: int = 0
    """Input rows served from this rank's feature cache (device memory)."""
    cache_misses: int = 0
    """Input rows read from host memory."""
    host_bytes: int = 0
    """Bytes of input features read from host memory."""
    wait_s: float = 0.0
    """Seconds the consumer waited for this mini-batch: ``sample_s + load_s`` without prefetch, the part
    that training did not hide with it."""
    macrobatch: int = 1
    """Mini-batches of the macrobatch this one was sampled and loaded with (its costs are on the first)."""

    @classmethod
    def of_batch(cls, batch: MiniBatch, sample_s: float, load_s: float,
                 cache: Optional[CacheCounts] = None, macrobatch: int = 1) -> "IterationStats":
        """The counters of one prepared mini-batch (every loader builds its stats here)."""
        cache = cache or CacheCounts()
        return cls(sample_s=sample_s, load_s=load_s, input_rows=batch.input_nodes.numel(),
                   edges=[b.num_edges() for b in batch.blocks], dst_vertices=[b.num_dst_nodes() for b in batch.blocks],
                   targets=batch.output_nodes.numel(), cache_hits=cache.hits, cache_misses=cache.misses,
                   host_bytes=cache.host_bytes, macrobatch=macrobatch)


@dataclass
class PreparedBatch:
    """One mini-batch ready to hand over, with what it cost."""

    batch: MiniBatch
    """The rank's split of the mini-batch, on the loader's device, labels attached, and features unless ``inputs``
    holds them."""
    stats: IterationStats
    """What preparing it did and cost."""
    inputs: Optional[BatchInputs] = None
    """In a macrobatch: its input rows among the macrobatch's, attached to ``blocks[0]`` when it is yielded."""
    load_when_yielded: bool = False
    """In a macrobatch of a CPU rank that reads its rows from the shared table: read them when it is yielded."""


@dataclass
class PreparedMacrobatch:
    """The mini-batches of one macrobatch (one for ``macrobatch=1``), prepared together."""

    batches: List[PreparedBatch]
    """In iteration order."""
    traffic: Optional[dict] = None
    """Traffic sent on the loader's own group for them (``{"rows": {tag: n}, "bytes": {...}}``)."""
    ready: Optional["torch.cuda.Event"] = None
    """Recorded on the producing side stream once they are complete (CUDA prefetch only)."""

    def tensors(self) -> Iterator[torch.Tensor]:
        for item in self.batches:
            yield from item.batch.tensors()
            if item.inputs is not None:
                yield from item.inputs.tensors()


def _group_like(comm: Communicator):
    """A new process group with the same ranks (and rank numbers) and backend as ``comm``'s.

    ``new_group`` is collective: every member must call it, in the same order relative to other
    ``new_group`` calls. For the default group every process of the job is a member; for a subgroup
    only its members synchronise (``use_local_synchronization``).
    """
    group = comm.group
    ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    return dist.new_group(ranks=ranks, backend=dist.get_backend(group), use_local_synchronization=group is not None)


class RankLoader:
    """What every per-rank loader has: a communicator and a :class:`BatchSchedule` of global batches."""

    comm: Communicator
    schedule: BatchSchedule
    macrobatch: int = 1

    def __new__(cls, *args, **kwargs):
        # before Python's bare "unexpected keyword argument": PyG's NeighborLoader keywords get the DGL spelling
        refuse_pyg_loader_keywords(cls.__name__, kwargs)
        return super().__new__(cls)

    def _init_rank(self, graph: Graph, indices, group, use_ddp: bool, batch_size: int, ddp_seed: int,
                   shuffle: bool, drop_last: bool, replica_group=None, edges: bool = False) -> None:
        self.comm = Communicator(group)
        if self.comm.world_size > 1 and not use_ddp:
            raise ValueError(f"a process group of {self.comm.world_size} ranks is initialised but use_ddp=False; "
                             "pass use_ddp=True so the ranks share one global order of the targets")
        self.graph = graph
        # several hosts: this loader's group is one replica (host) of replica_group (every rank of the job)
        self.num_replicas, self.replica_rank = (1, 0) if replica_group is None else \
            replica_layout(group, replica_group)
        # the group gradients and logged losses are summed over (a Communicator, as comm is)
        self.replica_comm = None if replica_group is None else Communicator(replica_group)
        # an edge sampler's loader iterates edge ids (link prediction), any other vertex ids
        indices = as_edge_ids(indices, graph, "train_eids") if edges else \
            as_vertex_ids(indices, graph.num_nodes, "indices", unique=True)
        self.schedule = BatchSchedule(indices, batch_size, self.comm.world_size, ddp_seed, shuffle, drop_last,
                                      num_replicas=self.num_replicas)

    def _init_macrobatch(self, size: int, memory, sampler: NeighborSampler, targets: int, row_bytes: int,
                         shuffled: bool) -> int:
        """The macrobatch size to use: ``size`` when its estimated memory fits the budget (``memory``, else
        :func:`~gsplit.sampling.macrobatch.default_budget`), else lowered, with one WARNING line on the job's first
        rank."""
        if isinstance(size, bool) or int(size) != size or size < 1:
            raise ValueError(f"macrobatch={size!r}; pass the number of mini-batches sampled and loaded together "
                             "(1: each alone)")
        if size == 1:
            return 1
        budget = (parse_size(memory, "macrobatch_memory") if memory is not None
                  else default_budget(self.device, self.comm.world_size))
        graph = self.graph
        max_degree = int(graph.in_degrees().max()) if graph.num_nodes else 0
        # the ranks of a group exchange ids per macrobatch, so they must use one size: the smallest of theirs
        # (their default budgets are read at different moments); the first rank of the job says it, once
        first = self.comm.rank == 0 and self.replica_rank == 0
        return fit_macrobatch(int(size), lambda b: macrobatch_bytes(
            b, sampler.fanouts, targets, graph.num_nodes, graph.num_edges, max_degree, row_bytes, shuffled), budget,
            warn=first, agree=self._smallest_of_group)

    def _smallest_of_group(self, value: int) -> int:
        """The smallest ``value`` of this loader's ranks (itself on one rank)."""
        if self.comm.world_size == 1:
            return value
        values: List = [None] * self.comm.world_size
        dist.all_gather_object(values, int(value), group=self.comm.group)
        return min(values)

    def _macrobatches(self, epoch: int, start: int) -> Iterator[List[Tuple[int, torch.Tensor]]]:
        """The ``(iteration, global mini-batch)`` pairs of ``epoch`` from ``start`` on, in macrobatches."""
        return macrobatch_groups(self.schedule.numbered_batches(epoch, start), self.macrobatch)

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def rank(self) -> int:
        return self.comm.rank

    def set_epoch(self, epoch: int, start_iteration: int = 0) -> None:
        """Fix the epoch of the next pass (else every pass advances the epoch by one), and the iteration it
        starts at: a resumed run passes the first iteration it has not done; the batches are the same as
        an uninterrupted pass's from there on."""
        self.schedule.set_epoch(epoch, start_iteration)

    def __iter__(self) -> Iterator[MiniBatch]:
        for batch in self._batches(*self.schedule.next_pass()):
            # the batch's shuffles (group=None) run on this loader's group: the one place they meet
            bind_group(batch.blocks, self.comm)
            if isinstance(batch, LinkMiniBatch):  # and the exchange of its output rows before scoring
                bind_group(batch.pair_graphs(), self.comm)
            yield batch

    def _batches(self, epoch: int, start: int) -> Iterator[MiniBatch]:
        """The batches of ``epoch`` from iteration ``start`` on."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.schedule)
