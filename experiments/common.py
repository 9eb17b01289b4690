"""Helpers shared by every experiment script: arguments, data, partition maps, launches, tables, JSON, figures.

Scripts run as ``python experiments/NAME.py [--quick] [--out DIR]``; this module sits next to them, so
``import common`` works (the script's folder is first on ``sys.path``, and spawned ranks inherit it).
Everything a script reports is computed from the library's own counters (``gsplit.trainer`` logs,
``Communicator.traffic``, ``split_stats``) or from the reference sampler, never estimated.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

# Before torch loads OpenMP: with the default (spinning) wait policy a multi-threaded process collapses
# (10x slower and worse) whenever another process holds one of the few cores, as other jobs on a shared
# 2-core machine do; passive waiting costs nothing measurable when the cores are free. Ranks inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
LOAD_AT_START = os.getloadavg() if hasattr(os, "getloadavg") else None
"""The host's 1/5/15-minute load averages when the experiment started (other jobs share the cores)."""

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # no display: figures go straight to PNG files
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import gsplit  # noqa: E402
from gsplit import datasets  # noqa: E402
from gsplit.trainer import TrainConfig, train_rank  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
"""Root of the repository."""
DATA = REPO.parent / "shared" / "data"
"""The real graphs beside the project (absent on a user's machine: experiments then skip them)."""
RESULTS = REPO / "experiments" / "results"
"""Default output folder."""
PHASES = (("sample", "sample"), ("load", "load"), ("train", "forward-backward"))
"""The trainer's time phases (key prefix in the logs, label in figures)."""


# ---------------------------------------------------------------------------------------- arguments
def make_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every experiment takes: ``--quick``, ``--out`` and ``--seed``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes that finish in minutes on 2 cores")
    p.add_argument("--out", default=str(RESULTS), help=f"output folder for JSON and PNG (default {RESULTS})")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, the sampler, the global order and the model")
    return p


