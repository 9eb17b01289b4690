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
* :func:`host_speed_reference` times one fixed workload: timed beside a calibration and beside the runs it
  predicts, it tells how much faster or slower the host was in one than in the other (a shared host's speed
  drifts), apart from the model's own error.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from gsplit.comm.communicator import TrafficCounter
from gsplit.comm.shuffle import _Shuffle
from gsplit.estimate.links import Collective, LinkProfile
from gsplit.estimate.model import (FLOAT_BYTES, DeviceProfile, LayerCosts, ModelShape, layer_features)
from gsplit.estimate.work import INPUT_MODES, iteration_batches, split_plan
from gsplit.data.feature_store import FeatureStore
from gsplit.nn.models import build_model
from gsplit.runtime.resources import keep_freed_heap
from gsplit.sampling.neighbor import NeighborSampler
from gsplit.split.split_sampling import local_targets, sp_sample

log = logging.getLogger(__name__)


def last_level_cache_bytes() -> Optional[int]:
    """This host's largest CPU cache (the L3 on most machines) from sysfs, or ``None`` when it cannot be read."""
    import glob

    best = None
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path).read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            size = int(text.rstrip("KMG")) * scale
        except ValueError:
            continue
        best = size if best is None else max(best, size)
    return best


CACHE_PROBE_MB = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Table sizes (MiB) :func:`effective_cache_bytes` gathers rows from."""


def effective_cache_bytes(sizes_mb: Sequence[int] = CACHE_PROBE_MB, width: int = 128, rows: int = 1 << 17,
                          repeats: int = 5) -> int:
    """The last-level cache this process effectively has, measured: random gathers of ``rows`` rows of ``width``
    float32 (a layer's source rows) from tables of ``sizes_mb``; the largest table whose time per row stays below
    half way between the fastest table's and the largest one's. About 1 s on the calibration's one torch thread.

    sysfs reports the whole socket's cache, which a VM's few cores share with other guests: this host's Xeon
    reports 480 MiB, and its gathers slow down past 32 MiB (76-80 ns per row up to 32 MiB, 94 at 64, 108-118 at
    128-512). The cost model's
    cache term (:func:`gsplit.estimate.model.layer_features`) with 480 MiB saw every share in cache, and the fit
    under-predicted the 1M-vertex shares' layers by up to a quarter; with the measured size it fits them within
    a tenth.

    Example:
        >>> effective_cache_bytes(sizes_mb=(1, 64), rows=4096, repeats=1) in (1 << 20, 64 << 20)
        True
    """
    per_row = {}
    gen = torch.Generator().manual_seed(0)
    out = torch.empty(rows, width)
    for mb in sizes_mb:
        n = max(1, (mb << 20) // (width * FLOAT_BYTES))
        table = torch.ones(n, width)  # written: untouched pages would all read the one zero page
        index = torch.randint(0, n, (rows,), generator=gen)
        per_row[mb] = _median_s(lambda: torch.index_select(table, 0, index, out=out), repeats, torch.device("cpu"))
        del table
    return cache_from_gather_times(per_row)


def cache_from_gather_times(per_row: Dict[int, float]) -> int:
    """:func:`effective_cache_bytes`' rule on its timings (``{table MiB: seconds}``): the largest table whose time
    stays below half way between the fastest table's and the largest table's, in bytes.

    Example (this host's Xeon, ns per 512-byte row):
        >>> cache_from_gather_times({1: 61, 2: 64, 4: 76, 8: 78, 16: 77, 32: 80, 64: 94, 128: 108, 256: 113}) >> 20
        32
    """
    fastest, largest = min(per_row.values()), per_row[max(per_row)]
    halfway = fastest + (largest - fastest) / 2
    return max(mb for mb, t in per_row.items() if t <= halfway) << 20


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

    def all_to_all_rows(self, x: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                        tag: Optional[str] = None) -> torch.Tensor:
        """Rows standing for what the other ranks would send (zeros, as many as ``recv_counts`` says): a shuffle
        on this communicator does all of the rank's own copies and none of the transport."""
        return x.new_zeros((sum(recv_counts),) + tuple(x.shape[1:]))


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


def host_speed_reference(repeats: int = 7, seed: int = 0) -> float:
    """Seconds of one fixed CPU workload (median of ``repeats``), run in a fresh process on one torch thread with
    :func:`~gsplit.runtime.resources.keep_freed_heap` (as a CPU rank): a SAGE-mean layer's forward and backward (the
    gather-mean kernel, a [5000, 256] x [256, 256] product, relu, the scatter back) on a seeded random block of
    24,000 sources, 5,000 destinations and 50,000 edges, about 50 ms on one core.

    The same bytes and operations in the same kind of process every time (nothing of the caller's threads or
    heap enters), so two timings differ only by the host's speed: the validation
    (``experiments/estimate_validation.py``) times it beside each calibration and beside each measured run,
    and reports their ratio. It is never fitted and never enters a prediction.

    Example:
        >>> host_speed_reference(repeats=1) > 0   # doctest: +SKIP
        True
    """
    return _in_fresh_processes(_reference_worker, (repeats, seed), timeout_s=300)[0]


def _reference_worker(repeats: int, seed: int, start, results) -> None:
    torch.set_num_threads(1)
    keep_freed_heap()
    start.wait()
    results.put(reference_workload_s(repeats, seed))


def _in_fresh_processes(target, args: tuple, copies: int = 1, timeout_s: float = 1800.0) -> list:
    """What ``target(*args, start, results)`` puts on ``results`` in each of ``copies`` spawned processes (fresh
    interpreters: none of this process's threads, heap or caches), released together by the event ``start``; in
    the order they finish. A process that exits with an error raises here at once (its traceback is above)."""
    import queue as queue_module

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results, start = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=target, args=(*args, start, results), daemon=True) for _ in range(copies)]
    for proc in procs:
        proc.start()
    start.set()
    out, deadline = [], time.monotonic() + timeout_s
    try:
        while len(out) < copies:
            try:
                out.append(results.get(timeout=1.0))
            except queue_module.Empty:
                # exit code 0 is a process that reported (its result may still be in flight): only errors count
                failed = [proc.exitcode for proc in procs if proc.exitcode not in (None, 0)]
                if failed:
                    raise RuntimeError(f"{target.__name__}: a process exited with code {failed[0]} before reporting; "
                                       "its error is above") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{target.__name__}: {copies - len(out)} of {copies} processes reported "
                                       f"nothing in {timeout_s:.0f} s") from None
        return out
    finally:
        for proc in procs:
            proc.join(timeout=60)


