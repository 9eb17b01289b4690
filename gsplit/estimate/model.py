"""The cost model of one training iteration, for split parallelism and data parallelism, per rank and per layer.

An iteration is a sequence of compute steps (per rank, seconds from :class:`DeviceProfile` coefficients
times the rank's counted work, :mod:`gsplit.estimate.work`) and collectives (seconds from
:class:`~gsplit.estimate.links.LinkProfile`). Ranks run in lockstep between collectives: a collective
starts when the last rank arrives, so the others wait (split: at every id exchange and every shuffle;
data parallelism: once, at the gradient all-reduce). The iteration's time is the sum over intervals of the
slowest rank's compute plus the collectives. Where ranks share cores (CPU ranks on fewer cores than ranks,
``DeviceProfile.cores``) an interval runs as processor sharing: a rank that waits gives its core away.

ASSUMPTIONS (all of them, in one place):

1. Work is exact (counted from the same mini-batches a run samples); time is linear in it. Sampling a
   layer costs ``a * edges + b * mixed-frontier rows + c * ids exchanged + d``; loading costs input rows x
   feature bytes over the link's ``host_bw`` plus a fixed cost; a layer's forward and its backward each
   cost ``k_e * edge-elements + k_m * multiply-adds + k_r * row-elements + k_c + k_x * edge-elements whose
   source rows are beyond the last-level cache`` (:func:`layer_features`; the cache term on CPUs only),
   with one set of coefficients per model family and direction; the step (loss, optimiser, Python) costs
   ``p * parameters + q``. Coefficients come from one-device timings (:mod:`gsplit.estimate.calibrate`).
2. One rank computes one thing at a time (no prefetch thread, no overlapped layers: the model predicts
   ``gsplit train --no-overlap``; overlap can at most hide the shuffle terms it reports).
3. A collective costs latency + bytes / bandwidth, bytes being the largest a rank sends or receives;
   everyone leaves it together. Around each split shuffle a rank copies rows in its own memory (the rows it
   sends, its own rows of the mixed frontier, what it receives) at ``DeviceProfile.copy_bw`` (timed with
   the shares' real shuffle plans, on a CPU as on a GPU: on the H100 they were mostly fixed costs per shuffle,
   which one bandwidth spreads over the bytes). The first exchange under a tag (which takes two
   all-to-alls, see :meth:`gsplit.comm.Communicator.all_to_all_counted`) is not modelled: predictions are of
   the steady state.
4. GPUs: one GPU per rank, its own host thread; every rank loads its input rows through UVA at the link's
   ``host_bw`` without contention from the others (host memory and PCIe switches shared by two GPUs are
   not modelled); split adds two host waits per exchanged layer (the count read and the new frontier's
   size) at ``DeviceProfile.host_wait_s`` each (0 in a profile fitted to timed shares, whose replayed split
   sampling contains them); data parallelism loads through UVA as DGL does (gsplit's
   own data-parallel loader gathers on the host, slower). No feature cache.
5. CPU ranks: ``cores`` cores shared fairly by the ranks that are computing (processor sharing); a rank
   waiting in a gloo collective uses no core; while every core is busy a rank's sampling, loading and
   compute run ``contention[kind]`` times slower than alone (shared caches and memory bandwidth), and each
   step of work varies by ``noise`` (relative standard deviation, independent between ranks), so at each
   barrier the slowest rank is late by ``expected_max(ranks)`` of the interval's standard deviation. Both
   are measured by running the one-rank workload in as many independent processes as there are cores at
   once: the slowdown against running alone, and how far two processes doing identical work drift apart.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from gsplit.estimate.links import LinkProfile
from gsplit.estimate.work import IterationWork

FLOAT_BYTES = 4
ID_BYTES = 8
LAYER_FEATURES = ("edge_elements", "multiply_adds", "row_elements", "calls", "edge_elements_beyond_cache")
"""The terms of a layer's cost, in the order of :class:`LayerCosts`' coefficients."""
SAMPLE_FEATURES = ("edges", "src_rows", "ids", "calls")
"""The terms of a sampling layer's cost, in the order of ``DeviceProfile.sample``."""
STEP_FEATURES = ("parameters", "calls")
"""The terms of the per-iteration step cost, in the order of ``DeviceProfile.step``."""


