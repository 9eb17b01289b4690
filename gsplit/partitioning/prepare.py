"""``prepare_partition``: the whole offline half in one call (pre-sample, partition, measure, save).

``gsplit prepare``, ``gsplit train`` (when it makes a map on the fly) and the experiments all call it,
so there is one definition of what a prepared map is and of which batch size it was made for.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Union

from gsplit.io import atomic_write_json
from gsplit.partitioning.metis import partition
from gsplit.partitioning.partition_map import PartitionMap
from gsplit.partitioning.presample import PresampleWeights, presample
from gsplit.partitioning.stats import split_stats
from gsplit.sampling.neighbor import NeighborSampler

log = logging.getLogger(__name__)

PRESAMPLING_METHODS = ("gsplit", "node")
"""Partition methods whose vertex (and edge) weights come from pre-sampling."""


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
                      progress: Optional[Callable[[str], None]] = None) -> PreparedPartition:
    """Pre-sample (if ``method`` needs it), partition into ``num_parts``, measure, and save under ``out``.

    ``batch_size`` is targets **per rank**, as for the loaders; pre-sampling and statistics use the
    global mini-batch ``batch_size * num_parts``, as training does. ``weights`` from an earlier call on
    the same graph and sampler skip pre-sampling. ``stats_batches=0`` skips the split statistics.
    ``progress(message)`` is told each stage as it starts and ends (the CLI prints them).

    Example:
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=2000)                     # doctest: +SKIP
        >>> prepared = prepare_partition(ds, 2, [10, 5], batch_size=64, out="parts/s2")  # doctest: +SKIP
    """
    say = progress or (lambda message: log.info("%s", message))
    fanouts = [int(f) for f in fanouts]
    sampler = NeighborSampler(fanouts, seed=seed)
    global_batch = int(batch_size) * int(num_parts)
    t0 = time.perf_counter()
    if method in PRESAMPLING_METHODS and weights is None:
        say(f"pre-sampling {presample_epochs} epochs (global batch {global_batch}, fanouts {fanouts})")
        weights = presample(dataset.graph, dataset.train_idx, sampler, batch_size=global_batch,
                            epochs=presample_epochs, seed=seed, progress=progress is not None)
    used_weights = weights if method in PRESAMPLING_METHODS else None
    t1 = time.perf_counter()
    say(f"partitioning into {num_parts} parts with method {method}")
    pmap = partition(dataset.graph, num_parts, method=method, weights=used_weights, train_idx=dataset.train_idx,
                     seed=seed, sampler=sampler, batch_size=global_batch)
    t2 = time.perf_counter()
    report = {"dataset": getattr(dataset, "name", None), "num_parts": int(num_parts), "method": method,
              "fanouts": fanouts, "batch_size": int(batch_size),
              "presample_epochs": presample_epochs if used_weights is not None else 0,
              "presample_s": t1 - t0, "partition_s": t2 - t1}
    if stats_batches:
        stats = split_stats(dataset.graph, pmap, sampler, dataset.train_idx, global_batch,
                            num_batches=stats_batches, seed=seed)
        report["stats"] = stats.to_dict()
        report["stats_s"] = time.perf_counter() - t2
    say(f"pre-sampling {report['presample_s']:.1f}s, partitioning {report['partition_s']:.1f}s")
    if out is not None:  # every file atomic; each folder's metadata file lands last (gsplit.io)
        out = Path(out)
        pmap.save(out)
        if used_weights is not None:  # the GPU feature cache orders vertices by these frequencies
            used_weights.save(out)
        atomic_write_json(out / "prepare.json", report)
    return PreparedPartition(pmap, used_weights, report)
