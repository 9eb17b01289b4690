"""Timing the sampler: used by ``gsplit bench`` and ``experiments/bench_sampler.py``."""

from __future__ import annotations

import statistics
import time

import torch

from gsplit.data.graph import Graph
from gsplit.sampling.batches import global_batches
from gsplit.sampling.neighbor import NeighborSampler


def time_sampler(graph: Graph, targets: torch.Tensor, sampler: NeighborSampler, batch_size: int,
                 num_batches: int = 20, warmup: int = 2, seed: int = 0) -> dict:
    """Median wall time of ``sampler.sample_blocks`` over ``num_batches`` mini-batches of ``targets``.

    Example:
        >>> time_sampler(g, train_idx, NeighborSampler([15, 10, 5]), 1024)["ms_per_batch"]  # doctest: +SKIP
    """
    times, edges = [], []
    it = 0
    epoch = 0
    while len(times) < num_batches:
        for seeds in global_batches(targets, batch_size, seed, epoch, drop_last=True):
            t = time.perf_counter()
            blocks = sampler.sample_blocks(graph, seeds, epoch=epoch, iteration=it)
            dt = time.perf_counter() - t
            it += 1
            if it > warmup:
                times.append(dt)
                edges.append(sum(b.num_edges() for b in blocks))
            if len(times) == num_batches:
                break
        else:
            if it == 0:
                raise ValueError(f"targets ({targets.numel()}) hold fewer than one batch of {batch_size}")
        epoch += 1
    med = statistics.median(times)
    return {"ms_per_batch": 1e3 * med, "ms_mean": 1e3 * statistics.fmean(times), "ms_min": 1e3 * min(times),
            "edges_per_batch": statistics.fmean(edges), "edges_per_s": statistics.fmean(edges) / med,
            "num_batches": num_batches, "batch_size": batch_size, "fanouts": list(sampler.fanouts)}
