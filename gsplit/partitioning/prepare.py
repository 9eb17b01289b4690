"""``prepare_partition``: the whole offline half in one call (pre-sample, partition, measure, save).

``gsplit prepare``, ``gsplit train`` (when it makes a map on the fly) and the experiments all call it,
so there is one definition of what a prepared map is and of which batch size it was made for.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from gsplit.runtime.io import atomic_write_json
from gsplit.partitioning.budget import METIS_EDGES_PER_VERTEX, prepare_peak_bytes, resolve_metis_bound
from gsplit.partitioning.partition_map import PartitionMap
from gsplit.partitioning.presample import presample
from gsplit.partitioning.stats import split_stats
from gsplit.partitioning.strategies import partition
from gsplit.partitioning.weights import PresampleWeights
from gsplit.runtime.resources import HostMemoryMeter, require_memory, return_freed_heap
from gsplit.runtime.resources import cpu_seconds as cpu_now
from gsplit.sampling.neighbor import NeighborSampler

log = logging.getLogger(__name__)

PRESAMPLING_METHODS = ("gsplit", "node")
"""Partition methods whose vertex (and edge) weights come from pre-sampling."""


PREPARE_NS_PER_EDGE = {"weights": 450, "partition": 2500, "stats": 500}
"""Wall nanoseconds per stored edge of each stage (4 parts, fanouts 15,10,5, batch 1024) on the
2-core development machine, from ``experiments/results/scale.json``: only for the estimates of the time
left that the CLI shows, never for decisions."""


def estimated_stage_seconds(stage: str, num_edges: int) -> float:
    """Expected wall seconds of a prepare stage (``weights``, ``partition``, ``stats``) on ``num_edges`` edges.

    Example:
        >>> round(estimated_stage_seconds("partition", 15_000_000), 1)
        37.5
    """
    return PREPARE_NS_PER_EDGE[stage] * 1e-9 * int(num_edges)


@dataclass
class PreparedPartition:
    """The outcome of :func:`prepare_partition`."""

    pmap: PartitionMap
    """The partition map, one part per rank."""
    weights: Optional[PresampleWeights]
    """The pre-sampling weights it was made from (``None`` for methods that do not pre-sample); the
    feature cache orders vertices by their ``vertex_weights``."""
    report: dict
    """JSON-ready summary: method, sizes, seconds per stage, and split statistics when measured."""


def prepare_partition(dataset, num_parts: int, fanouts: Sequence[int], batch_size: int, method: str = "gsplit",
                      seed: int = 0, presample_epochs: int = 10, out: Union[str, Path, None] = None,
                      stats_batches: int = 20, weights: Optional[PresampleWeights] = None,
                      progress: Optional[Callable[[str], None]] = None,
                      presample_method: str = "expected",
                      metis_edges_per_vertex: Union[float, str, None] = METIS_EDGES_PER_VERTEX) -> PreparedPartition:
    """Pre-sample (if ``method`` needs it), partition into ``num_parts``, measure, and save under ``out``.

    ``batch_size`` is targets **per rank**, as for the loaders; pre-sampling and statistics use the
    global mini-batch ``batch_size * num_parts``, as training does. ``presample_method`` is
    ``"expected"`` (default: the weights in closed form, seconds) or ``"sampled"`` (run the sampler for
    ``presample_epochs`` epochs); see :func:`gsplit.presample`. ``weights`` from an earlier call on the
    same graph and sampler skip pre-sampling. ``stats_batches=0`` skips the split statistics.
    Before any work it checks that the host has the memory the stages need on top of the loaded dataset
    (:func:`prepare_peak_bytes`) and raises :class:`gsplit.runtime.resources.InsufficientMemoryError` otherwise.
    ``progress(message)`` is told each stage as it starts and, with its time, as it ends (the CLI
    prints them); ``report["seconds"]`` keeps the wall times and ``report["cpu_seconds"]`` the
    CPU times (all threads, and the METIS process's), which a busy shared machine inflates far less.
    ``metis_edges_per_vertex`` bounds METIS's input (see :func:`gsplit.partition`).
    ``report["host_peak_mb"]`` is the host memory that this process and the METIS process held together
    at their peak during the call (sum of PSS, :class:`gsplit.runtime.resources.HostMemoryMeter`),
    ``report["metis_private_peak_mb"]`` the METIS process's own (private) pages at its peak.

    Example:
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=2000)                     # doctest: +SKIP
        >>> prepared = prepare_partition(ds, 2, [10, 5], batch_size=64, out="parts/s2")  # doctest: +SKIP
    """
    say = progress or (lambda message: log.info("%s", message))
    graph = dataset.graph
    metis_edges_per_vertex = resolve_metis_bound(graph.num_nodes, graph.num_edges, metis_edges_per_vertex)
    require_memory(prepare_peak_bytes(graph.num_nodes, graph.num_edges, metis_edges_per_vertex),
                   f"preparing a partition of {graph.num_nodes:,} vertices and {graph.num_edges:,} edges "
                   "(on top of the loaded dataset)")
    # a dataset generated or converted in this process leaves hundreds of MB freed but resident, which
    # METIS's fork would otherwise hold on to as well (measured: 520 vs 250 MB resident before pre-sampling at 1M)
    return_freed_heap()
    with HostMemoryMeter() as meter:
        prepared = _prepare(dataset, num_parts, fanouts, batch_size, method, seed, presample_epochs, out,
                            stats_batches, weights, say, progress is not None, presample_method,
                            metis_edges_per_vertex)
    report = prepared.report
    report["host_peak_mb"] = round(meter.peak_bytes / 2**20, 1)
    report["metis_private_peak_mb"] = round(max((p["private"] for p in meter.children_peak.values()), default=0)
                                            / 2**20, 1)
    if out is not None:
        atomic_write_json(Path(out) / "prepare.json", report)
    return prepared


def _prepare(dataset, num_parts, fanouts, batch_size, method, seed, presample_epochs, out, stats_batches, weights,
             say, show_progress, presample_method, metis_edges_per_vertex) -> PreparedPartition:
    fanouts = [int(f) for f in fanouts]
    sampler = NeighborSampler(fanouts, seed=seed)
    global_batch = int(batch_size) * int(num_parts)
    seconds: dict = {}
    cpu_seconds: dict = {}  # process CPU time (all threads) per stage: on a shared machine, wall time
    # measures the neighbours' load as much as this work
    if method in PRESAMPLING_METHODS and weights is None:
        t, c = time.perf_counter(), cpu_now()
        if presample_method == "expected":
            say(f"expected pre-sampling weights (global batch {global_batch}, fanouts {fanouts}) ...")
        else:
            say(f"pre-sampling {presample_epochs} epochs (global batch {global_batch}, fanouts {fanouts}) ...")
        weights = presample(dataset.graph, dataset.train_idx, sampler, batch_size=batch_size, num_parts=num_parts,
                            epochs=presample_epochs, seed=seed, progress=show_progress, method=presample_method)
        seconds["presample"], cpu_seconds["presample"] = time.perf_counter() - t, cpu_now() - c
        say(f"  pre-sampling weights: {seconds['presample']:.1f}s (CPU {cpu_seconds['presample']:.1f}s)")
    used_weights = weights if method in PRESAMPLING_METHODS else None
    t, c = time.perf_counter(), cpu_now()
    say(f"partitioning into {num_parts} parts with method {method} ...")
    pmap = partition(dataset.graph, num_parts, method=method, weights=used_weights, train_idx=dataset.train_idx,
                     seed=seed, sampler=sampler, batch_size=batch_size, metis_edges_per_vertex=metis_edges_per_vertex)
    seconds["partition"], cpu_seconds["partition"] = time.perf_counter() - t, cpu_now() - c
    stages, cpu = pmap.metadata.get("stage_seconds", {}), pmap.metadata.get("stage_cpu_seconds", {})
    detail = ", ".join(f"{name.replace('_', ' ')} {sec:.1f}s (CPU {cpu.get(name, 0.0):.1f}s)"
                       for name, sec in stages.items())
    say(f"  partitioning: {seconds['partition']:.1f}s (CPU {cpu_seconds['partition']:.1f}s)"
        + (f": {detail}" if detail else ""))
    report = {"dataset": getattr(dataset, "name", None), "num_parts": int(num_parts), "method": method,
              "fanouts": fanouts, "batch_size": int(batch_size),
              "presample_method": None if used_weights is None else used_weights.metadata.get("method", "sampled"),
              "presample_epochs": used_weights.epochs if used_weights is not None else 0,
              "presample_s": seconds.get("presample", 0.0), "partition_s": seconds["partition"],
              "partition_stage_s": stages, "metis_entries": pmap.metadata.get("metis_adjacency_entries"),
              "metis_entries_in": pmap.metadata.get("metis_entries_in"),
              "metis_edges_per_vertex": pmap.metadata.get("metis_edges_per_vertex")}
    if stats_batches:
        t, c = time.perf_counter(), cpu_now()
        say(f"split statistics on {stats_batches} sampled mini-batches ...")
        stats = split_stats(dataset.graph, pmap, sampler, dataset.train_idx, global_batch,
                            num_batches=stats_batches, seed=seed)
        report["stats"] = stats.to_dict()
        seconds["stats"] = report["stats_s"] = time.perf_counter() - t
        cpu_seconds["stats"] = cpu_now() - c
        say(f"  split statistics: {seconds['stats']:.1f}s (CPU {cpu_seconds['stats']:.1f}s)")
    if out is not None:  # every file atomic; each folder's metadata file lands last (gsplit.runtime.io)
        t = time.perf_counter()
        out = Path(out)
        pmap.save(out)
        if used_weights is not None:  # the GPU feature cache orders vertices by these frequencies
            used_weights.save(out)
        seconds["save"] = time.perf_counter() - t
    report["seconds"] = {k: round(v, 3) for k, v in seconds.items()}
    report["cpu_seconds"] = {k: round(v, 3) for k, v in cpu_seconds.items()}
    report["total_s"] = round(sum(seconds.values()), 3)
    say(f"prepared in {report['total_s']:.1f}s (" + ", ".join(f"{k} {v:.1f}s" for k, v in seconds.items())
        + f"; CPU {sum(cpu_seconds.values()):.1f}s)")
    return PreparedPartition(pmap, used_weights, report)
