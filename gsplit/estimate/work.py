"""The exact work of every rank in one iteration, for split and data parallelism, counted in one process.

Split parallelism's per-rank work follows from the single-process mini-batch
(:meth:`gsplit.NeighborSampler.sample_blocks` of the global batch) and the partition map alone: with
counter-based picks the union over ranks of the split blocks *is* that mini-batch (the parity the tests
prove), so rank ``r``'s block at layer ``l`` holds the reference block's destinations that ``r`` owns, all
their in-edges, and as sources (its *mixed frontier*) those destinations plus the edges' sources. A source
owned by another rank is an id ``r`` requests in layer ``l``'s exchange and a row it receives in the
layer's shuffle; its owner sends that row. Data parallelism's work is each rank's own micro-batch, sampled
as its loader samples it. Both use the loaders' global order (:class:`gsplit.sampling.BatchSchedule`), so
the counts are those a run with the same seed logs, iteration by iteration (``tests/estimate/test_estimate.py``
checks them against a real 2-rank run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from gsplit.data.graph import Graph
from gsplit.sampling.batches import BatchSchedule
from gsplit.sampling.block import Block
from gsplit.sampling.neighbor import NeighborSampler

INPUT_MODES = ("shuffle", "direct")
"""How a split rank gets its input rows (:class:`gsplit.DataLoader`'s ``input_features``): ``shuffle`` loads
the rows it owns and exchanges them (ids at layer 0 too), ``direct`` reads every row it needs itself."""


@dataclass
class LayerWork:
    """One GNN layer of one iteration, one entry per rank (index 0 of :attr:`IterationWork.layers` = input layer)."""

    edges: List[int]
    """Edges the rank computes (and samples)."""
    dst: List[int]
    """Destination rows the rank computes (its local frontier at the level above)."""
    src: List[int]
    """Source rows of the rank's block: its mixed frontier (split) or the micro-batch's sources (dp)."""
    recv_rows: List[int]
    """Split: rows of the mixed frontier owned by other ranks, i.e. ids the rank requests in this layer's
    exchange and rows it receives in the layer's shuffle (forward; it sends as many gradient rows back)."""
    send_rows: List[int]
    """Split: rows other ranks request from this rank (ids it receives, rows it sends forward)."""
    exchanged: bool = False
    """Whether this layer has an id exchange and a shuffle (split: every layer above the input, and the
    input layer when the input rows are shuffled)."""


@dataclass
class IterationWork:
    """What every rank does in one iteration: the inputs of :func:`gsplit.estimate.predict_iteration`."""

    system: str
    """``split`` or ``dp``."""
    world_size: int
    """Ranks."""
    layers: List[LayerWork]
    """Per layer, input layer first."""
    input_rows: List[int]
    """Input-feature rows each rank loads (split/shuffle: the rows it owns; split/direct and dp: all it needs)."""
    targets: List[int]
    """Targets (loss rows) of each rank."""
    iteration: int = 0
    """Iteration of the epoch."""
    epoch: int = 0
    """Epoch."""

    @property
    def total_edges(self) -> int:
        """Edges over all layers and ranks."""
        return sum(sum(layer.edges) for layer in self.layers)

    @property
    def total_input_rows(self) -> int:
        """Input rows loaded over all ranks."""
        return sum(self.input_rows)

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"system": self.system, "world_size": self.world_size, "epoch": self.epoch, "iteration": self.iteration,
                "input_rows": self.input_rows, "targets": self.targets,
                "layers": [vars(layer).copy() for layer in self.layers]}


@dataclass
class SplitPlan:
    """The split of one reference mini-batch by a map: :class:`IterationWork` plus the ids each rank is asked
    for, from which a rank's own part of split sampling can be replayed in one process (``requests``)."""

    work: IterationWork
    """The per-rank counts."""
    requests: List[Dict[int, Tuple[torch.Tensor, List[int]]]] = field(default_factory=list)
    """``requests[r][l]``: ``(ids, counts)``, the ids rank ``r`` receives in layer ``l``'s exchange grouped by
    requesting rank (ascending, each group in id order) and how many come from each rank; exchanged layers only."""


def _bincount(x: torch.Tensor, n: int) -> List[int]:
    return torch.bincount(x, minlength=n).tolist() if x.numel() else [0] * n