@dataclass(frozen=True)
class ModelShape:
    """The GNN whose iteration is predicted: as :func:`gsplit.nn.models.build_model` builds it.

    Example:
        >>> ModelShape("gat", feat_dim=100, hidden=128, num_classes=47, num_layers=3).dims()
        [(100, 128, 4), (128, 128, 4), (128, 47, 1)]
    """

    model: str
    """``sage``, ``gat`` or ``gcn``."""
    feat_dim: int
    """Input feature width."""
    hidden: int
    """Hidden width (GAT: all heads together)."""
    num_classes: int
    """Output width."""
    num_layers: int
    """Layers (= fanouts)."""
    heads: int = 4
    """GAT's heads in hidden layers."""
    feature_bytes: int = FLOAT_BYTES
    """Bytes per stored input feature value: 4 (float32), 2 (bfloat16/float16 features)."""

    def __post_init__(self):
        if self.model not in ("sage", "gat", "gcn"):
            raise ValueError(f"model={self.model!r}; choose sage, gat or gcn")
        if self.model == "gat" and self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")

    def dims(self) -> List[Tuple[int, int, int]]:
        """``(in, out, heads)`` of every layer, input layer first (``out`` counts all heads)."""
        widths = [self.feat_dim] + [self.hidden] * (self.num_layers - 1) + [self.num_classes]
        if self.model != "gat":
            return [(widths[i], widths[i + 1], 1) for i in range(self.num_layers)]
        return [(widths[i], widths[i + 1], self.heads if i < self.num_layers - 1 else 1) for i in range(self.num_layers)]

    def parameters(self) -> int:
        """Trainable parameters (what the gradient all-reduce sends and the optimiser updates)."""
        total = 0
        for i, o, h in self.dims():
            if self.model == "sage":
                total += 2 * i * o + o
            elif self.model == "gcn":
                total += i * o + o
            else:
                total += i * o + 3 * o  # fc, attn_l, attn_r, bias
        return total


def layer_features(model: str, dims: Tuple[int, int, int], edges: float, dst: float, src: float,
                   backward: bool = False, input_grad: bool = True, cache_bytes: Optional[float] = None) -> List[float]:
    """The work of one layer in the units its cost is linear in: ``[edge-elements, multiply-adds, row-elements, 1,
    edge-elements beyond the cache]``.

    SAGE (mean) and GCN aggregate at the narrower of their two widths (they multiply first when that narrows
    the rows, as :class:`gsplit.nn.SAGEConv` does); GAT projects every source to all heads and aggregates at the
    output width. Row-elements are the element-wise work: dropout of the inputs, activation and dropout of the
    outputs. The last term counts the edge-elements whose source row is likely not in the last-level cache
    (``cache_bytes``; the share of the gathered rows' bytes beyond it), 0 without a cache size (GPUs here).
    ``backward``: the work of the layer's backward, which multiplies twice per forward multiply-add
    (the gradients of the weights and of the input) unless the input needs no gradient (``input_grad=False``:
    the input layer, whose input is the features); then SAGE and GCN also skip the aggregation's backward
    (unless they multiplied first) and no input rows get a gradient.

    Example:
        >>> layer_features("sage", (64, 128, 1), edges=10, dst=2, src=5)
        [640, 32768, 576, 1.0, 0.0]
        >>> layer_features("sage", (64, 128, 1), edges=10, dst=2, src=5, backward=True, input_grad=False)
        [0, 32768, 256, 1.0, 0.0]
        >>> layer_features("sage", (64, 128, 1), edges=10, dst=2, src=5, cache_bytes=640)[4]   # half beyond the cache
        320.0
    """
    i, o, _ = dims
    lin_first = i > o
    width = o if (model == "gat" or lin_first) else i  # the width of the gathered source rows
    beyond = 0.0 if not cache_bytes else max(0.0, 1.0 - cache_bytes / max(1.0, src * width * FLOAT_BYTES))
    if model == "gat":
        edge, macs, rows = edges * o, src * i * o, src * (i + o) + dst * o
        # the projection z = W h needs a gradient whatever the input: only the input rows' part goes
        grad_edge, grad_rows = edge, (rows if input_grad else src * o + dst * o)
    else:
        agg = o if lin_first else i
        if model == "sage":
            macs = (src + dst) * i * o if lin_first else dst * 2 * i * o
        else:  # gcn
            macs = (src if lin_first else dst) * i * o
        edge, rows = edges * agg, src * i + dst * o
        # without an input gradient nothing below the weights needs one: no scatter back (unless W came first)
        grad_edge = edge if (input_grad or lin_first) else 0
        grad_rows = rows if input_grad else (src * o if lin_first else 0) + dst * o
    if not backward:
        return [edge, macs, rows, 1.0, edge * beyond]
    return [grad_edge, macs * (2 if input_grad else 1), grad_rows, 1.0, grad_edge * beyond]


