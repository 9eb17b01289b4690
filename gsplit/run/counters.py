"""What a training rank counts over an epoch (:class:`EpochCounters`) and how the ranks' counts compare per
iteration (:func:`iteration_balance`): the bookkeeping behind every number of the trainer's run log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from gsplit.comm.communicator import Communicator
from gsplit.minibatch.rank_loader import IterationStats
from gsplit.runtime.timing import LayerSeconds


@dataclass
class EpochCounters:
    """One rank's counters summed over an epoch."""

    iterations: int = 0
    """Iterations run."""
    sample_s: float = 0.0
    """Seconds sampling (split: including id exchanges)."""
    load_s: float = 0.0
    """Seconds loading input features (split: including the first shuffle)."""
    train_s: float = 0.0
    """Seconds in forward, loss, backward, gradient all-reduce and optimiser step."""
    wait_s: float = 0.0
    """Seconds the training loop waited for the loader (with prefetch: loading that training did not hide)."""
    input_rows: int = 0
    """Input-feature rows loaded."""
    cache_hits: int = 0
    """Input-feature rows served from the rank's feature cache (split only)."""
    cache_misses: int = 0
    """Input-feature rows read from host memory (split only)."""
    edges: List[int] = field(default_factory=list)
    """Edges computed per layer."""
    dst_vertices: List[int] = field(default_factory=list)
    """Vertices computed per layer."""
    traffic_rows: Dict[str, int] = field(default_factory=dict)
    """Rows sent to other ranks per tag (id exchanges and shuffles, forward and backward)."""
    traffic_bytes: Dict[str, int] = field(default_factory=dict)
    """Bytes sent to other ranks per tag."""
    gradient_bytes: int = 0
    """Bytes this rank sent in the gradient all-reduces (over every rank of the job; the only traffic
    between hosts), as :func:`gsplit.allreduce_gradients` counts them."""
    layer_fwd_s: List[float] = field(default_factory=list)
    """Seconds computing each layer's forward (:class:`gsplit.runtime.timing.LayerClock`: the activation and dropout
    after it included, shuffles and waits for peers left out)."""
    layer_bwd_s: List[float] = field(default_factory=list)
    """Seconds computing each layer's backward (waits for returning gradients left out)."""
    per_iteration: List[dict] = field(default_factory=list)
    """One record per iteration (when ``TrainConfig.log_iterations``): the loader's counters, ``train_s``,
    the traffic sent during that iteration (sampling id exchanges and shuffles, fwd and bwd) and
    ``minor_faults``, the pages it mapped in fresh (a fresh rank's first iterations fault its heap in)."""

    def add_iteration(self, stats: IterationStats) -> None:
        self.iterations += 1
        self.sample_s += stats.sample_s
        self.load_s += stats.load_s
        self.wait_s += stats.wait_s
        self.input_rows += stats.input_rows
        self.cache_hits += stats.cache_hits
        self.cache_misses += stats.cache_misses
        if not self.edges:
            self.edges = [0] * len(stats.edges)
            self.dst_vertices = [0] * len(stats.dst_vertices)
        self.edges = [a + b for a, b in zip(self.edges, stats.edges)]
        self.dst_vertices = [a + b for a, b in zip(self.dst_vertices, stats.dst_vertices)]


def _sum_tags(dicts) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for d in dicts:
        for tag, n in d.items():
            out[tag] = out.get(tag, 0) + n
    return dict(sorted(out.items()))


def _max_over_mean(values: List[float]) -> float:
    mean = sum(values) / len(values)
    return max(values) / mean if mean else 1.0


