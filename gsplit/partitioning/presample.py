"""Pre-sampling: estimate how often each vertex and edge takes part in a mini-batch.

GSplit's partitioner needs, per vertex, the expected computation it causes and, per edge, the expected
communication it causes if its endpoints land on different GPUs. Both are estimated by running the
training sampler for a few epochs and counting (see :class:`PresampleWeights` for the exact counts).
"""

from __future__ import annotations

import logging
import time
from typing import Iterable, List, Optional, Tuple

import torch

from gsplit.data.graph import Graph
from gsplit.interop.graphs import as_graph, as_sampler  # DGLGraph / PyG Data in; imports neither library
from gsplit.partitioning.expected import expected_presample
from gsplit.partitioning.weights import PresampleWeights, check_train_idx
from gsplit.sampling.batches import global_batches

log = logging.getLogger(__name__)

# Sampled ids are buffered and counted with one bincount per chunk: a bincount per mini-batch would
# allocate a full ``[num_edges]`` result every time, which dominates on large graphs. A chunk holds at
# least as many ids as the count has entries (so that cost is amortised), and at least this many.
_MIN_FLUSH_ENTRIES = 1 << 22


class _Counter:
    """Accumulates ``bincount`` of id chunks into a running count of fixed length."""

    def __init__(self, size: int, device):
        self.size = size
        self.counts = torch.zeros(size, dtype=torch.int64, device=device)
        self.pending: List[torch.Tensor] = []
        self.num_pending = 0
        self.flush_at = max(_MIN_FLUSH_ENTRIES, size)

    def add(self, ids: torch.Tensor) -> None:
        self.pending.append(ids)
        self.num_pending += ids.numel()
        if self.num_pending >= self.flush_at:
            self.flush()

    def flush(self) -> torch.Tensor:
        if self.pending:
            self.counts += torch.bincount(torch.cat(self.pending), minlength=self.size)
            self.pending, self.num_pending = [], 0
        return self.counts


def _batch_use(blocks) -> Tuple[List[torch.Tensor], List[Tuple[torch.Tensor, torch.Tensor]]]:
    """Per mini-batch: the vertices of each level (input level first), and per layer the (dst global id,
    edge id) of every edge. ``blocks`` is what ``sample_blocks`` returns, input layer first."""
    levels = [blocks[0].src_nodes] + [b.dst_nodes for b in blocks]
    return levels, [(b.dst_nodes[b.edge_dst], b.edge_ids) for b in blocks]


PRESAMPLE_METHODS = ("sampled", "expected")
"""Names accepted by :func:`presample`'s ``method``."""


