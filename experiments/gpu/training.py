"""Training on one device: the time to the first iteration (part ``first_iteration``), the rows against their
floors (``train``) and macrobatches (``macrobatch``)."""
from __future__ import annotations

import statistics
import time
import traceback
from pathlib import Path
from typing import Callable

from harness.rounds import Budget
import torch

import gsplit

from gpu import HIDDEN, SYSTEMS


# ---------------------------------------------------------------------------------------- 3. first iteration
def _measured_row(row: dict, uva: bool, dev: torch.device, budget: Budget, need_s: float,
                  measure: Callable[[], dict]) -> dict:
    """``row`` with what ``measure()`` returns and ``status`` "ok", or why it did not run or failed."""
    if uva and dev.type != "cuda":
        row["status"] = "skipped: --uva needs a GPU"
    elif budget.left() < need_s:
        row["status"] = f"not run: {budget.left():.0f} s of the budget left"
    else:
        try:
            row.update(measure())
            row["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - one failed row must not hide the others
            row["status"] = f"FAILED: {type(exc).__name__}: {str(exc)[:300]}"
            row["traceback"] = traceback.format_exc()[-4000:]
    return row


def _first_iteration(ds, dev: torch.device, system: str, uva: bool, fanouts, batch: int) -> dict:
    from gsplit.run.trainer import TrainConfig, train_rank

    cfg = TrainConfig(system=system, uva=uva, epochs=1, max_iters=3, eval_every=0, device=str(dev),
                      fanouts=list(fanouts), batch_size=batch, hidden=HIDDEN, log_iterations=True,
                      final_eval=False)
    t0 = time.monotonic()
    log = train_rank(0, 1, cfg, ds, None)
    wall = time.monotonic() - t0
    epoch = log["epochs"][0]
    first = epoch["ranks"][0]["per_iteration"][0]
    setup = wall - epoch["epoch_s"]
    return {"setup_s": setup, "first_iteration_s": setup + first["sample_s"] + first["load_s"] + first["train_s"],
            "wall_s": wall}


def first_iteration(ds, dev: torch.device, folder: Path, fanouts, batch: int, budget: Budget) -> dict:
    out = {"rows": []}
    t0 = time.monotonic()
    if not (folder / "meta.json").exists():
        gsplit.datasets.save_folder(ds, folder)
    out["write_folder_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    from_folder = gsplit.datasets.load(f"folder:{folder}")
    out["load_folder_s"] = time.monotonic() - t0
    for source, data in (("folder", from_folder), ("memory", ds)):
        for name, system, uva in SYSTEMS:
            row = _measured_row({"source": source, "system": name}, uva, dev, budget, 30,
                                lambda: _first_iteration(data, dev, system, uva, fanouts, batch))
            if row["status"] == "ok" and row["first_iteration_s"] > 10:
                row["status"] = "SLOW (> 10 s)"
            out["rows"].append(row)
    return out

# ---------------------------------------------------------------------------------------- 7. the rows
def floor(stats: dict, rates: dict, uva: bool, feat_dim: int, num_classes: int, feature_bytes: int = 4) -> dict:
    """The iteration's floor in ms: sampled edges over the sampling kernel's measured rate, feature bytes over
    the measured gather bandwidth, and each layer's bytes over the device's copy bandwidth. A layer's bytes
    (SAGE, mean): its forward reads a source row per edge and writes a destination row (the aggregation),
    then reads two rows and writes one per destination (the dense part); backward moves about twice that."""
    rate = rates["sample_edges_per_s_uva" if uva else "sample_edges_per_s"]
    sample = sum(stats["edges"]) / rate
    feature = stats["input_rows"] * feat_dim * feature_bytes / rates["gather_Bps"]
    layer_bytes = 0
    depth = len(stats["edges"])
    for i, (e, d) in enumerate(zip(stats["edges"], stats["dst_vertices"])):
        w_in = feat_dim if i == 0 else HIDDEN
        w_out = num_classes if i == depth - 1 else HIDDEN
        layer_bytes += 3 * 4 * ((e + d) * w_in + d * (2 * w_in + w_out))
    compute = layer_bytes / rates["device_Bps"]
    return {"sample_ms": 1e3 * sample, "feature_ms": 1e3 * feature, "layers_ms": 1e3 * compute,
            "total_ms": 1e3 * (sample + feature + compute)}


def _busy(prof, wall_s: float, on_gpu: bool) -> dict:
    """GPU-busy share (union of device intervals / wall) and the top kernels and host operations."""
    from torch.autograd import DeviceType

    out: dict = {"busy_share": None}
    averages = prof.key_averages()
    if on_gpu:
        spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start)
        busy, cur_start, cur_end = 0.0, None, None
        for s, e in spans:
            if cur_end is None or s > cur_end:
                if cur_end is not None:
                    busy += cur_end - cur_start
                cur_start, cur_end = s, e
            else:
                cur_end = max(cur_end, e)
        if cur_end is not None:
            busy += cur_end - cur_start
        out["busy_share"] = busy / 1e6 / wall_s
        key = "self_device_time_total" if hasattr(averages[0], "self_device_time_total") else "self_cuda_time_total"
        top = sorted(averages, key=lambda a: -getattr(a, key))[:8]
        out["top_device"] = [(a.key[:80], a.count, getattr(a, key) / 1e3) for a in top if getattr(a, key) > 0]
    top_cpu = sorted(averages, key=lambda a: -a.self_cpu_time_total)[:8]
    out["top_host"] = [(a.key[:80], a.count, a.self_cpu_time_total / 1e3) for a in top_cpu]
    return out


def train_row(ds, dev: torch.device, sync, system: str, uva: bool, batch: int, fanouts, warmup: int, iters: int,
              profile_iters: int, rates: dict, precision: str = "fp32") -> dict:
    from torch.profiler import ProfilerActivity, profile

    from gsplit.run.amp import MixedPrecision

    from gsplit.nn import build_model
    from gsplit.run.trainer import SYSTEMS as TRAIN_SYSTEMS
    from gsplit.run.trainer import TrainConfig, rank_graph

    cfg = TrainConfig(system=system, uva=uva, fanouts=list(fanouts), batch_size=batch, hidden=HIDDEN,
                      device=str(dev), eval_every=0, precision=precision)
    amp = MixedPrecision(precision, dev)  # the trainer's step: autocast, fp16's scaler
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.monotonic()
    impl = TRAIN_SYSTEMS[system]
    sampler = gsplit.NeighborSampler(cfg.fanouts, seed=cfg.seed)
    graph = rank_graph(ds.graph, dev, uva)
    loader = impl.make_loader(cfg, ds, graph, ds.train_idx, None, dev, sampler, True, cache_size=cfg.cache_size,
                              prefetch=cfg.prefetch, input_features=cfg.input_features)
    torch.manual_seed(0)
    model = build_model("sage", ds.features.shape[1], HIDDEN, ds.num_classes, num_layers=len(fanouts),
                        dropout=cfg.dropout).to(dev)
    model = impl.prepare_model(cfg, model, loader)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    setup_s = time.monotonic() - t0
    state = {"epoch": 0, "it": None, "stats": []}

    def batches():
        while True:
            loader.set_epoch(state["epoch"])
            for _, _, blocks in loader:
                yield blocks
            state["epoch"] += 1

    stream = batches()

    def step():
        blocks = next(stream)
        state["stats"].append(loader.last_stats)
        opt.zero_grad()
        with amp.autocast():
            logits = model(blocks, blocks[0].srcdata["feat"], loader.comm)
            loss = impl.loss(logits, blocks[-1].dstdata["label"], blocks[-1], 1)
        amp.backward(loss)
        amp.step(opt)

    step()
    sync()
    first_s = time.monotonic() - t0
    for _ in range(warmup):
        step()
    sync()
    state["stats"] = []
    t1 = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    ms = 1e3 * (time.perf_counter() - t1) / iters
    stats = state["stats"]
    mean = {"edges": [statistics.mean(s.edges[i] for s in stats) for i in range(len(fanouts))],
            "dst_vertices": [statistics.mean(s.dst_vertices[i] for s in stats) for i in range(len(fanouts))],
            "input_rows": statistics.mean(s.input_rows for s in stats),
            "sample_ms": 1e3 * statistics.mean(s.sample_s for s in stats),
            "load_ms": 1e3 * statistics.mean(s.load_s for s in stats)}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        t2 = time.perf_counter()
        for _ in range(profile_iters):
            step()
        sync()
        profiled_s = time.perf_counter() - t2
    row = {"setup_s": setup_s, "to_first_iteration_s": first_s, "ms_per_iteration": ms,
           "host_sample_ms": mean["sample_ms"], "host_load_ms": mean["load_ms"],
           "sampled_edges": sum(mean["edges"]), "input_rows": mean["input_rows"],
           "feature_store": getattr(getattr(loader, "feature_store", None), "mode", None),
           "floor": floor(mean, rates, uva, ds.features.shape[1], ds.num_classes, ds.features.element_size()),
           "feature_dtype": str(ds.features.dtype).replace("torch.", ""), "precision": precision,
           "profiled_ms_per_iteration": 1e3 * profiled_s / profile_iters}
    row["over_floor"] = ms / row["floor"]["total_ms"]
    busy = _busy(prof, profiled_s, dev.type == "cuda")
    row["gpu_busy_share"] = busy["busy_share"]
    if row["over_floor"] > 3:
        row["where_the_rest_goes"] = {k: v for k, v in busy.items() if k != "busy_share"}
    if dev.type == "cuda":
        row["peak_device_GiB"] = torch.cuda.max_memory_allocated(dev) / 2**30
    return row


def train(ds, dev: torch.device, sync, rows_spec, warmup: int, iters: int, profile_iters: int, rates: dict,
          budget: Budget, precision: str = "fp32") -> dict:
    """The rows; ``precision`` ``"bf16"`` (the ``train_bf16`` part): ``ds``'s features already in bfloat16 and the
    layers under bfloat16 autocast, the floor counting 2-byte feature rows."""
    rows = []
    for batch, fanouts in rows_spec:
        for name, system, uva in SYSTEMS:
            row = _measured_row({"system": name, "targets": batch, "fanouts": ",".join(map(str, fanouts))}, uva,
                                dev, budget, 20, lambda: train_row(ds, dev, sync, system, uva, batch, fanouts, warmup,
                                                                   iters, profile_iters, rates, precision))
            rows.append(row)
            print(f"  {name:9s} {batch:5d} {row['fanouts']:9s} {row.get('ms_per_iteration', float('nan')):8.2f} ms "
                  f"(floor {row.get('floor', {}).get('total_ms', float('nan')):.2f}) {row['status']}", flush=True)
    return {"hidden": HIDDEN, "warmup": warmup, "iters": iters, "profile_iters": profile_iters, "rows": rows,
            "precision": precision, "feature_dtype": str(ds.features.dtype).replace("torch.", "")}

def macrobatch(ds, dev: torch.device, sizes, iters: int, budget: Budget) -> dict:
    """Issue 33: UVA bytes and time per iteration with B mini-batches per macrobatch (split and dp, one rank)."""
    from gsplit.run.trainer import TrainConfig, train_rank

    rows = []
    for system in ("split", "dp"):
        for size in sizes:
            if budget.left() < 30:
                rows.append({"system": system, "macrobatch": size, "status": f"not run: {budget.left():.0f} s left"})
                continue
            cfg = TrainConfig(system=system, epochs=1, max_iters=iters, eval_every=0, device=str(dev), hidden=HIDDEN,
                              macrobatch=size, final_eval=False)
            epoch = train_rank(0, 1, cfg, ds, None)["epochs"][0]
            its = epoch["ranks"][0]["per_iteration"]
            n = max(1, len(its))
            rows.append({"system": system, "macrobatch": size, "iterations": len(its),
                         "ms_per_iteration": 1e3 * epoch["epoch_s"] / n,
                         "sample_ms": 1e3 * sum(it["sample_s"] for it in its) / n,
                         "load_ms": 1e3 * sum(it["load_s"] for it in its) / n,
                         "input_rows_per_iteration": sum(it["input_rows"] for it in its) / n,
                         "host_MB_per_iteration": sum(it["host_bytes"] for it in its) / n / 1e6})
    return {"rows": rows}