def reference_workload_s(repeats: int = 7, seed: int = 0) -> float:
    """:func:`host_speed_reference`'s workload in this process, as it is (its threads and heap).

    Example:
        >>> reference_workload_s(repeats=1) > 0
        True
    """
    from gsplit.ops.aggregate import self_and_mean  # the layers' kernel (gsplit.nn imports it the same way)

    g = torch.Generator().manual_seed(seed)
    num_src, num_dst, degree, width = 24_000, 5_000, 10, 128
    edge_dst = torch.arange(num_dst).repeat_interleave(degree)
    edge_src = torch.randint(0, num_src, (num_dst * degree,), generator=g)
    x = torch.randn(num_src, width, generator=g).requires_grad_()
    weight = (torch.randn(2 * width, 2 * width, generator=g) * 0.05).requires_grad_()

    def layer():
        torch.relu(self_and_mean(x, edge_src, edge_dst, num_dst) @ weight).sum().backward()
        x.grad = weight.grad = None

    layer()  # warm-up: the kernels' first call (and build), the allocator's first pages
    return _median_s(layer, repeats, torch.device("cpu"))


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

        def backward():
            # the same graph's backward, repeated; every pass stores its gradients as training's first (and only)
            # backward of a step does: accumulating into the last pass's x.grad added a read and a write of it
            # (+15-20 % on a hidden layer's backward, against the trainer's own layer clock)
            x.grad = None
            model.zero_grad(set_to_none=True)
            y.backward(grad, retain_graph=True)

        bwd = _median_s(backward, repeats, device)
        out.append((fwd, bwd))
        del y, grad
    return out