def _dot(coef: Sequence[float], x: Sequence[float]) -> float:
    return sum(c * v for c, v in zip(coef, x))


@dataclass
class LayerCosts:
    """Seconds per unit of :data:`LAYER_FEATURES`, forward and backward, for one model family on one device."""

    forward: List[float]
    """Coefficients of the forward (the activation and dropout after the layer included, as
    :class:`gsplit.runtime.timing.LayerClock` times it)."""
    backward: List[float]
    """Coefficients of the backward."""


@dataclass
class DeviceProfile:
    """What one rank's device costs per unit of work (fitted from one-device timings)."""

    name: str
    """E.g. ``h100``, ``v100``, ``cpu-1thread``."""
    sample: List[float]
    """Seconds per :data:`SAMPLE_FEATURES` of one sampling layer (split's local share of the exchange included)."""
    load_call_s: float
    """Seconds per iteration of loading besides the bytes (which go over ``LinkProfile.host_bw``)."""
    layers: Dict[str, LayerCosts]
    """By model family (``sage``, ``gat``, ``gcn``); a family absent here uses ``sage``'s."""
    step: List[float]
    """Seconds per :data:`STEP_FEATURES`: per iteration, loss + optimiser + what the trainer does around them."""
    host_wait_s: float = 0.0
    """GPU: seconds per host wait that split adds (two per exchanged layer) beyond what ``sample`` contains (0 when
    ``sample`` was fitted to timed split sampling, which waits as a rank does); CPU: 0."""
    cores: Optional[int] = None
    """CPU: cores that the ranks share (processor sharing). ``None``: every rank has its own device."""
    contention: Dict[str, float] = field(default_factory=dict)
    """CPU: how much slower a rank's work of each kind (``sample``, ``load``, ``compute`` for the rest) runs while
    every core is busy (shared caches and memory bandwidth), linearly less with fewer busy cores. Empty: none."""
    noise: float = 0.0
    """CPU: relative standard deviation of a rank's time for one step of work (a layer, a sampling layer, the
    load), independent between ranks: at each barrier the slowest of ``n`` ranks is late by about
    ``expected_max(n)`` standard deviations of the interval (shared cores, the operating system). GPUs: 0."""
    memory_bytes: Optional[int] = None
    """Memory of one device (for ``gsplit estimate``'s fit check); ``None``: unknown."""
    cache_bytes: Optional[int] = None
    """Last-level cache a rank's gathers hit (CPU: the L3); ``None``: no cache term."""
    copy_bw: Optional[float] = None
    """Bytes per second of the row copies a split rank makes around each shuffle in its own memory (gathering the
    rows it sends and its own rows, placing what it receives; backward the same and a sum into its rows), which
    the layer timings do not contain: fitted to those copies timed on the shares' real shuffle plans, on a CPU or
    a GPU (:func:`gsplit.estimate.calibrate.fit_copy_bw`); ``None``: not modelled."""
    source: str = ""
    """Where the coefficients come from (command, date, card)."""
    notes: Dict[str, str] = field(default_factory=dict)
    """Assumptions behind particular coefficients."""

    def layer_costs(self, model: str) -> LayerCosts:
        return self.layers.get(model) or self.layers["sage"]

    def to_dict(self) -> dict:
        """JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DeviceProfile":
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["layers"] = {k: LayerCosts(**v) for k, v in d["layers"].items()}
        return cls(**d)


# ------------------------------------------------------------------------------------------- the iteration
TERMS = ("sample", "host waits", "load", "forward", "backward", "shuffle copies", "step", "cores shared", "waiting",
         "uneven speed", "id exchange", "feature shuffle", "layer shuffles", "all-reduce")
"""The terms an iteration's time is split into (they add up to it)."""