def iteration_balance(per_rank: List[dict]) -> dict:
    """Per iteration, max and mean over ranks of each layer's edges, of the seconds spent in each
    collective and of the training step's compute (the per-rank records are gathered once per epoch
    anyway: no collective of its own).

    ``max / mean`` is what the slowest rank costs: 1.0 is perfect balance. A rank's compute is its
    ``train_s`` minus the seconds inside the step's collectives (``step_collective_s``: layer shuffles
    forward and backward, gradient all-reduce; with gloo these hold the transfer and the waiting, with
    NCCL only the enqueue, so there compute includes the waits). Per iteration, ``compute_gap_s`` (max -
    mean of compute) is what the average rank waits for the slowest one at least; ``edges_gap_s`` is the
    part the map's imbalance explains if compute followed the edges (mean compute x (max/mean of the
    ranks' edges over all layers - 1)); the rest, ``noise_gap_s``, is the ranks' different speed on the
    same work (shared cores, caches). Per collective, the least seconds over ranks are the transfer
    (the last rank to arrive waits for no one) and the mean beyond it the waiting: ``transfer_s_by_tag``
    and ``wait_s_by_tag`` over the epoch.

    Per layer (:class:`gsplit.runtime.timing.LayerClock`'s ``layer_fwd_s`` / ``layer_bwd_s`` of each rank, waits
    left out): max and mean over ranks of its forward, backward and both (``layer_s_*``), and its gap
    ``layer_gap_s`` (max - mean of fwd + bwd), split like the step's into ``layer_edges_gap_s`` (the layer's
    mean time x (its edges max/mean - 1)) and ``layer_noise_gap_s`` (the rest): which layer a slow rank is
    slow in, and whether the map or the cores made it slow. Returns the per-iteration records, their
    averages over the epoch (ratios) and their sums (seconds).

    Example:
        >>> r = lambda e: {"per_iteration": [{"iteration": 0, "edges": e, "train_s": 1.0,
        ...                                   "collective_s_by_tag": {}}]}
        >>> iteration_balance([r([30, 10]), r([10, 10])])["edges_max_over_mean"]
        [1.5, 1.0]
    """
    records = []
    for its in zip(*(r["per_iteration"] for r in per_rank)):
        layers = range(len(its[0]["edges"]))
        edges = [[it["edges"][layer] for it in its] for layer in layers]
        tags = sorted(set().union(*(it.get("collective_s_by_tag", {}) for it in its)))
        seconds = {tag: [it.get("collective_s_by_tag", {}).get(tag, 0.0) for it in its] for tag in tags}
        compute = [max(0.0, it["train_s"] - it.get("step_collective_s", 0.0)) for it in its]
        compute_mean = sum(compute) / len(compute)
        rank_edges = [sum(it["edges"]) for it in its]
        edges_gap = compute_mean * (_max_over_mean(rank_edges) - 1.0)
        per_layer = _layer_balance(its, edges)
        records.append({
            "iteration": its[0]["iteration"],
            "edges_max": [max(e) for e in edges], "edges_mean": [sum(e) / len(e) for e in edges],
            "edges_max_over_mean": [_max_over_mean(e) for e in edges],
            "train_s_max": max(it["train_s"] for it in its),
            "train_s_mean": sum(it["train_s"] for it in its) / len(its),
            "collective_s_max": {tag: max(v) for tag, v in seconds.items()},
            "collective_s_mean": {tag: sum(v) / len(v) for tag, v in seconds.items()},
            "collective_s_min": {tag: min(v) for tag, v in seconds.items()},
            "step_collective_s_max": max(it.get("step_collective_s", 0.0) for it in its),
            "step_collective_s_mean": sum(it.get("step_collective_s", 0.0) for it in its) / len(its),
            "compute_s_max": max(compute), "compute_s_mean": compute_mean,
            "compute_s_max_over_mean": _max_over_mean(compute),
            "compute_gap_s": max(compute) - compute_mean, "edges_gap_s": edges_gap,
            "noise_gap_s": max(compute) - compute_mean - edges_gap, **per_layer})
    n = max(len(records), 1)
    tags = sorted(set().union(*(r["collective_s_mean"] for r in records)))
    num_layers = len(records[0]["edges_max"]) if records else 0
    return {"per_iteration": records,
            "edges_max_over_mean": [sum(r["edges_max_over_mean"][layer] for r in records) / n
                                    for layer in range(num_layers)],
            "train_s_max_over_mean": sum(r["train_s_max"] / r["train_s_mean"] if r["train_s_mean"] else 1.0
                                         for r in records) / n,
            "compute_s_max_over_mean": sum(r["compute_s_max_over_mean"] for r in records) / n,
            **{key: sum(r[key] for r in records) for key in ("compute_s_mean", "step_collective_s_mean",
                                                             "compute_gap_s", "edges_gap_s", "noise_gap_s")},
            "layer_s_max_over_mean": [sum(r["layer_s_max_over_mean"][layer] for r in records) / n
                                      for layer in range(num_layers)],
            **{key: [sum(r[key][layer] for r in records) for layer in range(num_layers)] for key in _LAYER_SECONDS},
            # in a collective the last rank to arrive waits for no one: the least seconds over ranks are the
            # transfer, the mean beyond it the waiting for the slowest (exact in lockstep, gloo)
            "transfer_s_by_tag": {tag: sum(r["collective_s_min"].get(tag, 0.0) for r in records) for tag in tags},
            "wait_s_by_tag": {tag: sum(r["collective_s_mean"].get(tag, 0.0) - r["collective_s_min"].get(tag, 0.0)
                                       for r in records) for tag in tags}}