def _time_shuffle_copies(blocks, exchanged: Sequence[bool], comm: "PlanCommunicator", widths: Sequence[int],
                         device: torch.device, repeats: int) -> tuple:
    """``(seconds, rows)`` per layer of a rank's row copies in one shuffle forward and its backward, and the rows
    one direction moves (the rows it sends, what it receives, twice its own rows of the mixed frontier); 0 for a
    layer without a shuffle in training (``exchanged`` false: also the bottom block's plan of directly read input
    rows, which training never shuffles). The shuffle itself runs (:func:`gsplit.shuffle`'s autograd function) on
    ``comm``, whose all-to-all hands back rows standing for the received ones: the copies without the transport.
    What ``DeviceProfile.copy_bw`` is fitted to."""
    times, rows = [], []
    for li, block in enumerate(blocks):
        index = block.shuffle_index
        if index is None or not exchanged[li]:
            times.append(0.0)
            rows.append(0)
            continue
        h = torch.randn(index.num_local, widths[li], device=device, requires_grad=True)
        grad_out = torch.randn(index.num_mixed, widths[li], device=device)
        times.append(_median_s(lambda: _Shuffle.apply(h, index, comm).backward(grad_out), repeats, device))
        rows.append(int(index.send_idx.numel() + index.recv_pos.numel()))  # its own rows are in both
    return times, rows


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
    if dev.type == "cpu":  # as a CPU rank runs (gsplit.launch, train_rank): else every large temporary faults in
        keep_freed_heap()  # its pages anew and the shares time ~30 % slower than the ranks they stand for
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
                if world > 1:
                    rec["shuffle_s"], rec["shuffle_rows"] = _time_shuffle_copies(
                        blocks, [layer.exchanged for layer in work.layers], comm, [d[0] for d in shape.dims()], dev,
                        repeats)
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


def time_steps(dataset, cfg, progress: Optional[Callable[[str], None]] = None, warmup: int = 1) -> dict:
    """One rank of the real trainer (``train_rank(0, 1, cfg, ...)``): per iteration, what the step costs beyond its
    layers (``train_s`` less the layers' forward and backward), and the phases, medians over all but the first
    ``warmup`` iterations (a fresh process faults its heap in over the first few: on GAT with 1M vertices ~40k
    pages in each of iterations 0-3, which doubled their backward)."""
    from gsplit.run.trainer import train_rank

    log_ = train_rank(0, 1, cfg, dataset, None)
    its = [it for epoch in log_["epochs"] for r in epoch["ranks"] for it in r["per_iteration"]][warmup:]
    if not its:
        raise ValueError(f"time_steps needs more than warmup={warmup} iterations; raise cfg.max_iters")
    step = [it["train_s"] - sum(it["layer_fwd_s"]) - sum(it["layer_bwd_s"]) for it in its]
    out = {"step_s": statistics.median(step), "iterations": len(its),
           "input_rows": statistics.median(it["input_rows"] for it in its),
           "feat_dim": int(dataset.features.shape[1]),
           "iteration_s": statistics.median(it["sample_s"] + it["load_s"] + it["train_s"] for it in its)}
    for key in ("sample_s", "load_s", "train_s"):
        out[key] = statistics.median(it[key] for it in its)
    out["per_iteration"] = [{"sample_s": it["sample_s"], "load_s": it["load_s"], "train_s": it["train_s"],
                             "fwd_s": list(it["layer_fwd_s"]), "bwd_s": list(it["layer_bwd_s"])} for it in its]
    if progress is not None:
        progress(f"  step ({cfg.model}): {out['step_s'] * 1e3:.1f} ms beyond the layers; iteration sample "
                 f"{out['sample_s'] * 1e3:.1f} / load {out['load_s'] * 1e3:.1f} / train {out['train_s'] * 1e3:.1f} ms")
    return out


