"""Full-graph training across hosts, predicted: one split group spanning the hosts vs shared preloading.

``gsplit estimate --hosts H --inter-link LINK`` predicts an epoch of ``gsplit train --full-graph`` on ``H``
hosts of ``G`` GPUs in the two host modes (:mod:`gsplit.fullgraph.preload`):

- ``span``: one split group of all ``H x G`` ranks, a full-graph map of ``H x G`` parts (as ``gsplit prepare
  --full-graph`` makes it; rank ``r`` is on host ``r // G``): every layer above the first shuffles its halo rows,
  forward and backward, and the rows from ranks of another host cross the network.
- ``preload``: a host map of ``H`` parts; each host preloads its inner vertices plus their L-hop halo
  (:func:`gsplit.fullgraph.host_subgraph`), split over its ``G`` ranks by a full-graph map of that share;
  every shuffle stays inside the host, the halo is computed again (redundant work); ``preload`` with
  ``external_hops`` / ``external_fanout`` bounds the halo (expansion-aware sampling, an approximation).

What every rank does per layer is **measured**, not assumed: :func:`measure_host_modes` builds the very maps and
shares the trainer builds on the graph (a synthetic stand-in of a published shape, or a real graph) and counts
each rank's vertices, in-edges, halo rows and how many of them come from another host. Seconds come from the
same per-unit costs as the rest of ``gsplit estimate`` (:mod:`gsplit.estimate.model`): a layer's forward and
backward from :func:`~gsplit.estimate.model.layer_features` and the device profile, the shuffle's own row copies
at ``copy_bw``, the step; and from two links: the one inside a host (:data:`gsplit.estimate.links.LINKS`) and the
network between hosts (:data:`gsplit.estimate.links.INTER_LINKS`, ``nics`` ports per host).

ASSUMPTIONS (besides :mod:`gsplit.estimate.model`'s 1-3):

1. A shuffle is one all-to-all whose parts inside a host and across hosts run at once: it takes the longer of
   the two: inside, the largest rank's rows over the host link's all-to-all bandwidth; across, the largest
   host's rows to (or from) other hosts over its ``nics`` ports; plus that link's latency.
2. Ranks wait for each other at every shuffle of their split group (span: every rank of every host;
   preload: the ranks of one host), and every rank at the gradient all-reduce: hierarchical, an all-reduce
   inside each host plus one across hosts over the ports.
3. Features are preloaded on the GPUs (no loading term), as the full-graph loaders hold them.
4. Counts measured on a stand-in smaller than the graph it stands for are scaled by the ratio of vertices
   (halo and cut fractions taken as measured): a synthetic power-law graph has no community structure, so its
   cut (span's traffic) and its halo (preload's redundant work) are larger than on a real graph of that size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Dict, List, Optional

import torch

from gsplit.data.graph import Graph
from gsplit.estimate.links import InterLink, LinkProfile
from gsplit.estimate.model import FLOAT_BYTES, DeviceProfile, ModelShape, _dot, layer_features

MODES = ("span", "preload", "preload-eas")
"""The host modes: one split group spanning the hosts, shared preloading, and with expansion-aware sampling."""

TERMS = ("forward", "backward", "shuffle copies", "shuffles inside hosts", "shuffles across hosts", "waiting",
         "all-reduce", "step")
"""What an epoch's predicted time is split into (they add up to it)."""


