"""Training jobs through ``gsplit.run.trainer`` on CPU ranks in one launch, and what their logs say.

Both systems (``split`` and the data-parallel ``dp``) train through the same function,
:func:`gsplit.run.trainer.train_rank`, launched with :func:`gsplit.launch`; every figure below is read from the
trainer's own per-rank, per-iteration records.
"""

from __future__ import annotations

import statistics
import time
from typing import Dict, List, Optional, Tuple

import torch

import gsplit
from gsplit.run.trainer import TrainConfig, train_rank

from . import rounds

PHASES = (("sample", "sample"), ("load", "load"), ("train", "forward-backward"))
"""The trainer's time phases (key prefix in the logs, label in figures)."""


def rank_jobs(rank: int, world_size: int, dataset, jobs: List[Tuple[TrainConfig, Optional[torch.Tensor]]]):
    """Rank body of :func:`run_jobs`: every job through the same trainer, in one process group."""
    logs = [train_rank(rank, world_size, cfg, dataset, owner) for cfg, owner in jobs]
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

    Even repeats run the jobs in the given order, odd repeats in reverse (ABBA, :func:`harness.rounds.orders`),
    so that warm-up and slow drifts of the machine's load do not favour one job.
    """
    keys = list(jobs)
    order = [k for _, ks in rounds.orders(keys, repeats) for k in ks]
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


def full_graph_step(system: str, dataset, device: torch.device, hidden: int, num_layers: int = 3,
                    precision: str = "fp32"):
    """One full-batch SAGE training step as a function, ``system`` ``"gsplit"`` (gsplit's full-graph system, one
    rank) or ``"pyg"`` (torch-geometric's ``GraphSAGE`` over an ``edge_index``): what the GPU benchmark times
    and ``full_graph_memory.py`` measures, built once here so both compare the same two models.

    ``precision`` ``"bf16"``/``"fp16"``: both models' forward and loss under ``torch.autocast`` in that dtype
    (gsplit's :class:`~gsplit.run.amp.MixedPrecision`, the trainer's recipe, float16 with its scaler); the
    features keep whatever dtype ``dataset`` has (gsplit's first layer upcasts half-precision rows, PyG's
    layers take them as they are)."""
    from gsplit.run.amp import MixedPrecision

    amp = MixedPrecision(precision, device)
    if system == "pyg":
        from torch_geometric.nn.models import GraphSAGE

        x, y = dataset.features.to(device), dataset.labels.to(device)
        edge_index = torch.stack([dataset.graph.indices, dataset.graph.edge_dst()]).to(device)
        train = dataset.train_idx.to(device)
        torch.manual_seed(0)
        model = GraphSAGE(x.shape[1], hidden, num_layers=num_layers, out_channels=dataset.num_classes,
                          dropout=0.5).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=0.003)

        def step():
            model.train()
            opt.zero_grad()
            with amp.autocast():
                out = model(x, edge_index)
                loss = torch.nn.functional.cross_entropy(out[train], y[train])
            amp.backward(loss)
            amp.step(opt)

        return step
    if system != "gsplit":
        raise ValueError(f"system {system!r}: use 'gsplit' or 'pyg'")
    from gsplit.nn import build_model
    from gsplit.run.trainer import SYSTEMS as TRAIN_SYSTEMS

    cfg = TrainConfig(system="full", fanouts=[-1] * num_layers, hidden=hidden, device=str(device), eval_every=0)
    impl = TRAIN_SYSTEMS["full"]
    loader = impl.make_loader(cfg, dataset, dataset.graph, dataset.train_idx, None, device, None, True)
    model = impl.prepare_model(cfg, build_model("sage", dataset.features.shape[1], hidden, dataset.num_classes,
                                                num_layers=num_layers, dropout=cfg.dropout).to(device), loader)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)

    def step():
        for _, _, blocks in loader:
            opt.zero_grad()
            with amp.autocast():
                logits = model(blocks, blocks[0].srcdata["feat"], loader.comm)
                loss = impl.loss(logits, blocks[-1].dstdata["label"], blocks[-1], 1)
            amp.backward(loss)
            amp.step(opt)

    return step