def _corun_worker(dataset, cfg, warmup, start, results) -> None:
    torch.set_num_threads(1)
    start.wait()
    results.put(time_steps(dataset, cfg, warmup=warmup))


def corun_steps(dataset, cfg, copies: int = 2, warmup: int = 1) -> List[dict]:
    """:func:`time_steps` in ``copies`` independent one-rank processes at once (one torch thread each, no process
    group, nothing exchanged): what each rank's work costs while ``copies`` cores are busy with the same kind of
    work. The ratio to :func:`time_steps` alone is the machine's contention (``DeviceProfile.contention``)."""
    return _in_fresh_processes(_corun_worker, (dataset, cfg, warmup), copies=copies)


def corun_effects(alone: dict, together: Sequence[dict]) -> dict:
    """From :func:`time_steps` alone and :func:`corun_steps`: per kind of work (``sample``, ``load``, ``compute``)
    the slowdown with every core busy, and ``noise``, the relative standard deviation of one step of work (a
    sampling pass, the load, one layer's forward or backward) estimated from how far two processes doing the
    same work on the same mini-batches drift apart (for two normal draws E|a - b| = 2 sigma / sqrt(pi)).

    Example:
        >>> it = lambda x: {"sample_s": x, "load_s": x, "train_s": 3 * x, "fwd_s": [x], "bwd_s": [x]}
        >>> alone = {"sample_s": 1.0, "load_s": 1.0, "train_s": 3.0}
        >>> e = corun_effects(alone, [{"sample_s": 1.2, "load_s": 1.5, "train_s": 3.3, "per_iteration": [it(1.0)]},
        ...                           {"sample_s": 1.2, "load_s": 1.5, "train_s": 3.3, "per_iteration": [it(1.0)]}])
        >>> e["contention"], e["noise"]
        ({'sample': 1.2, 'load': 1.5, 'compute': 1.1}, 0.0)
    """
    import math

    contention = {kind: statistics.median(r[key] for r in together) / alone[key]
                  for kind, key in (("sample", "sample_s"), ("load", "load_s"), ("compute", "train_s"))}
    contention = {k: round(v, 4) for k, v in contention.items()}
    rel = []
    for a, b in zip(together[0]["per_iteration"], together[1]["per_iteration"]):
        pairs = [(a["sample_s"], b["sample_s"]), (a["load_s"], b["load_s"])]
        pairs += list(zip(a["fwd_s"], b["fwd_s"])) + list(zip(a["bwd_s"], b["bwd_s"]))
        rel += [abs(x - y) / ((x + y) / 2) for x, y in pairs if x + y > 0]
    noise = statistics.mean(rel) * math.sqrt(math.pi) / 2 if rel else 0.0
    return {"contention": contention, "noise": noise}


# ---------------------------------------------------------------------------------------------- fitting
def nnls_relative(x: Sequence[Sequence[float]], y: Sequence[float],
                  relative_to: Optional[Sequence[float]] = None) -> List[float]:
    """Non-negative coefficients ``c`` minimising the relative errors ``(x @ c - y) / y`` (``/ relative_to``
    when given: ``y`` less a known part, the errors still relative to the whole).

    Example:
        >>> [round(c, 3) for c in nnls_relative([[1, 1], [2, 1], [4, 1]], [3, 5, 9])]
        [2.0, 1.0]
    """
    from scipy.optimize import nnls

    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    whole = b if relative_to is None else np.asarray(relative_to, dtype=np.float64)
    # relative errors, but a timing near zero (noise) must not pull the fit: weights floor at 5 % of the median
    w = 1.0 / np.maximum(whole, max(0.05 * float(np.median(whole)), 1e-12))
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    coef, _ = nnls((a / scale) * w[:, None], b * w)
    return (coef / scale).tolist()