def presample(graph: Graph, train_idx, sampler, batch_size: int, epochs: int = 10, seed: int = 0,
              progress: bool = False, *, num_parts: int = 1, method: str = "sampled") -> PresampleWeights:
    """How often each vertex and edge takes part in a mini-batch: sampled (counted) or expected (exact).

    ``batch_size`` is targets **per rank** and ``num_parts`` the number of ranks (parts): mini-batches
    have ``batch_size * num_parts`` targets, the global mini-batch of split-parallel training (with the
    default ``num_parts=1``, ``batch_size`` is the whole mini-batch). ``PresampleWeights.batch_size``
    holds that global size; ``metadata`` keeps ``num_parts`` and ``batch_size_per_rank``.

    ``method="sampled"`` runs ``sampler`` over the training vertices for ``epochs`` epochs and counts.
    Each epoch is the loaders' global order of ``train_idx`` for ``(seed, epoch)``
    (:func:`gsplit.sampling.batches.global_batches`) cut into mini-batches (the last may be short);
    batch ``i`` of epoch ``e`` is sampled with ``sampler.sample_blocks(graph, seeds, e, i)``. See
    :class:`PresampleWeights` for what is counted. Any object with
    ``sample_blocks(graph, seeds, epoch, iteration)`` returning the blocks works.

    ``method="expected"`` computes the expectations those counts estimate in closed form
    (:func:`gsplit.partitioning.expected.expected_presample`), a few passes over the edges per layer:
    no sampling noise, seconds instead of minutes on a 20M-edge graph. It needs a
    :class:`~gsplit.sampling.NeighborSampler`; ``epochs``, ``seed`` and ``progress`` do not apply, and
    the result has ``num_batches == epochs == 0`` (every weight is an expected value per mini-batch,
    averaged over an epoch's batches as the sampled counts are).

    Example:
        >>> from gsplit import Graph, NeighborSampler
        >>> g = Graph.from_edges([0, 1, 2], [1, 2, 0], symmetric=True)
        >>> w = presample(g, torch.tensor([0]), NeighborSampler([-1]), batch_size=1, epochs=1)
        >>> w.vertex_weights.tolist(), w.num_batches
        ([2.0, 1.0, 1.0], 1)
        >>> presample(g, torch.tensor([0]), NeighborSampler([-1]), batch_size=1, method="expected").vertex_weights.tolist()
        [2.0, 1.0, 1.0]
    """
    graph, sampler = as_graph(graph), as_sampler(sampler)
    if method not in PRESAMPLE_METHODS:
        raise ValueError(f"unknown pre-sampling method {method!r}; use one of {', '.join(PRESAMPLE_METHODS)}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size={batch_size}; pass a positive number of targets per rank")
    if int(num_parts) < 1:
        raise ValueError(f"num_parts={num_parts}; pass the number of ranks (parts), at least 1")
    per_rank, num_parts = int(batch_size), int(num_parts)
    batch_size = per_rank * num_parts
    if method == "expected":
        weights = expected_presample(graph, train_idx, sampler, batch_size)
        weights.metadata.update(num_parts=num_parts, batch_size_per_rank=per_rank)
        return weights
    train_idx = check_train_idx(graph, train_idx)
    if int(epochs) < 1:
        raise ValueError(f"epochs={epochs}; pre-sampling needs at least one epoch")
    batch_size, epochs = int(batch_size), int(epochs)
    per_epoch = -(-train_idx.numel() // batch_size)
    t0 = time.perf_counter()

    batches = (sampler.sample_blocks(graph, seeds, epoch, it) for epoch in range(epochs)
               for it, seeds in enumerate(global_batches(train_idx, batch_size, seed, epoch)))
    level_w, load_w, edge_w, num_batches = count_blocks(graph, batches, epochs * per_epoch if progress else 0)
    elapsed = time.perf_counter() - t0
    log.info("pre-sampled %d mini-batches (%d epochs of %d targets) in %.1fs", num_batches, epochs, batch_size, elapsed)
    fanouts = getattr(sampler, "fanouts", None)
    cfg = sampler.to_config() if hasattr(sampler, "to_config") else {"repr": repr(sampler)}
    return PresampleWeights(
        vertex_weights=level_w.sum(0),
        edge_weights=edge_w,
        level_vertex_weights=level_w,
        layer_edge_load=load_w,
        num_batches=num_batches,
        batch_size=batch_size,
        epochs=epochs,
        fanouts=None if fanouts is None else [int(f) for f in fanouts],
        graph_fingerprint=graph.fingerprint(),
        metadata={"method": "sampled", "seed": int(seed), "seconds": round(elapsed, 3), "sampler": cfg,
                  "num_train": int(train_idx.numel()), "num_parts": num_parts, "batch_size_per_rank": per_rank},
    )


def count_blocks(graph: Graph, batches: Iterable[List], progress_total: int = 0):
    """Count what sampled pre-sampling counts over ``batches`` (each the blocks of one mini-batch, input layer
    first): ``(level_vertex_weights, layer_edge_load, edge_weights, num_batches)``, the first three averaged
    per mini-batch (see :class:`PresampleWeights`). ``progress_total > 0`` shows a progress bar of that length.
    :func:`presample` counts node mini-batches with it, :func:`gsplit.link.presample.presample_edges` edge ones.

    Example:
        >>> from gsplit import Graph, NeighborSampler
        >>> g = Graph.from_edges([0, 1, 2], [1, 2, 0], symmetric=True)
        >>> levels, loads, edges, n = count_blocks(g, [NeighborSampler([-1]).sample_blocks(g, torch.tensor([0]))])
        >>> levels.sum(0).tolist(), n
        ([2.0, 1.0, 1.0], 1)
    """
    n, dev = graph.num_nodes, graph.device
    levels: Optional[List[_Counter]] = None
    loads: Optional[List[_Counter]] = None
    edges = _Counter(graph.num_edges, dev)
    bar = None
    if progress_total:
        from tqdm.auto import tqdm

        bar = tqdm(total=progress_total, desc="pre-sampling", unit="batch")
    num_batches = 0
    for blocks in batches:
        level_nodes, layer_edges = _batch_use(blocks)
        if levels is None:
            levels = [_Counter(n, dev) for _ in range(len(level_nodes))]
            loads = [_Counter(n, dev) for _ in range(len(layer_edges))]
        elif len(level_nodes) != len(levels):
            raise ValueError(f"the sampler returned {len(layer_edges)} blocks after {len(levels) - 1} before; "
                             "it must return one block per layer every time")
        for l, nodes in enumerate(level_nodes):
            levels[l].add(nodes)
        for l, (dst, eids) in enumerate(layer_edges):
            loads[l].add(dst)
            edges.add(eids)
        num_batches += 1
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if num_batches == 0:
        raise ValueError("no mini-batch to count; pre-sampling needs at least one")
    inv = 1.0 / num_batches
    level_w = torch.stack([c.flush() for c in levels]).to(torch.float32).mul_(inv).cpu()
    load_w = torch.stack([c.flush() for c in loads]).to(torch.float32).mul_(inv).cpu()
    edge_w = edges.flush().to(torch.float32).mul_(inv).cpu()
    return level_w, load_w, edge_w, num_batches