@dataclass
class IterationTime:
    """One iteration, predicted."""

    total_s: float
    """Seconds: the slowest rank's path through every interval plus the collectives."""
    terms: Dict[str, float]
    """Seconds by :data:`TERMS`: compute kinds at the mean rank's pace alone, ``cores shared`` (processor sharing
    on CPU ranks beyond the cores, and the contention of busy cores), ``waiting`` (at barriers, for the rank with
    the most work), ``uneven speed`` (at barriers, for the rank that happened to be slowest: ``noise``), and the
    collectives."""


def _busy_factor(full: float, busy: int, cores: int) -> float:
    """A slowdown of ``full`` with every core busy, scaled linearly down to 1.0 with one busy core."""
    return 1.0 + (full - 1.0) * (min(busy, cores) - 1) / max(1, cores - 1)


def _shared_finish(works: List[float], cores: Optional[int], slows: Optional[Sequence[float]] = None) -> List[float]:
    """Finish times of tasks started together: each alone on its device, or (``cores``) sharing the cores fairly,
    task ``i`` computing ``slows[i]`` times slower while every core is busy (linearly less with fewer busy).

    Example:
        >>> _shared_finish([1.0, 1.0, 1.0, 1.0], cores=2), _shared_finish([1.0, 3.0], cores=2, slows=[1.5, 1.5])
        ([2.0, 2.0, 2.0, 2.0], [1.5, 3.5])
    """
    n = len(works)
    if cores is None:
        return list(works)
    slows = list(slows) if slows is not None else [1.0] * n
    remaining = list(works)
    finish = [0.0] * n
    active = {i for i in range(n) if remaining[i] > 0}
    t = 0.0
    while active:
        share = min(1.0, cores / len(active))
        rates = {i: share / _busy_factor(slows[i], len(active), cores) for i in active}
        dt = min(remaining[i] / rates[i] for i in active)
        t += dt
        for i in list(active):
            remaining[i] -= rates[i] * dt
            if remaining[i] <= 1e-12 * max(1.0, works[i]):
                finish[i] = t
                active.discard(i)
    return finish


_EXPECTED_MAX = (0.0, 0.0, 0.5642, 0.8463, 1.0294, 1.1630, 1.2672, 1.3522, 1.4236)
"""Expected largest of ``n`` independent standard normal draws, ``n`` = 0..8."""


def expected_max(n: int) -> float:
    """E[max of ``n`` iid N(0, 1)] (tabulated to 8, then the ``sqrt(2 ln n)`` asymptote).

    Example:
        >>> expected_max(2), expected_max(1)
        (0.5642, 0.0)
    """
    import math

    return _EXPECTED_MAX[n] if n < len(_EXPECTED_MAX) else math.sqrt(2.0 * math.log(n))


def _shuffle_copies(layer, width: int, device: DeviceProfile, value_bytes: int = FLOAT_BYTES):
    """The row copies of one shuffle (forward or backward) of a split layer, as a compute event (none without
    ``copy_bw``): the rows sent to others gathered, the received ones placed, the rank's own rows of its mixed
    frontier gathered and placed (:func:`gsplit.comm.shuffle.shuffle_rows`; backward mirrors it)."""
    if not device.copy_bw:
        return
    rows = [layer.send_rows[r] + layer.recv_rows[r] + 2 * max(layer.src[r] - layer.recv_rows[r], 0)
            for r in range(len(layer.src))]
    yield "compute", "shuffle copies", [n * width * value_bytes / device.copy_bw for n in rows]