def fit_errors(x: Sequence[Sequence[float]], y: Sequence[float], coef: Sequence[float]) -> dict:
    """Median and largest relative error of a fit, in percent."""
    pred = np.asarray(x, dtype=np.float64) @ np.asarray(coef)
    rel = np.abs(pred - np.asarray(y)) / np.maximum(np.asarray(y), 1e-9)
    return {"median_pct": float(np.median(rel) * 100), "max_pct": float(rel.max() * 100), "points": len(y)}


def fit_copy_bw(shares: Dict[str, List[dict]], shapes: Dict[str, ModelShape]) -> Optional[float]:
    """Bytes per second of a split rank's row copies around its shuffles, from the shares' ``shuffle_s`` (a shuffle
    forward and backward: twice the bytes of ``shuffle_rows``, over all seconds), as the model charges them (the
    same rows each way); ``None`` when no share timed them (world size 1 only, or an older calibration).

    Example:
        >>> fit_copy_bw({"sage": [{"shuffle_s": [0.0, 0.5], "shuffle_rows": [0, 1000]}]},
        ...             {"sage": ModelShape("sage", 4, 250, 2, 2)})
        4000000.0
    """
    nbytes = seconds = 0.0
    for model, recs in shares.items():
        dims = shapes[model].dims()
        for r in recs:
            for li, (t, n) in enumerate(zip(r.get("shuffle_s", ()), r.get("shuffle_rows", ()))):
                nbytes += 2 * n * dims[li][0] * FLOAT_BYTES
                seconds += t
    return nbytes / seconds if seconds > 0 else None


def fit_device(name: str, shares: Dict[str, List[dict]], shapes: Dict[str, ModelShape], steps: Dict[str, dict],
               host_bw: Optional[float] = None, cores: Optional[int] = None, source: str = "",
               load_runs: Sequence[dict] = (), cache_bytes: Optional[int] = None,
               sample_call_s: Optional[float] = None) -> tuple:
    """Fit a :class:`DeviceProfile` from :func:`time_shares` records (by model) and :func:`time_steps` results.

    Returns ``(profile, load, quality)``: ``load`` is ``{"host_bw", "load_call_s"}`` (the gather's bandwidth
    and fixed cost: from ``load_runs``, :func:`time_steps` results of the real loader, when given, else from the
    shares' gather timings; ``host_bw`` overrides the bandwidth), ``quality`` the fits' relative errors.
    ``sample_call_s``: a measured cost per sampled layer to hold fixed instead of fitting it (on a GPU, the
    sampling and relabelling kernels of one layer at a small size); shares that all sample the same number of
    layers cannot tell it from the per-row cost, and the fit then puts it there or at 0.
    """
    quality = {}
    all_recs = [r for recs in shares.values() for r in recs]
    # sampling: per iteration, the sums over layers of the per-layer features
    xs = [[sum(r["edges"]), sum(r["src"]), sum(r["ids"]), len(r["edges"])] for r in all_recs]
    ys = [r["sample_s"] for r in all_recs]
    if sample_call_s is None:
        sample = nnls_relative(xs, ys)
    else:  # the rest of each timing is the per-unit costs' share
        sample = nnls_relative([x[:3] for x in xs], [y - x[3] * sample_call_s for x, y in zip(xs, ys)], ys)
        sample.append(float(sample_call_s))
    quality["sample"] = fit_errors(xs, ys, sample)
    # loading: bytes and one call
    if load_runs:  # the trainer's own loader: fresh output buffers and cold caches, as in training
        xl = [[r["input_rows"] * r["feat_dim"] * FLOAT_BYTES, 1.0] for r in load_runs]
        yl = [r["load_s"] for r in load_runs]
    else:
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
                xf.append(layer_features(*work, cache_bytes=cache_bytes))
                xb.append(layer_features(*work, backward=True, input_grad=li > 0, cache_bytes=cache_bytes))
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
                            source=source, cache_bytes=cache_bytes, copy_bw=fit_copy_bw(shares, shapes))
    return profile, {"host_bw": bw, "load_call_s": call}, quality