_LAYER_SECONDS = ("layer_fwd_s_max", "layer_fwd_s_mean", "layer_bwd_s_max", "layer_bwd_s_mean", "layer_s_max",
                  "layer_s_mean", "layer_gap_s", "layer_edges_gap_s", "layer_noise_gap_s")
"""The per-layer seconds of :func:`iteration_balance`'s records, summed over the epoch."""


def _layer_balance(its, edges: List[List[int]]) -> dict:
    """One iteration's per-layer time balance over ranks (``its``: the ranks' records, ``edges[layer][rank]``)."""
    num_layers = len(edges)

    def padded(it, key):  # a record without layer times (an older log, an untimed step) counts zeros
        values = list(it.get(key) or [])
        return values + [0.0] * (num_layers - len(values))

    fwd = [[padded(it, "layer_fwd_s")[layer] for it in its] for layer in range(num_layers)]
    bwd = [[padded(it, "layer_bwd_s")[layer] for it in its] for layer in range(num_layers)]
    both = [[f + b for f, b in zip(fwd[layer], bwd[layer])] for layer in range(num_layers)]
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    gap = [max(t) - mean(t) for t in both]
    edges_gap = [mean(t) * (_max_over_mean(e) - 1.0) for t, e in zip(both, edges)]
    return {"layer_fwd_s_max": [max(t) for t in fwd], "layer_fwd_s_mean": [mean(t) for t in fwd],
            "layer_bwd_s_max": [max(t) for t in bwd], "layer_bwd_s_mean": [mean(t) for t in bwd],
            "layer_s_max": [max(t) for t in both], "layer_s_mean": [mean(t) for t in both],
            "layer_s_max_over_mean": [_max_over_mean(t) for t in both], "layer_gap_s": gap,
            "layer_edges_gap_s": edges_gap, "layer_noise_gap_s": [g - e for g, e in zip(gap, edges_gap)]}


def _collective_seconds(*comms: Communicator) -> float:
    """Seconds spent so far inside the collectives of ``comms`` (all tags, the gradient all-reduce included)."""
    return sum(sum(c.traffic.seconds.values()) for c in comms)


def _faults_between(before: Optional[int], now: Optional[int]) -> Optional[int]:
    """Minor page faults between two readings of :func:`gsplit.runtime.resources.minor_page_faults`: in a per-iteration
    record, the pages that iteration (its sampling, loading and step, and a prefetch thread's work meanwhile)
    mapped in fresh; None where the count is not available."""
    return None if now is None or before is None else now - before


def _book_train_time(counters: "EpochCounters", steps) -> None:
    """Add the ``(per-iteration record index or None, seconds)`` of timed training steps to ``counters``."""
    for index, seconds in steps:
        counters.train_s += seconds
        if index is not None:
            counters.per_iteration[index]["train_s"] = seconds


def _book_layer_time(counters: "EpochCounters", steps: List[Tuple[Optional[int], LayerSeconds]]) -> None:
    """Add each layer's forward / backward seconds of timed steps to ``counters`` (and their iteration records)."""
    for index, seconds in steps:
        for total, part in ((counters.layer_fwd_s, seconds.forward), (counters.layer_bwd_s, seconds.backward)):
            total.extend([0.0] * (len(part) - len(total)))
            for layer, s in enumerate(part):
                total[layer] += s
        if index is not None:
            counters.per_iteration[index].update(layer_fwd_s=seconds.forward, layer_bwd_s=seconds.backward)