def _events(work: IterationWork, shape: ModelShape, device: DeviceProfile, link: LinkProfile):
    """The iteration as ``("compute", kind, [seconds per rank])`` and ``("collective", kind, seconds)`` events."""
    p = work.world_size
    dims = shape.dims()
    costs = device.layer_costs(shape.model)
    split = work.system == "split"
    multi = p > 1
    for li in reversed(range(len(work.layers))):  # sampling: top layer first
        layer = work.layers[li]
        exchanged = split and layer.exchanged and multi
        ids = [layer.recv_rows[r] + layer.send_rows[r] if exchanged else 0 for r in range(p)]
        yield "compute", "sample", [_dot(device.sample, [layer.edges[r], layer.src[r], ids[r], 1.0]) for r in range(p)]
        if exchanged:
            yield "compute", "host waits", [2 * device.host_wait_s] * p
            nbytes = max(max(layer.recv_rows), max(layer.send_rows)) * ID_BYTES
            yield "collective", "id exchange", link.all_to_all_s(p, nbytes)
    row_bytes = shape.feat_dim * shape.feature_bytes
    yield "compute", "load", [rows * row_bytes / link.host_bw + device.load_call_s for rows in work.input_rows]
    bottom = work.layers[0]
    if split and bottom.exchanged and multi:
        yield from _shuffle_copies(bottom, shape.feat_dim, device, shape.feature_bytes)
        yield "collective", "feature shuffle", link.all_to_all_s(
            p, max(max(bottom.recv_rows), max(bottom.send_rows)) * row_bytes)
    def features(li: int, r: int, backward: bool) -> List[float]:
        layer = work.layers[li]
        return layer_features(shape.model, dims[li], layer.edges[r], layer.dst[r], layer.src[r], backward, li > 0,
                              device.cache_bytes)

    for li, layer in enumerate(work.layers):
        if split and li > 0 and multi:
            yield from _shuffle_copies(layer, dims[li][0], device)
            yield "collective", "layer shuffles", link.all_to_all_s(
                p, max(max(layer.recv_rows), max(layer.send_rows)) * dims[li][0] * FLOAT_BYTES)
        yield "compute", "forward", [_dot(costs.forward, features(li, r, False)) for r in range(p)]
    for li in reversed(range(len(work.layers))):
        yield "compute", "backward", [_dot(costs.backward, features(li, r, True)) for r in range(p)]
        layer = work.layers[li]
        if split and li > 0 and multi:
            yield "collective", "layer shuffles", link.all_to_all_s(
                p, max(max(layer.recv_rows), max(layer.send_rows)) * dims[li][0] * FLOAT_BYTES)
            yield from _shuffle_copies(layer, dims[li][0], device)
    if multi:
        yield "collective", "all-reduce", link.all_reduce_s(p, shape.parameters() * FLOAT_BYTES)
    yield "compute", "step", [_dot(device.step, [shape.parameters(), 1.0])] * p