# ---------------------------------------------------------------------------------------------- transport
_EVICT_BYTES = 64 << 20
"""Memory each rank streams before every timed collective of :func:`transport_profile` (beyond the caches)."""


def _transport_rank(rank: int, world: int, sizes: Sequence[int], repeats: int, iters: int) -> Optional[dict]:
    import torch.distributed as dist

    out = {"all_to_all": {}, "all_reduce": {}}
    evict = torch.zeros(_EVICT_BYTES // FLOAT_BYTES)
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
            # one call at a time, after a stretch of memory work, the ranks released together by a barrier: a
            # training iteration issues its collectives one by one between layers, and there gloo's exchange costs
            # about twice what it costs in a back-to-back series (0.5 MB to the peer, 2 ranks: 0.37 ms back to
            # back, 0.7-0.8 ms after 10 ms of compute; a split shuffle of 1.1 MB: 0.5 ms against 1.2-1.5 inside
            # training). The work streams a buffer larger than the last-level cache, as a layer does.
            times = []
            for _ in range(repeats * iters):
                evict.add_(1.0)
                dist.barrier()
                t0 = time.perf_counter()
                op()
                times.append(time.perf_counter() - t0)
            t = torch.tensor([statistics.median(times)], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out[key][size] = float(t)
    return out if rank == 0 else None


def fit_link(raw: Dict[int, dict], host_bw: float) -> LinkProfile:
    """The ``cpu-gloo`` :class:`LinkProfile` fitted to :func:`transport_profile`'s ``raw`` timings
    (``raw[world][collective][bytes]`` seconds; JSON's string keys are accepted)."""
    a2a, ar = {}, {}
    for w, got in raw.items():
        w = int(w)
        for key, table in (("all_to_all", a2a), ("all_reduce", ar)):
            factor = 1.0 if key == "all_to_all" else 2.0 * (w - 1) / w
            sizes = sorted(int(b) for b in got[key])
            x = [[b * factor, 1.0] for b in sizes]
            y = [got[key].get(b, got[key].get(str(b))) for b in sizes]
            per_byte, latency = nnls_relative(x, y)
            table[w] = Collective(latency_s=latency, bus_bw=1.0 / per_byte if per_byte > 0 else float("inf"))
    return LinkProfile(name="cpu-gloo", all_to_all=a2a, all_reduce=ar, host_bw=host_bw,
                       source="gloo micro-benchmark on this host (gsplit.estimate.calibrate.transport_profile)")


def transport_profile(worlds: Sequence[int], sizes: Sequence[int], host_bw: float, repeats: int = 5, iters: int = 10,
                      progress: Optional[Callable[[str], None]] = None) -> tuple:
    """Time gloo's all-to-all and all-reduce between ``w`` CPU ranks of this host for every ``w`` in ``worlds``
    (one torch thread per rank, as the trainer's ranks have) and fit a ``cpu-gloo`` :class:`LinkProfile`. Each
    call is timed alone (``repeats * iters`` of them per size, median), after each rank streamed
    ``_EVICT_BYTES`` of memory and a barrier released the ranks together, as training issues them between
    layers: a series of back-to-back calls runs about twice as fast per call.

    Returns ``(link, raw)``: ``raw[w][collective][bytes]`` are the measured seconds (slowest rank, median).
    """
    from gsplit.launcher import launch

    raw = {}
    for w in worlds:
        raw[w] = launch(_transport_rank, w, args=(list(sizes), repeats, iters), devices="cpu", backend="gloo",
                        timeout=600)[0]
        if progress is not None:
            c, r = fit_link({w: raw[w]}, host_bw).all_to_all[w], fit_link({w: raw[w]}, host_bw).all_reduce[w]
            progress(f"  transport, {w} ranks: all-to-all {c.latency_s * 1e3:.2f} ms + bytes / {c.bus_bw / 1e9:.2f} GB/s; "
                     f"all-reduce {r.latency_s * 1e3:.2f} ms + bytes / {r.bus_bw / 1e9:.2f} GB/s")
    return fit_link(raw, host_bw), raw
