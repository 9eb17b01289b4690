"""Calibration: the model's coefficients from one-device timings and transport micro-benchmarks, never from
the multi-rank runs it predicts.

* :func:`time_shares` replays, in ONE process on one device, every rank's share of real mini-batches for
  several world sizes: split sampling itself (:func:`gsplit.sp_sample` with :class:`PlanCommunicator`, which
  answers the id exchange from the one-process plan instead of sending anything), the input-row gather, and
  each layer's forward and backward on the rank's own blocks. Run on a GPU it measures the GPU's compute
  terms (``experiments/gpu_bench.py --parts shares``); on a CPU with one thread, a CPU rank's.
* :func:`time_steps` runs one rank of the real trainer for a few iterations: what a step costs beyond its
  layers (loss, optimiser, the trainer's work around them).
* :func:`transport_profile` times gloo's all-to-all and all-reduce between CPU ranks of this host.
* :func:`fit_device` fits the :class:`~gsplit.estimate.model.DeviceProfile` coefficients (non-negative least
  squares, relative errors).
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from gsplit.comm.communicator import TrafficCounter
from gsplit.estimate.links import Collective, LinkProfile
from gsplit.estimate.model import (FLOAT_BYTES, DeviceProfile, LayerCosts, ModelShape, layer_features)
from gsplit.estimate.work import INPUT_MODES, iteration_batches, split_plan
from gsplit.feature_store import FeatureStore
from gsplit.nn.models import build_model
from gsplit.sampling.neighbor import NeighborSampler
from gsplit.split.split_sampling import local_targets, sp_sample

log = logging.getLogger(__name__)


class PlanCommunicator:
    """Stands in for rank ``rank``'s :class:`~gsplit.comm.Communicator` inside :func:`gsplit.sp_sample`.

    Its id exchange answers from the one-process plan (:class:`~gsplit.estimate.work.SplitPlan`'s ``requests``:
    the ids this rank would receive, by requester), so one process replays any rank's split sampling with the
    rank's own computation and none of the transport.

    Example:
        >>> c = PlanCommunicator(1, 2, {0: (torch.tensor([4, 5]), [1, 1])})
        >>> c.all_to_all_counted(torch.tensor([7]), torch.tensor([0], dtype=torch.int8), "ids/layer0")
        (tensor([4, 5]), [1, 0], [1, 1])
    """

    def __init__(self, rank: int, world_size: int, requests: Dict[int, tuple]):
        self.rank, self.world_size = int(rank), int(world_size)
        self.requests = requests
        self.traffic = TrafficCounter()
        self.nccl_for_cuda = False

    def all_to_all_counted(self, x: torch.Tensor, dest: torch.Tensor, tag: str):
        layer = int(tag.rsplit("layer", 1)[1])
        ids, recv = self.requests[layer]
        sent = torch.bincount(dest.to(torch.int64), minlength=self.world_size).tolist()
        return ids.to(x.device, x.dtype), sent, list(recv)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_s(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(max(1, repeats)):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _time_layers(model, blocks, shape: ModelShape, device: torch.device, repeats: int) -> List[tuple]:
    """``(forward_s, backward_s)`` of every layer of ``model`` on ``blocks`` (activation and dropout included)."""
    dims = shape.dims()
    out = []
    for li, (layer, block) in enumerate(zip(model.layers, blocks)):
        gen = torch.Generator(device="cpu").manual_seed(li)
        x = torch.randn(block.num_src_nodes(), dims[li][0], generator=gen).to(device)
        x.requires_grad_(li > 0)  # the input features need no gradient, as in training
        last = li == len(blocks) - 1

        def forward():
            y = layer(block, x)
            return y if last else model.between(li, y, block)

        fwd = _median_s(forward, repeats, device)
        y = forward()
        grad = torch.ones_like(y)
        # the same graph's backward, repeated (gradients accumulate, which costs what a first pass costs)
        bwd = _median_s(lambda: y.backward(grad, retain_graph=True), repeats, device)
        out.append((fwd, bwd))
        del y, grad
    return out


def time_shares(dataset, shape: ModelShape, sampler: NeighborSampler, batch_size: int,
                owners: Dict[int, Optional[torch.Tensor]], iterations: int = 2, device: str = "cpu",
                repeats: int = 3, seed: int = 0, input_features: str = "direct", time_layers: bool = True,
                progress: Optional[Callable[[str], None]] = None) -> List[dict]:
    """Time every rank's share of ``iterations`` mini-batches, for each world size in ``owners``, in this process.

    ``owners[world]`` is that world's partition map (its ``assignment``; ``None`` for world 1). Returns one
    record per (world, iteration, rank): the rank's counted work (``edges``, ``dst``, ``src``, ``ids`` per
    layer; ``input_rows``), ``sample_s`` (its split sampling, exchange answered from the plan), ``load_s``
    (gathering its input rows), and per layer ``fwd_s`` / ``bwd_s``.

    Example:
        >>> import gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=2000, seed=0)
        >>> shape = ModelShape("sage", ds.feature_dim, 16, ds.num_classes, 2)
        >>> owner = gsplit.partition(ds.graph, 2, method="random").assignment
        >>> recs = time_shares(ds, shape, NeighborSampler([4, 4]), 32, {1: None, 2: owner}, iterations=1, repeats=1)
        >>> [(r["world"], r["rank"]) for r in recs]
        [(1, 0), (2, 0), (2, 1)]
    """
    if input_features not in INPUT_MODES:
        raise ValueError(f"input_features={input_features!r}; choose one of {INPUT_MODES}")
    dev = torch.device(device)
    graph = dataset.graph
    sample_graph = graph.to(dev) if dev.type == "cuda" else graph
    store = FeatureStore(dataset.features, device=dev, cache_size=0)
    torch.manual_seed(seed)
    model = build_model(shape.model, shape.feat_dim, shape.hidden, shape.num_classes, shape.num_layers, dropout=0.5,
                        heads=shape.heads).to(dev)
    model.train()
    model.step = 1
    records = []
    warm = True  # the first share is timed twice: compiled kernels build and caches fill at first use
    for world, owner in sorted(owners.items()):
        own = owner if owner is not None else torch.zeros(graph.num_nodes, dtype=torch.int8)
        own_dev = own.to(dev)
        for it, seeds in iteration_batches(dataset.train_idx, batch_size, world, seed, 0, iterations):
            ref = sampler.sample_layers(graph, seeds, 0, it).blocks
            plan = split_plan(ref, own, world, input_features if world > 1 else "shuffle", with_requests=world > 1)
            for rank in range(world):
                comm = PlanCommunicator(rank, world, plan.requests[rank]) if world > 1 else _WorldOne()
                targets = local_targets(seeds, own, rank).to(dev)
                seeds_dev = seeds.to(dev)

                def sample():
                    return sp_sample(sample_graph, seeds_dev, own_dev, sampler, comm, epoch=0, iteration=it,
                                     targets=targets, exchange_inputs=input_features == "shuffle" or world == 1)

                if warm:
                    batch = sample()
                    store.gather_with_counts(batch.input_nodes)
                    if time_layers:
                        _time_layers(model, [b.to(dev) for b in batch.blocks], shape, dev, 1)
                    warm = False
                sample_s = _median_s(sample, repeats, dev)
                batch = sample()
                load_s = _median_s(lambda: store.gather_with_counts(batch.input_nodes), repeats, dev)
                blocks = [b.to(dev) for b in batch.blocks]
                work = plan.work
                rec = {"world": world, "iteration": it, "rank": rank, "sample_s": sample_s, "load_s": load_s,
                       "input_rows": int(batch.input_nodes.numel()),
                       "edges": [b.num_edges() for b in blocks], "dst": [b.num_dst for b in blocks],
                       "src": [b.num_src_nodes() for b in blocks],
                       "ids": [(work.layers[li].recv_rows[rank] + work.layers[li].send_rows[rank])
                               if work.layers[li].exchanged and world > 1 else 0 for li in range(len(blocks))]}
                if time_layers:
                    times = _time_layers(model, blocks, shape, dev, repeats)
                    rec["fwd_s"], rec["bwd_s"] = [t[0] for t in times], [t[1] for t in times]
                records.append(rec)
                if progress is not None:
                    progress(f"  shares: world {world} iteration {it} rank {rank}: sample {sample_s * 1e3:.1f} ms, "
                             f"load {load_s * 1e3:.1f} ms" + (f", layers {sum(rec['fwd_s']) * 1e3:.1f} + "
                                                              f"{sum(rec['bwd_s']) * 1e3:.1f} ms" if time_layers else ""))
    return records


class _WorldOne:
    """A world-1 communicator without a process group (what a single process's loader has)."""

    rank, world_size, nccl_for_cuda = 0, 1, False

    def __init__(self):
        self.traffic = TrafficCounter()


def time_steps(dataset, cfg, progress: Optional[Callable[[str], None]] = None) -> dict:
    """One rank of the real trainer (``train_rank(0, 1, cfg, ...)``): per iteration, what the step costs beyond its
    layers (``train_s`` less the layers' forward and backward), and the phases, medians over all but the first."""
    from gsplit.trainer import train_rank

    log_ = train_rank(0, 1, cfg, dataset, None)
    its = [it for epoch in log_["epochs"] for r in epoch["ranks"] for it in r["per_iteration"]][1:]
    if not its:
        raise ValueError("time_steps needs at least 2 iterations (the first is warm-up); raise cfg.max_iters")
    step = [it["train_s"] - sum(it["layer_fwd_s"]) - sum(it["layer_bwd_s"]) for it in its]
    out = {"step_s": statistics.median(step), "iterations": len(its)}
    for key in ("sample_s", "load_s", "train_s"):
        out[key] = statistics.median(it[key] for it in its)
    if progress is not None:
        progress(f"  step ({cfg.model}): {out['step_s'] * 1e3:.1f} ms beyond the layers; iteration sample "
                 f"{out['sample_s'] * 1e3:.1f} / load {out['load_s'] * 1e3:.1f} / train {out['train_s'] * 1e3:.1f} ms")
    return out


# ---------------------------------------------------------------------------------------------- fitting
def nnls_relative(x: Sequence[Sequence[float]], y: Sequence[float]) -> List[float]:
    """Non-negative coefficients ``c`` minimising the relative errors ``(x @ c - y) / y``.

    Example:
        >>> [round(c, 3) for c in nnls_relative([[1, 1], [2, 1], [4, 1]], [3, 5, 9])]
        [2.0, 1.0]
    """
    from scipy.optimize import nnls

    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    # relative errors, but a timing near zero (noise) must not pull the fit: weights floor at 5 % of the median
    w = 1.0 / np.maximum(b, max(0.05 * float(np.median(b)), 1e-12))
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    coef, _ = nnls((a / scale) * w[:, None], b * w)
    return (coef / scale).tolist()


def fit_errors(x: Sequence[Sequence[float]], y: Sequence[float], coef: Sequence[float]) -> dict:
    """Median and largest relative error of a fit, in percent."""
    pred = np.asarray(x, dtype=np.float64) @ np.asarray(coef)
    rel = np.abs(pred - np.asarray(y)) / np.maximum(np.asarray(y), 1e-9)
    return {"median_pct": float(np.median(rel) * 100), "max_pct": float(rel.max() * 100), "points": len(y)}


def fit_device(name: str, shares: Dict[str, List[dict]], shapes: Dict[str, ModelShape], steps: Dict[str, dict],
               host_bw: Optional[float] = None, cores: Optional[int] = None, source: str = "") -> tuple:
    """Fit a :class:`DeviceProfile` from :func:`time_shares` records (by model) and :func:`time_steps` results.

    Returns ``(profile, load, quality)``: ``load`` is ``{"host_bw", "load_call_s"}`` (the gather's bandwidth
    and fixed cost, from the load timings unless ``host_bw`` is given), ``quality`` the fits' relative errors.
    """
    quality = {}
    all_recs = [r for recs in shares.values() for r in recs]
    # sampling: per iteration, the sums over layers of the per-layer features
    xs = [[sum(r["edges"]), sum(r["src"]), sum(r["ids"]), len(r["edges"])] for r in all_recs]
    ys = [r["sample_s"] for r in all_recs]
    sample = nnls_relative(xs, ys)
    quality["sample"] = fit_errors(xs, ys, sample)
    # loading: bytes and one call
    xl = [[r["input_rows"] * next(iter(shapes.values())).feat_dim * FLOAT_BYTES, 1.0] for r in all_recs]
    yl = [r["load_s"] for r in all_recs]
    per_byte, call = nnls_relative(xl, yl)
    quality["load"] = fit_errors(xl, yl, [per_byte, call])
    bw = host_bw if host_bw is not None else (1.0 / per_byte if per_byte > 0 else float("inf"))
    layers = {}
    for model, recs in shares.items():
        shape = shapes[model]
        dims = shape.dims()
        xf, xb, yf, yb = [], [], [], []
        for r in recs:
            if "fwd_s" not in r:
                continue
            for li in range(len(r["edges"])):
                work = (shape.model, dims[li], r["edges"][li], r["dst"][li], r["src"][li])
                xf.append(layer_features(*work))
                xb.append(layer_features(*work, backward=True, input_grad=li > 0))
                yf.append(r["fwd_s"][li])
                yb.append(r["bwd_s"][li])
        if not xf:
            continue
        fwd, bwd = nnls_relative(xf, yf), nnls_relative(xb, yb)
        quality[f"{model}_forward"], quality[f"{model}_backward"] = fit_errors(xf, yf, fwd), fit_errors(xb, yb, bwd)
        layers[shape.model] = LayerCosts(forward=fwd, backward=bwd)
    # the step: a fixed cost per parameter and per call, from the models' one-rank runs
    xs_step = [[shapes[m].parameters(), 1.0] for m in steps]
    ys_step = [steps[m]["step_s"] for m in steps]
    step = nnls_relative(xs_step, ys_step) if len(xs_step) > 1 else [0.0, ys_step[0] if ys_step else 0.0]
    if steps:
        quality["step"] = fit_errors(xs_step, ys_step, step)
    profile = DeviceProfile(name=name, sample=sample, load_call_s=call, layers=layers, step=step, cores=cores,
                            source=source)
    return profile, {"host_bw": bw, "load_call_s": call}, quality


# ---------------------------------------------------------------------------------------------- transport
def _transport_rank(rank: int, world: int, sizes: Sequence[int], repeats: int, iters: int) -> Optional[dict]:
    import torch.distributed as dist

    out = {"all_to_all": {}, "all_reduce": {}}
    for size in sizes:
        # every rank sends ``size`` bytes in total to the others (none to itself), float32 rows of one element
        per_peer = max(1, size // FLOAT_BYTES // (world - 1))
        splits = [0 if j == rank else per_peer for j in range(world)]
        x = torch.ones(sum(splits))
        y = torch.empty(sum(per_peer if j != rank else 0 for j in range(world)))
        recv = [0 if j == rank else per_peer for j in range(world)]
        grad = torch.ones(max(1, size // FLOAT_BYTES))
        for key, op in (("all_to_all", lambda: dist.all_to_all_single(y, x, recv, splits)),
                        ("all_reduce", lambda: dist.all_reduce(grad))):
            times = []
            for _ in range(repeats):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    op()
                times.append((time.perf_counter() - t0) / iters)
            t = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out[key][size] = float(t)
    return out if rank == 0 else None


def transport_profile(worlds: Sequence[int], sizes: Sequence[int], host_bw: float, repeats: int = 5, iters: int = 10,
                      progress: Optional[Callable[[str], None]] = None) -> tuple:
    """Time gloo's all-to-all and all-reduce between ``w`` CPU ranks of this host for every ``w`` in ``worlds``
    (one torch thread per rank, as the trainer's ranks have) and fit a ``cpu-gloo`` :class:`LinkProfile`.

    Returns ``(link, raw)``: ``raw[w][collective][bytes]`` are the measured seconds (slowest rank, median).
    """
    from gsplit.launch import launch

    raw, a2a, ar = {}, {}, {}
    for w in worlds:
        got = launch(_transport_rank, w, args=(list(sizes), repeats, iters), devices="cpu", backend="gloo",
                     timeout=600)[0]
        raw[w] = got
        for key, table in (("all_to_all", a2a), ("all_reduce", ar)):
            factor = 1.0 if key == "all_to_all" else 2.0 * (w - 1) / w
            x = [[s * factor, 1.0] for s in sizes]
            y = [got[key][s] for s in sizes]
            per_byte, latency = nnls_relative(x, y)
            table[w] = Collective(latency_s=latency, bus_bw=1.0 / per_byte if per_byte > 0 else float("inf"))
        if progress is not None:
            progress(f"  transport, {w} ranks: all-to-all {a2a[w].latency_s * 1e3:.2f} ms + bytes / "
                     f"{a2a[w].bus_bw / 1e9:.2f} GB/s; all-reduce {ar[w].latency_s * 1e3:.2f} ms + bytes / "
                     f"{ar[w].bus_bw / 1e9:.2f} GB/s")
    link = LinkProfile(name="cpu-gloo", all_to_all=a2a, all_reduce=ar, host_bw=host_bw,
                       source="gloo micro-benchmark on this host (gsplit.estimate.calibrate.transport_profile)")
    return link, raw