def output_stem(args, name: str) -> Path:
    """``OUT/name`` for full runs, ``OUT/name_quick`` for ``--quick`` (quick runs never overwrite full results)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out / (f"{name}_quick" if args.quick else name)


# ---------------------------------------------------------------------------------------- data
def data_file(name: str) -> Optional[Path]:
    """Path of a file in ``../shared/data``, or ``None`` (with a note on stderr) when it is absent."""
    p = DATA / name
    if not p.exists():
        print(f"note: {p} is absent; skipping the experiments that need it", file=sys.stderr)
        return None
    return p


def load_named(key: str, num_nodes: int, seed: int = 0):
    """The datasets of the experiments by short name: ``synthetic``, ``cora``, ``bio``; ``None`` if absent.

    ``synthetic`` is :func:`gsplit.datasets.make_synthetic` with ``num_nodes`` vertices (average degree
    15, 64 features, 8 classes, 60/20/20 split); ``cora`` uses the Planetoid split (20 per class, 500
    val, 1000 test, seed 0); ``bio`` is the bio-pathways PPI graph with random features and labels.
    """
    if key == "synthetic":
        return datasets.load("synthetic", num_nodes=num_nodes, seed=seed)
    if key == "cora":
        p = data_file("cora.npz")
        return None if p is None else datasets.load(f"npz:{p}", split="planetoid", split_seed=seed)
    if key == "bio":
        p = data_file("bio-pathways-network.csv")
        return None if p is None else datasets.load(f"edgelist:{p}", seed=seed)
    raise ValueError(f"unknown dataset key {key!r}; use synthetic, cora or bio")


def each_dataset(keys: str, num_nodes: int, seed: int, data_info: dict):
    """Yield ``(key, label, dataset)`` for the comma-separated ``keys`` that are present.

    Records each dataset's summary in ``data_info[label]`` and prints one line about it.
    """
    for key in keys.split(","):
        ds = load_named(key, num_nodes, seed)
        if ds is None:
            print(f"{key}: data not found, skipped", flush=True)
            continue
        label = {"cora": "cora", "bio": "bio-pathways"}.get(key, f"synthetic-{num_nodes // 1000}k")
        data_info[label] = describe_dataset(ds)
        print(f"{label}: {ds.num_nodes:,} vertices, {ds.num_edges:,} edges, {ds.train_idx.numel():,} train", flush=True)
        yield key, label, ds


def describe_dataset(ds) -> dict:
    """A JSON-ready summary of a dataset."""
    return {"name": ds.name, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges, "feature_dim": ds.feature_dim,
            "num_classes": ds.num_classes, "train": int(ds.train_idx.numel()), "val": int(ds.val_idx.numel()),
            "test": int(ds.test_idx.numel()), "split": ds.meta.get("split"),
            "random_features": bool(ds.synthetic_features)}


# ---------------------------------------------------------------------------------------- partition maps
def make_map(ds, world: int, method: str, fanouts: Sequence[int], batch_size: int, seed: int = 0,
             presample_epochs: int = 10, weights=None) -> Tuple[gsplit.PartitionMap, dict, object]:
    """Partition ``ds`` for ``world`` ranks with ``method`` (``batch_size`` per rank, as the loaders take it);
    returns the map, its timings and the weights. A thin wrapper of :func:`gsplit.prepare_partition`, the
    same code ``gsplit prepare`` runs; ``weights`` from an earlier call (same world and sampler) skip
    pre-sampling.
    """
    prepared = gsplit.prepare_partition(ds, world, fanouts, batch_size, method, seed, presample_epochs,
                                        stats_batches=0, weights=weights)
    r = prepared.report
    return prepared.pmap, {"method": method, "world": world, "presample_s": r["presample_s"],
                           "partition_s": r["partition_s"], "presample_epochs": r["presample_epochs"]}, \
        (prepared.weights if prepared.weights is not None else weights)


# ---------------------------------------------------------------------------------------- training runs
def rank_jobs(rank: int, dataset, jobs: List[Tuple[TrainConfig, Optional[torch.Tensor]]]):
    """Rank body of :func:`run_jobs`: every job through the same trainer, in one process group."""
    logs = [train_rank(rank, cfg, dataset, owner) for cfg, owner in jobs]
    return logs if rank == 0 else None  # rank 0's log already holds every rank's counters


def run_jobs(dataset, world: int, jobs: List[Tuple[TrainConfig, Optional[torch.Tensor]]]) -> List[dict]:
    """Run training jobs ``(TrainConfig, owner)`` on ``world`` CPU ranks over gloo; returns rank 0's logs.

    All jobs share one launch, so process start-up and data transfer are paid once. The first
    iteration of every job is excluded from :func:`iteration_times` (warm-up).
    """
    t = time.perf_counter()
    logs = gsplit.launch(rank_jobs, world, args=(dataset, jobs), devices="cpu", backend="gloo", timeout=600)[0]
    print(f"  ({len(jobs)} run(s) on {world} ranks in {time.perf_counter() - t:.1f}s)", flush=True)
    return logs


def run_repeated(dataset, world: int, jobs: Dict[object, Tuple[TrainConfig, Optional[torch.Tensor]]],
                 repeats: int = 1) -> Dict[object, List[dict]]:
    """Run every job ``key -> (TrainConfig, owner)`` ``repeats`` times in one launch; returns ``key -> logs``.

    Even repeats run the jobs in the given order, odd repeats in reverse (ABBA), so that warm-up and
    slow drifts of the machine's load do not favour one job.
    """
    keys = list(jobs)
    order = [k for rep in range(repeats) for k in (keys if rep % 2 == 0 else keys[::-1])]
    logs = run_jobs(dataset, world, [jobs[k] for k in order])
    out: Dict[object, List[dict]] = {k: [] for k in keys}
    for k, log in zip(order, logs):
        out[k].append(log)
    return out


def iteration_times(logs, skip_first: int = 1) -> dict:
    """Per-iteration time of one trainer log (or of several runs of the same job), from every rank's records.

    For every iteration each phase (sample, load, forward-backward) is taken at its max over ranks
    (the slowest rank sets the pace, as in the trainer's epoch records) and ``total`` is the max over
    ranks of the sum of the three. Values are medians over iterations (robust to the spikes other jobs
    on a shared machine cause), skipping the first ``skip_first`` iterations of every run (warm-up);
    ``*_mean_s`` are the means and ``per_iteration`` keeps ``[sample, load, train]`` of every rank.
    """
    rows = []
    for log in ([logs] if isinstance(logs, dict) else logs):
        run_rows = []
        for rec in log["epochs"]:
            per_rank = [r["per_iteration"] for r in rec["ranks"]]
            for it in range(min(len(p) for p in per_rank)):
                run_rows.append([(p[it]["sample_s"], p[it]["load_s"], p[it]["train_s"]) for p in per_rank])
        rows += run_rows[skip_first:] if len(run_rows) > skip_first else run_rows
    if not rows:
        raise ValueError("the log holds no per-iteration records; run with TrainConfig(log_iterations=True)")
    series = {"sample_s": [max(r[0] for r in row) for row in rows],
              "load_s": [max(r[1] for r in row) for row in rows],
              "train_s": [max(r[2] for r in row) for row in rows],
              "total_s": [max(sum(r) for r in row) for row in rows]}
    out = {"iterations": len(rows)}
    for key, xs in series.items():
        out[key] = statistics.median(xs)
        out[key.replace("_s", "_mean_s")] = statistics.fmean(xs)
    out["per_iteration"] = [[[round(x, 5) for x in r] for r in row] for row in rows]
    return out


def epoch_counters(log: dict, epoch: int = 0) -> dict:
    """Counters of one epoch summed over ranks, with per-layer imbalance (max / mean over ranks) of edges."""
    rec = log["epochs"][epoch]
    ranks = rec["ranks"]
    per_layer_edges = list(zip(*[r["edges"] for r in ranks]))
    imbalance = [max(col) / (sum(col) / len(col)) if sum(col) else 1.0 for col in per_layer_edges]
    inputs = [r["input_rows"] for r in ranks]
    iters = max(r["iterations"] for r in ranks)
    return {"iterations": iters, "input_rows": rec["input_rows"], "edges": rec["edges"],
            "dst_vertices": rec["dst_vertices"], "edge_imbalance_run": imbalance,
            "input_imbalance_run": max(inputs) / (sum(inputs) / len(inputs)) if sum(inputs) else 1.0,
            "traffic_bytes": rec["traffic_bytes"], "traffic_bytes_by_tag": rec["traffic_bytes_by_tag"],
            "traffic_rows_by_tag": rec["traffic_rows_by_tag"], "epoch_s": rec["epoch_s"],
            "sample_s": rec["sample_s"], "load_s": rec["load_s"], "train_s": rec["train_s"]}


def shuffle_bytes_per_layer(traffic_bytes_by_tag: Dict[str, int], num_layers: int) -> List[int]:
    """Shuffle bytes (forward + backward, all ranks) per layer from a trainer record's per-tag traffic."""
    return [sum(n for tag, n in traffic_bytes_by_tag.items() if tag.startswith(f"shuffle/layer{layer}/"))
            for layer in range(num_layers)]


def id_bytes(traffic_bytes_by_tag: Dict[str, int]) -> int:
    """Bytes of the sampling id exchanges (all layers, all ranks)."""
    return sum(n for tag, n in traffic_bytes_by_tag.items() if tag.startswith("ids/"))


# ---------------------------------------------------------------------------------------- output
def _fmt(v, floatfmt: str) -> str:
    if isinstance(v, float):
        return format(v, floatfmt)
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def format_table(headers: Sequence[str], rows: Sequence[Sequence], floatfmt: str = ".3g") -> str:
    """A Markdown pipe table (readable in a terminal, pasteable into a README)."""
    cells = [[str(h) for h in headers]] + [[_fmt(v, floatfmt) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def machine_info() -> dict:
    """Where the numbers were measured."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cores": cores, "cuda": torch.cuda.is_available(), "gsplit": gsplit.__version__,
            "torch_threads_main": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "load_average_start": LOAD_AT_START,
            "load_average_end": os.getloadavg() if hasattr(os, "getloadavg") else None}


def _rel(path: Path) -> str:
    try:
        return os.path.relpath(path, Path.cwd())
    except ValueError:
        return str(path)


def save_json(stem: Path, payload: dict) -> Path:
    """Write ``payload`` with the command line, the machine and the time to ``stem.json``."""
    out = stem.with_suffix(".json")
    doc = {"command": "python " + " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]),
           "argv": sys.argv, "machine": machine_info(), "finished": time.strftime("%Y-%m-%d %H:%M:%S"), **payload}
    out.write_text(json.dumps(doc, indent=1, default=float))
    print(f"wrote {_rel(out)}")
    return out


def save_figure(fig, stem: Path) -> Path:
    out = stem.with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {_rel(out)}")
    return out


def bar_panel(ax, groups: Sequence[str], series: Dict[str, Sequence[float]], ylabel: str, title: str = "",
              log: bool = False) -> None:
    """Grouped bars: one group per entry of ``groups``, one bar per series."""
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def stacked_panel(ax, groups: Sequence[str], parts: Dict[str, Sequence[float]], ylabel: str, title: str = "") -> None:
    """Stacked bars: one bar per group, one stacked segment per entry of ``parts``."""
    bottom = [0.0] * len(groups)
    for name, values in parts.items():
        ax.bar(range(len(groups)), values, 0.6, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def line_panel(ax, curves: Dict[str, Tuple[Sequence[float], Sequence[float]]], xlabel: str, ylabel: str,
               title: str = "") -> None:
    """One line per curve ``name -> (xs, ys)``."""
    for name, (xs, ys) in curves.items():
        ax.plot(xs, ys, marker="o", markersize=3, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def figure(ncols: int, nrows: int = 1, width: float = 4.2, height: float = 3.3):
    """A figure with ``nrows x ncols`` panels (always returned as a flat list)."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, [ax for row in axes for ax in row]