@dataclass
class HostModeWork:
    """One host mode's per-rank work of one layer (the same at every layer of a full-graph epoch); rank ``r`` is on
    host ``r // gpus_per_host``."""

    mode: str
    """One of :data:`MODES`."""
    hosts: int
    """Hosts."""
    gpus_per_host: int
    """Ranks (GPUs) per host."""
    vertices: List[int]
    """Per rank: vertices it computes at every layer."""
    in_edges: List[int]
    """Per rank: edges it aggregates per layer."""
    recv_rows: List[int]
    """Per rank: halo rows it receives per shuffle (from the other ranks of its split group)."""
    recv_cross: List[int]
    """Per rank: of ``recv_rows``, those from ranks on another host."""
    sent_rows: List[int]
    """Per rank: rows it sends per shuffle."""
    sent_cross: List[int]
    """Per rank: of ``sent_rows``, those to ranks on another host."""
    share_vertices: List[int] = field(default_factory=list)
    """Per host: vertices its ranks hold (preload: inner plus halo)."""
    halo_vertices: List[int] = field(default_factory=list)
    """Per host: of ``share_vertices``, those another host owns (0 for span)."""
    num_nodes: int = 0
    """Vertices of the graph the counts are for."""
    num_edges: int = 0
    """Edges of the graph the counts are for."""

    @property
    def world_size(self) -> int:
        return self.hosts * self.gpus_per_host

    def scaled(self, factor: float) -> "HostModeWork":
        """Every count times ``factor`` (a stand-in's counts for the graph it stands for)."""
        def s(values):
            return [int(round(v * factor)) for v in values]
        return replace(self, vertices=s(self.vertices), in_edges=s(self.in_edges), recv_rows=s(self.recv_rows),
                       recv_cross=s(self.recv_cross), sent_rows=s(self.sent_rows), sent_cross=s(self.sent_cross),
                       share_vertices=s(self.share_vertices), halo_vertices=s(self.halo_vertices),
                       num_nodes=int(round(self.num_nodes * factor)), num_edges=int(round(self.num_edges * factor)))

    def rows_per_epoch(self, num_layers: int) -> Dict[str, int]:
        """Rows the split groups send per epoch, summed over ranks: ``across`` hosts and ``inside`` hosts (every
        layer above the first shuffles forward and backward, as the trainer's ``cross_host_bytes`` counts)."""
        shuffles = 2 * max(0, int(num_layers) - 1)
        cross = sum(self.sent_cross) * shuffles
        return {"across": cross, "inside": sum(self.sent_rows) * shuffles - cross}


def pair_rows(graph: Graph, owner: torch.Tensor, parts: int) -> torch.Tensor:
    """``rows[r, s]``: distinct vertices owned by part ``s`` that part ``r`` reads as in-neighbours (``r != s``;
    the diagonal is 0): the rows ``s`` sends ``r`` in every full-graph shuffle.

    Example:
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)     # a 4-cycle
        >>> pair_rows(g, torch.tensor([0, 0, 1, 1]), 2).tolist()
        [[0, 2], [2, 0]]
    """
    n = graph.num_nodes
    own = torch.as_tensor(owner).to("cpu", torch.int64)
    dst = graph.edge_dst().cpu()
    src = graph.indices.cpu()
    r_dst, r_src = own[dst], own[src]
    remote = r_dst != r_src
    keys = torch.unique(r_dst[remote] * n + src[remote])
    reader, vertex = keys // n, keys % n
    return torch.bincount(reader * parts + own[vertex], minlength=parts * parts).view(parts, parts)


def _counts(graph: Graph, owner: torch.Tensor, parts: int, host_of_part: List[int]) -> Dict[str, List[int]]:
    own = torch.as_tensor(owner).to("cpu", torch.int64)
    deg = (graph.indptr[1:] - graph.indptr[:-1]).cpu()
    rows = pair_rows(graph, own, parts)
    host = torch.tensor(host_of_part)
    far = host.view(-1, 1) != host.view(1, -1)
    return {"vertices": torch.bincount(own, minlength=parts).tolist(),
            "in_edges": torch.bincount(own, weights=deg.to(torch.float64), minlength=parts).round().long().tolist(),
            "recv_rows": rows.sum(1).tolist(), "recv_cross": (rows * far).sum(1).tolist(),
            "sent_rows": rows.sum(0).tolist(), "sent_cross": (rows * far).sum(0).tolist()}