def split_plan(blocks: Sequence[Block], owner: torch.Tensor, world_size: int, input_features: str = "shuffle",
               with_requests: bool = False) -> SplitPlan:
    """Each rank's share of the single-process mini-batch ``blocks`` under the map ``owner``.

    Example:
        >>> from gsplit import Graph, NeighborSampler
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)            # a 4-cycle
        >>> blocks = NeighborSampler([-1]).sample_blocks(g, torch.tensor([0, 2]))
        >>> w = split_plan(blocks, torch.tensor([0, 0, 1, 1]), 2).work
        >>> w.layers[0].edges, w.layers[0].src, w.layers[0].recv_rows, w.input_rows
        ([2, 2], [3, 3], [1, 1], [2, 2])
    """
    if input_features not in INPUT_MODES:
        raise ValueError(f"input_features={input_features!r}; choose one of {INPUT_MODES}")
    own = owner.to(torch.int64).cpu()
    p = int(world_size)
    layers: List[LayerWork] = []
    requests: List[Dict[int, Tuple[torch.Tensor, List[int]]]] = [dict() for _ in range(p)]
    for li, b in enumerate(blocks):
        src_nodes = b.src_nodes.cpu()
        nd, ns = b.num_dst, src_nodes.numel()
        dst_owner = own.index_select(0, src_nodes[:nd])
        edge_owner = dst_owner.index_select(0, b.edge_dst.cpu())
        # (rank, source row) pairs of every mixed frontier: the rank's destinations and its edges' sources
        keys = torch.cat([edge_owner * ns + b.edge_src.cpu(), dst_owner * ns + torch.arange(nd)])
        pairs = torch.unique(keys)
        rank, row = pairs // ns, pairs % ns
        vertex = src_nodes.index_select(0, row)
        row_owner = own.index_select(0, vertex)
        remote = row_owner != rank
        exchanged = li > 0 or input_features == "shuffle"
        layers.append(LayerWork(edges=_bincount(edge_owner, p), dst=_bincount(dst_owner, p), src=_bincount(rank, p),
                                recv_rows=_bincount(rank[remote], p), send_rows=_bincount(row_owner[remote], p),
                                exchanged=exchanged))
        if with_requests and exchanged:
            # what each owner receives: the ids of every rank's mixed frontier it owns (itself included), by rank
            order = torch.argsort(row_owner * (p * ns) + rank * ns + row)  # owner, then requester, then row
            by_owner = torch.bincount(row_owner, minlength=p).tolist()
            ids = torch.split(vertex.index_select(0, order), by_owner)
            askers = torch.split(rank.index_select(0, order), by_owner)
            for r in range(p):
                requests[r][li] = (ids[r], _bincount(askers[r], p))
    bottom = blocks[0].src_nodes.cpu()
    input_rows = (_bincount(own.index_select(0, bottom), p) if input_features == "shuffle" else list(layers[0].src))
    targets = list(layers[-1].dst)
    work = IterationWork(system="split", world_size=p, layers=layers, input_rows=input_rows, targets=targets)
    return SplitPlan(work=work, requests=requests if with_requests else [])


def dp_work(graph: Graph, sampler: NeighborSampler, global_seeds: torch.Tensor, batch_size: int, world_size: int,
            epoch: int = 0, iteration: int = 0) -> IterationWork:
    """Each data-parallel rank's micro-batch (``batch_size`` consecutive targets of ``global_seeds``), sampled.

    Example:
        >>> from gsplit import Graph, NeighborSampler
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> w = dp_work(g, NeighborSampler([-1]), torch.tensor([0, 2]), batch_size=1, world_size=2)
        >>> w.layers[0].edges, w.input_rows
        ([2, 2], [3, 3])
    """
    p, b = int(world_size), int(batch_size)
    per_rank = [sampler.sample_layers(graph, global_seeds[r * b:(r + 1) * b], epoch, iteration).blocks
                for r in range(p)]
    layers = [LayerWork(edges=[blocks[li].num_edges() for blocks in per_rank],
                        dst=[blocks[li].num_dst for blocks in per_rank],
                        src=[blocks[li].num_src_nodes() for blocks in per_rank],
                        recv_rows=[0] * p, send_rows=[0] * p) for li in range(sampler.num_layers)]
    return IterationWork(system="dp", world_size=p, layers=layers, input_rows=list(layers[0].src),
                         targets=list(layers[-1].dst), epoch=epoch, iteration=iteration)


def iteration_batches(train_idx: torch.Tensor, batch_size: int, world_size: int, seed: int = 0, epoch: int = 0,
                      iterations: Optional[int] = None, first: int = 0) -> Iterator[tuple]:
    """``(iteration, global mini-batch)`` exactly as the loaders of a run with ``seed`` draw them (shuffled)."""
    schedule = BatchSchedule(train_idx, batch_size, world_size, seed, shuffle=True)
    for it, seeds in schedule.numbered_batches(epoch, first):
        if iterations is not None and it >= first + iterations:
            break
        yield it, seeds


def count_work(graph: Graph, train_idx: torch.Tensor, sampler: NeighborSampler, batch_size: int, world_size: int,
               owner: Optional[torch.Tensor], iterations: int = 4, seed: int = 0, epoch: int = 0, first: int = 0,
               systems: Sequence[str] = ("split", "dp"), input_features: str = "shuffle") -> Dict[str, List[IterationWork]]:
    """Per system, the work of iterations ``first .. first + iterations - 1`` of ``epoch`` of a run with ``seed``
    (the sampler's seed and the loaders' ``ddp_seed``, as :class:`gsplit.run.trainer.TrainConfig` sets both).

    ``owner`` (the partition map's assignment) is needed for ``split``.

    Example:
        >>> import gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=2000, seed=0)
        >>> owner = gsplit.partition(ds.graph, 2, method="random").assignment
        >>> work = count_work(ds.graph, ds.train_idx, NeighborSampler([5, 5]), 64, 2, owner, iterations=1)
        >>> work["split"][0].total_edges == sum(sum(l.edges) for l in work["split"][0].layers)
        True
    """
    if "split" in systems and owner is None and world_size > 1:
        raise ValueError("split parallelism's work needs the partition map (owner); pass pmap.assignment")
    own = owner if owner is not None else torch.zeros(graph.num_nodes, dtype=torch.int64)
    out: Dict[str, List[IterationWork]] = {s: [] for s in systems}
    for it, seeds in iteration_batches(train_idx, batch_size, world_size, seed, epoch, iterations, first):
        if "split" in systems:
            blocks = sampler.sample_layers(graph, seeds, epoch, it).blocks
            work = split_plan(blocks, own, world_size, input_features).work
            work.epoch, work.iteration = epoch, it
            out["split"].append(work)
        if "dp" in systems:
            out["dp"].append(dp_work(graph, sampler, seeds, batch_size, world_size, epoch, it))
    return out