def simulate_iteration(work: IterationWork, shape: ModelShape, device: DeviceProfile, link: LinkProfile) -> IterationTime:
    """Predict one iteration of ``work`` (one system, one world size) on ``device`` ranks joined by ``link``.

    Example:
        >>> from gsplit.estimate.work import IterationWork, LayerWork
        >>> from gsplit.estimate.links import get_link
        >>> from gsplit.estimate.profiles import get_device
        >>> w = IterationWork("dp", 2, [LayerWork([1000, 900], [100, 90], [600, 500], [0, 0], [0, 0])],
        ...                   input_rows=[600, 500], targets=[100, 90])
        >>> t = simulate_iteration(w, ModelShape("sage", 64, 64, 8, 1), get_device("h100"), get_link("nvlink4"))
        >>> abs(sum(t.terms.values()) - t.total_s) < 1e-12
        True
    """
    terms = {k: 0.0 for k in TERMS}
    pending: Dict[str, List[float]] = {}
    steps_sq = [0.0]  # sum over the interval's steps of (the mean rank's seconds)^2: the noise's variance / sigma^2
    p = work.world_size

    def slow(kind: str) -> float:
        c = device.contention
        return c.get(kind, c.get("compute", 1.0)) if c else 1.0

    def close_interval() -> float:
        if not pending:
            return 0.0
        per_rank = [sum(v[r] for v in pending.values()) for r in range(p)]
        slows = [sum(v[r] * slow(k) for k, v in pending.items()) / per_rank[r] if per_rank[r] > 0 else 1.0
                 for r in range(p)]
        mean = sum(per_rank) / p
        duration = max(_shared_finish(per_rank, device.cores, slows))
        balanced = max(_shared_finish([mean] * p, device.cores, [sum(slows) / p] * p))
        noise = expected_max(p) * device.noise * steps_sq[0] ** 0.5 * (balanced / mean if mean > 0 else 1.0)
        for kind, v in pending.items():
            terms[kind] += sum(v) / p
        terms["cores shared"] += balanced - mean
        terms["waiting"] += duration - balanced
        terms["uneven speed"] += noise
        pending.clear()
        steps_sq[0] = 0.0
        return duration + noise

    total = 0.0
    for what, kind, value in _events(work, shape, device, link):
        if what == "compute":
            acc = pending.setdefault(kind, [0.0] * p)
            for r, s in enumerate(value):
                acc[r] += s
            steps_sq[0] += (sum(value) / p) ** 2
        else:
            total += close_interval() + value
            terms[kind] += value
    total += close_interval()
    return IterationTime(total_s=total, terms=terms)


@dataclass
class Prediction:
    """One system at one world size over several iterations."""

    system: str
    """``split`` or ``dp``."""
    world_size: int
    """Ranks."""
    iteration_s: float
    """Median predicted seconds per iteration."""
    terms: Dict[str, float]
    """Mean seconds per iteration by :data:`TERMS`."""
    per_iteration_s: List[float]
    """Every predicted iteration."""

    def epoch_s(self, iterations_per_epoch: int) -> float:
        """Seconds of an epoch of ``iterations_per_epoch`` iterations like these."""
        return self.iteration_s * iterations_per_epoch

    def dominant(self, n: int = 3) -> List[Tuple[str, float]]:
        """The ``n`` largest terms with their share of the iteration."""
        total = sum(self.terms.values()) or 1.0
        return sorted(((k, v / total) for k, v in self.terms.items() if v > 0), key=lambda kv: -kv[1])[:n]

    def to_dict(self) -> dict:
        """JSON-ready."""
        return asdict(self)


def predict(works: Sequence[IterationWork], shape: ModelShape, device: DeviceProfile, link: LinkProfile) -> Prediction:
    """Predict every iteration of ``works`` (one system, one world size) and summarise.

    Example:
        >>> from gsplit.estimate.work import IterationWork, LayerWork
        >>> from gsplit.estimate.links import get_link
        >>> from gsplit.estimate.profiles import get_device
        >>> w = IterationWork("dp", 1, [LayerWork([1000], [100], [600], [0], [0])], input_rows=[600], targets=[100])
        >>> p = predict([w, w], ModelShape("sage", 64, 64, 8, 1), get_device("h100"), get_link("nvlink4"))
        >>> p.iteration_s == p.per_iteration_s[0]
        True
    """
    if not works:
        raise ValueError("no iterations to predict; count at least one (count_work(..., iterations=1))")
    systems = {(w.system, w.world_size) for w in works}
    if len(systems) != 1:
        raise ValueError(f"predict takes the iterations of one system at one world size, got {sorted(systems)}")
    times = [simulate_iteration(w, shape, device, link) for w in works]
    terms = {k: statistics.fmean(t.terms[k] for t in times) for k in TERMS}
    return Prediction(system=works[0].system, world_size=works[0].world_size,
                      iteration_s=statistics.median(t.total_s for t in times), terms=terms,
                      per_iteration_s=[t.total_s for t in times])