def measure_host_modes(graph: Graph, hosts: int, gpus_per_host: int, num_layers: int,
                       external_hops: Optional[int] = None, external_fanout: Optional[int] = None,
                       seed: int = 0) -> Dict[str, HostModeWork]:
    """Each rank's per-layer work in ``span`` and ``preload`` (and ``preload-eas`` when ``external_hops`` or
    ``external_fanout`` is given) on ``graph``, from the maps and shares training builds (METIS with ``seed``).

    Example:
        >>> import gsplit
        >>> g = gsplit.datasets.load("synthetic", num_nodes=2000, seed=0).graph
        >>> w = measure_host_modes(g, hosts=2, gpus_per_host=2, num_layers=2)
        >>> sum(w["span"].in_edges) == g.num_edges, sum(w["preload"].recv_cross)   # preload: nothing crosses
        (True, 0)
    """
    from gsplit.fullgraph.hosts import check_halo_options, host_subgraph
    from gsplit.partitioning.full_graph import partition_full_graph

    h, g = int(hosts), int(gpus_per_host)
    if h < 1 or g < 1:
        raise ValueError(f"hosts={hosts}, gpus_per_host={gpus_per_host}; pass at least 1 of each")
    check_halo_options(num_layers, external_hops, external_fanout)
    p = h * g
    graph = graph.to("cpu")
    base = {"num_nodes": graph.num_nodes, "num_edges": graph.num_edges}
    owner = partition_full_graph(graph, p, seed=seed).assignment if p > 1 else torch.zeros(graph.num_nodes,
                                                                                            dtype=torch.int64)
    span = _counts(graph, owner, p, [r // g for r in range(p)])
    out = {"span": HostModeWork("span", h, g, **span, share_vertices=[sum(span["vertices"][i * g:(i + 1) * g])
                                                                       for i in range(h)],
                                halo_vertices=[0] * h, **base)}
    host_map = partition_full_graph(graph, h, seed=seed).assignment if h > 1 else torch.zeros(graph.num_nodes,
                                                                                               dtype=torch.int64)
    variants = {"preload": (None, None)}
    if external_hops is not None or external_fanout is not None:
        variants["preload-eas"] = (external_hops, external_fanout)
    for mode, (hops, fanout) in variants.items():
        per_rank: Dict[str, List[int]] = {}
        shares, halos = [], []
        for host in range(h):
            share = host_subgraph(graph, host_map, host, num_layers, external_hops=hops, external_fanout=fanout,
                                  seed=seed)
            m = share.nodes.numel()
            if g > 1 and m >= g:  # the ranks of a host split its share as PreloadLoader does
                ranks = partition_full_graph(share.graph, g, seed=seed).assignment.to(torch.int64)
            else:
                ranks = torch.arange(m) % g
            for key, values in _counts(share.graph, ranks, g, [0] * g).items():
                per_rank.setdefault(key, []).extend(values)
            shares.append(m)
            halos.append(share.num_halo)
        out[mode] = HostModeWork(mode, h, g, **per_rank, share_vertices=shares, halo_vertices=halos, **base)
    return out


@dataclass
class HostModePrediction:
    """One host mode's predicted epoch (full-graph training: one step per epoch)."""

    mode: str
    """One of :data:`MODES`."""
    epoch_s: float
    """Seconds per epoch."""
    terms: Dict[str, float]
    """Seconds by :data:`TERMS`."""
    cross_host_bytes: int
    """Bytes the split groups send to ranks on another host per epoch (summed over ranks; the gradient
    all-reduce not included), as the trainer logs ``cross_host_bytes``."""
    inside_host_bytes: int
    """Bytes the split groups send inside hosts per epoch (``inside_host_bytes``)."""
    edges_per_layer: int
    """Edges computed per layer over every rank (preload: the halo's redundant work shows here)."""
    halo_vertices: int
    """Vertices preloaded from other hosts, summed over hosts (0 for span)."""
    memory_per_gpu: int
    """The largest rank's bytes (:func:`gsplit.fullgraph.estimate_memory` of its counts, plus weights, gradients
    and Adam's moments)."""

    def dominant(self, n: int = 3):
        """The ``n`` largest terms with their share of the epoch."""
        total = sum(self.terms.values()) or 1.0
        return sorted(((k, v / total) for k, v in self.terms.items() if v > 0), key=lambda kv: -kv[1])[:n]

    def to_dict(self) -> dict:
        """JSON-ready."""
        return asdict(self)


def _dims(shape: ModelShape) -> List[tuple]:
    return [(i, o, h, shape.model == "gat") for i, o, h in shape.dims()]


def _memory(work: HostModeWork, shape: ModelShape) -> int:
    from gsplit.fullgraph.loader import estimate_memory
    from gsplit.partitioning.stats import FullGraphStats

    best = 0
    g = work.gpus_per_host
    for host in range(work.hosts):
        ranks = range(host * g, (host + 1) * g)
        group = ranks if work.mode != "span" else range(work.world_size)
        stats = FullGraphStats(num_parts=len(group), num_nodes=work.num_nodes, num_edges=work.num_edges, cut_edges=0,
                               vertices=[work.vertices[r] for r in group], in_edges=[work.in_edges[r] for r in group],
                               halo_rows=[work.recv_rows[r] for r in group],
                               sent_rows=[work.sent_rows[r] for r in group])
        for r in ranks:
            mem = estimate_memory(stats, list(group).index(r), shape.feat_dim, _dims(shape),
                                  feature_bytes=shape.feature_bytes)
            best = max(best, mem.total)
    return best + 4 * shape.parameters() * FLOAT_BYTES


def predict_host_mode(work: HostModeWork, shape: ModelShape, device: DeviceProfile, intra: LinkProfile,
                      inter: InterLink, nics: int = 1) -> HostModePrediction:
    """An epoch of ``work`` for ``shape`` on ``device`` GPUs joined by ``intra`` inside a host and ``nics`` ports of
    ``inter`` between hosts (see the module's assumptions).

    Example:
        >>> from gsplit.estimate.links import get_inter_link, get_link
        >>> from gsplit.estimate.profiles import get_device
        >>> w = HostModeWork("span", 2, 1, vertices=[50, 50], in_edges=[500, 500], recv_rows=[10, 10],
        ...                  recv_cross=[10, 10], sent_rows=[10, 10], sent_cross=[10, 10], num_nodes=100,
        ...                  num_edges=1000)
        >>> p = predict_host_mode(w, ModelShape("sage", 16, 16, 4, 2), get_device("h100"), get_link("nvlink4"),
        ...                       get_inter_link("ib-hdr"))
        >>> abs(sum(p.terms.values()) - p.epoch_s) < 1e-12, p.cross_host_bytes    # 20 rows x 16 x 4 B, fwd + bwd
        (True, 2560)
    """
    if nics < 1:
        raise ValueError(f"nics={nics}; pass at least 1 network port per host")
    g, h = work.gpus_per_host, work.hosts
    groups = [list(range(work.world_size))] if work.mode == "span" else [list(range(i * g, (i + 1) * g))
                                                                           for i in range(h)]
    dims = shape.dims()
    costs = device.layer_costs(shape.model)
    net_bw = inter.bytes_per_s * nics

    def shuffle(group, width):
        """(seconds inside, seconds across, copy seconds per rank) of one shuffle of ``group``'s rows."""
        row = width * FLOAT_BYTES
        inside = max(max(work.recv_rows[r] - work.recv_cross[r], work.sent_rows[r] - work.sent_cross[r])
                     for r in group) * row
        t_in = intra.all_to_all_s(g, inside) if g > 1 and inside > 0 else 0.0
        t_out = 0.0
        if work.mode == "span" and h > 1:
            per_host = [max(sum(work.recv_cross[r] for r in range(i * g, (i + 1) * g)),
                            sum(work.sent_cross[r] for r in range(i * g, (i + 1) * g))) for i in range(h)]
            t_out = inter.latency_s + max(per_host) * row / net_bw if max(per_host) > 0 else 0.0
        copies = [(work.sent_rows[r] + work.recv_rows[r] + 2 * work.vertices[r]) * row / device.copy_bw
                  if device.copy_bw else 0.0 for r in group]
        return t_in, t_out, copies

    per_group = []
    for group in groups:
        terms = {k: 0.0 for k in TERMS}
        total = 0.0
        multi = len(group) > 1
        # one interval per layer and direction: compute (and copies) per rank, then the shuffle
        for backward in (False, True):
            order = range(len(dims)) if not backward else reversed(range(len(dims)))
            for li in order:
                comp = [_dot(costs.backward if backward else costs.forward,
                             layer_features(shape.model, dims[li], work.in_edges[r], work.vertices[r],
                                            work.vertices[r] + work.recv_rows[r], backward, li > 0,
                                            device.cache_bytes)) for r in group]
                kind = "backward" if backward else "forward"
                t_in = t_out = 0.0
                copies = [0.0] * len(group)
                if li > 0 and multi:
                    t_in, t_out, copies = shuffle(group, dims[li][0])
                busy = [a + b for a, b in zip(comp, copies)]
                mean_c, mean_k = sum(comp) / len(group), sum(copies) / len(group)
                terms[kind] += mean_c
                terms["shuffle copies"] += mean_k
                terms["waiting"] += max(busy) - mean_c - mean_k
                comm = max(t_in, t_out)
                if t_out >= t_in:
                    terms["shuffles across hosts"] += comm
                else:
                    terms["shuffles inside hosts"] += comm
                total += max(busy) + comm
        per_group.append((total, terms))
    total, terms = max(per_group, key=lambda x: x[0])
    grad = shape.parameters() * FLOAT_BYTES
    reduce_s = intra.all_reduce_s(g, grad)
    if h > 1:
        reduce_s += inter.latency_s + 2.0 * (h - 1) / h * grad / net_bw
    step_s = _dot(device.step, [shape.parameters(), 1.0])
    terms["all-reduce"] += reduce_s
    terms["step"] += step_s
    rows = work.rows_per_epoch(shape.num_layers)
    # rows of layer li's shuffle carry its input width; the count above is per shuffle, so weigh by the widths
    widths = [dims[li][0] for li in range(1, len(dims))]
    mean_width = sum(widths) / len(widths) if widths else 0
    return HostModePrediction(
        mode=work.mode, epoch_s=total + reduce_s + step_s, terms=terms,
        cross_host_bytes=int(round(rows["across"] * mean_width * FLOAT_BYTES)),
        inside_host_bytes=int(round(rows["inside"] * mean_width * FLOAT_BYTES)),
        edges_per_layer=sum(work.in_edges), halo_vertices=sum(work.halo_vertices),
        memory_per_gpu=_memory(work, shape))


@dataclass
class HostsEstimate:
    """Every host mode of one setting, and which to choose."""

    hosts: int
    """Hosts."""
    gpus_per_host: int
    """GPUs per host."""
    device: str
    """Device profile."""
    intra: str
    """The link inside a host."""
    inter: str
    """The link between hosts."""
    nics: int
    """Ports per host."""
    shape: ModelShape
    """The model."""
    predictions: Dict[str, HostModePrediction]
    """By mode."""
    counted: Dict[str, dict] = field(default_factory=dict)
    """By mode: what was measured (on the stand-in, before scaling)."""
    scale: float = 1.0
    """Full-size vertices / measured vertices."""

    def choice(self, margin: float = 0.05) -> str:
        """``span``, ``preload`` or ``either`` (within ``margin``) between the two exact modes."""
        a, b = self.predictions["span"].epoch_s, self.predictions["preload"].epoch_s
        if abs(a - b) <= margin * min(a, b):
            return "either"
        return "span" if a < b else "preload"

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"hosts": self.hosts, "gpus_per_host": self.gpus_per_host, "device": self.device, "intra": self.intra,
                "inter": self.inter, "nics": self.nics, "shape": asdict(self.shape), "scale": self.scale,
                "predictions": {k: v.to_dict() for k, v in self.predictions.items()}, "counted": self.counted,
                "choice": self.choice()}


def estimate_hosts(graph: Graph, shape: ModelShape, hosts: int, gpus_per_host: int, device: DeviceProfile,
                   intra: LinkProfile, inter: InterLink, nics: int = 1, external_hops: Optional[int] = None,
                   external_fanout: Optional[int] = None, full_nodes: Optional[int] = None,
                   seed: int = 0) -> HostsEstimate:
    """Measure the host modes on ``graph`` (:func:`measure_host_modes`), scale the counts to ``full_nodes``
    vertices (default: the graph's own) and predict each mode's epoch.

    Example:
        >>> import gsplit
        >>> from gsplit.estimate.links import get_inter_link, get_link
        >>> from gsplit.estimate.profiles import get_device
        >>> g = gsplit.datasets.load("synthetic", num_nodes=2000, seed=0).graph
        >>> est = estimate_hosts(g, ModelShape("sage", 32, 64, 8, 3), 2, 2, get_device("h100"), get_link("nvlink4"),
        ...                      get_inter_link("eth-25g"))
        >>> sorted(est.predictions), est.choice() in ("span", "preload", "either")
        (['preload', 'span'], True)
    """
    works = measure_host_modes(graph, hosts, gpus_per_host, shape.num_layers, external_hops, external_fanout, seed)
    factor = (full_nodes / graph.num_nodes) if full_nodes else 1.0
    counted = {m: {"edges_per_layer": sum(w.in_edges), "halo_vertices": sum(w.halo_vertices),
                   "share_vertices": w.share_vertices, "rows_per_shuffle": sum(w.sent_rows),
                   "rows_across_hosts_per_shuffle": sum(w.sent_cross), "num_nodes": w.num_nodes,
                   "num_edges": w.num_edges} for m, w in works.items()}
    preds = {m: predict_host_mode(w.scaled(factor) if factor != 1.0 else w, shape, device, intra, inter, nics)
             for m, w in works.items()}
    return HostsEstimate(hosts=int(hosts), gpus_per_host=int(gpus_per_host), device=device.name, intra=intra.name,
                         inter=inter.name, nics=int(nics), shape=shape, predictions=preds, counted=counted,
                         scale=factor)
