"""Scaling of preparation and training with the graph's size: time and peak memory at 1M, 4M (, 16M) vertices.

For each size, on a synthetic graph (average degree 15, 128-d float32 features):

* **prepare** runs in its own process (``--worker``): it generates the dataset, writes it as a prepared
  folder and maps it (what ``gsplit prepare --dataset-out`` does; ``--in-memory``: the old path, no
  folder), then calls :func:`gsplit.partitioning.prepare_partition` at 4 parts on the mapped dataset.
  Stage by stage (generation, writing the folder, pre-sampling weights, METIS partitioning, split
  statistics) it records the wall and CPU
  time and the **peak RSS reached inside that stage**: before a stage the process resets its high-water
  mark (``echo 5 > /proc/self/clear_refs``, Linux 4.0+) and after it reads ``VmHWM`` from
  ``/proc/self/status``; the resident set just before the stage is recorded too, so the stage's own
  increment is ``peak - before``. METIS runs in a forked child: its own peak RSS (and its RSS before
  METIS, so the difference is METIS's memory) is reported by the child (``metis_child_*``). The
  **host's peak** during prepare's stages (weights, METIS, statistics) is the peak of the summed PSS of
  the worker and the METIS process, sampled by :class:`gsplit.runtime.resources.HostMemoryMeter`
  (``host_peak_mb``; shared pages counted once), with the METIS process's private pages at their peak
  (``metis_private_peak_mb``); CPU times include the METIS process's (``os.times``' children).
  Mapped file pages that a stage reads count in its RSS (they are shared page cache, not private).
* **train** runs ``gsplit train --dataset folder:DIR`` at 2 CPU ranks (each rank maps the folder;
  ``--in-memory``: the CLI generates the dataset and its launcher hands it to the ranks in shared
  memory) for ``--epochs`` epochs of ``--iters`` iterations, sampling every process's
  RSS and PSS with psutil every 0.5 s: peak RSS per rank, and the host's peak as the sum of PSS over the
  launcher and its ranks (PSS splits shared pages among the processes that map them). Time per
  iteration is the last epoch's ``epoch_s / iters`` (the first epoch includes warm-up).

Costs are fitted by least squares as ``seconds = a * edges`` (per edge) and ``bytes = b * vertices +
c * edges`` over the sizes measured; the table shows the per-edge time of each size relative to the
smallest. Every subprocess has a timeout. A size whose estimated peak (generating the graph, or 2.5x its
graph + features while preparing) exceeds the memory available is refused before it starts: 16M
vertices (10.4 GB of graph + features, generation alone ~12.3 GB) does not fit a 24 GB machine.
The machine is shared with other jobs: the load average at
the start and end of each run is recorded, and CPU times are given next to wall times.

    python experiments/scale.py                       # 1M, 4M and 8M vertices (~40 min on 2 busy cores)
    python experiments/scale.py --sizes 1000000,4000000 --metis-edges-per-vertex 0   # METIS sees every edge
    python experiments/scale.py --quick               # 100k and 200k vertices, for a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from harness import memory, report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import numpy as np

from gsplit.runtime.resources import available_memory, cpu_seconds

AVG_DEGREE = 15.0
FEATURE_DIM = 128
NUM_PARTS = 4
TRAIN_RANKS = 2
MB = 1 << 20


# ------------------------------------------------------------------------------------------ worker side
def _reset_peak() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class StageMeter:
    """Wall time, CPU time, RSS before and peak RSS inside each named stage of this process."""

    def __init__(self):
        self.stages: Dict[str, dict] = {}
        self.resettable = True
        self._open: Optional[tuple] = None

    def start(self, name: str) -> None:
        self.resettable = _reset_peak() and self.resettable
        self._open = (name, time.perf_counter(), cpu_seconds(), memory.status_kb("VmRSS"))

    def stop(self) -> None:
        name, t, c, rss_before = self._open
        self.stages[name] = {"wall_s": round(time.perf_counter() - t, 3), "cpu_s": round(cpu_seconds() - c, 3),
                             "rss_before_mb": round(rss_before / 1024, 1),
                             "peak_rss_mb": round(memory.status_kb("VmHWM") / 1024, 1)}
        self._open = None


def worker(nodes: int, out: str, result: str, stats_batches: int, batch_size: int, fanouts: List[int],
           data_folder: Optional[str], metis_edges_per_vertex: float) -> None:
    """Generate (and with ``data_folder`` write the prepared folder and map it), then prepare at ``NUM_PARTS``
    parts, measuring each stage; writes ``result`` (JSON)."""
    from gsplit import datasets
    from gsplit.partitioning import prepare_partition

    # build/load the compiled sampling kernels first: their first use compiles them under a lock shared with
    # every gsplit process on the host (a stage measured during another process's build waits minutes)
    from gsplit import NeighborSampler
    tiny = datasets.load("synthetic", num_nodes=500, feature_dim=4)
    NeighborSampler(fanouts).sample_blocks(tiny.graph, tiny.train_idx[:8])
    meter = StageMeter()
    meter.start("generate")
    ds = datasets.load("synthetic", num_nodes=nodes, avg_degree=AVG_DEGREE, feature_dim=FEATURE_DIM)
    meter.stop()
    if data_folder:
        # what `gsplit prepare --dataset-out` does: write the prepared folder, then work on the mapped files
        meter.start("write folder")
        datasets.save_folder(ds, data_folder)
        del ds
        ds = datasets.load_folder(data_folder)
        meter.stop()
    # prepare_partition announces each stage as it starts and, with its time, as it ends
    starts = {"expected pre-sampling": "weights", "pre-sampling": "weights", "partitioning into": "metis",
              "split statistics on": "stats"}

    def progress(message: str) -> None:
        for prefix, stage in starts.items():
            if message.startswith(prefix):
                meter.start(stage)
                return
        if message.startswith("  ") and meter._open is not None:
            meter.stop()

    prepared = prepare_partition(ds, NUM_PARTS, fanouts, batch_size, out=out, stats_batches=stats_batches,
                                 progress=progress, metis_edges_per_vertex=metis_edges_per_vertex)
    # the 2-part map the 2-rank training run uses (made here, outside the measured stages, so the training
    # run's launcher does not partition)
    prepare_partition(ds, TRAIN_RANKS, fanouts, batch_size, out=str(Path(out).parent / "map2"), stats_batches=0,
                      metis_edges_per_vertex=metis_edges_per_vertex)
    g = ds.graph
    payload = {"num_nodes": g.num_nodes, "num_edges": g.num_edges, "feature_dim": FEATURE_DIM,
               "graph_bytes": (g.indptr.numel() + g.indices.numel()) * g.indices.element_size(),
               "feature_bytes": ds.features.numel() * ds.features.element_size(),
               "label_bytes": ds.labels.numel() * ds.labels.element_size(),
               "stages": meter.stages, "peak_reset_worked": meter.resettable,
               # the stages of `gsplit prepare` proper (not generating or writing the data)
               "prepare_peak_rss_mb": max(s["peak_rss_mb"] for k, s in meter.stages.items()
                                          if k in ("weights", "metis", "stats")),
               # METIS runs in a forked child (its own memory): its peak RSS, reported by the child
               # (its RSS includes the pages it shares with this process after the fork: at its peak it is
               # about the host's memory during METIS; peak - start is METIS's own)
               "metis_child_peak_rss_mb": prepared.pmap.metadata.get("metis_child_peak_rss_mb"),
               "metis_child_start_rss_mb": prepared.pmap.metadata.get("metis_child_start_rss_mb"),
               "data_folder": bool(data_folder),
               # the host's peak over prepare's stages: summed PSS of this process and the METIS process
               "host_peak_mb": prepared.report["host_peak_mb"],
               "metis_private_peak_mb": prepared.report["metis_private_peak_mb"],
               "metis_edges_per_vertex": metis_edges_per_vertex,
               "metis_entries": prepared.report.get("metis_entries"),
               "metis_entries_in": prepared.report.get("metis_entries_in"),
               "metis_weight_kept": prepared.pmap.metadata.get("metis_weight_kept"),
               "metis_edgecut": prepared.pmap.metadata.get("metis_edgecut"),
               "partition_substages_cpu_s": prepared.pmap.metadata.get("stage_cpu_seconds", {}),
               "process_peak_rss_mb": round(memory.status_kb("VmHWM") / 1024, 1),
               "partition_substages_s": prepared.report.get("partition_stage_s", {}),
               "cross_edge_fraction": prepared.report.get("stats", {}).get("cross_edge_fraction")}
    report.write_json(result, payload)


# ------------------------------------------------------------------------------------------ parent side
def run_prepare(nodes: int, folder: Path, args) -> dict:
    result = folder / "prepare_result.json"
    cmd = [sys.executable, __file__, "--worker", "--nodes", nodes, "--map", folder / "map",
           "--stats-batches", args.stats_batches, "--batch-size", args.batch_size,
           "--fanouts", args.fanouts, "--metis-edges-per-vertex", args.metis_edges_per_vertex
           ] + ([] if args.in_memory else ["--data-folder", folder / "ds"])
    load0 = report.load_average()
    done = rounds.run_command(cmd + ["--result", result], timeout=args.timeout)
    out = report.read_json(result)
    out.update(total_wall_s=round(done.seconds, 2), load_before=load0, load_after=report.load_average())
    return out


def run_train(nodes: int, folder: Path, args) -> dict:
    log = folder / "train.jsonl"
    data = (["--dataset", "synthetic", "-D", f"num_nodes={nodes}", "-D", f"avg_degree={AVG_DEGREE}", "-D",
             f"feature_dim={FEATURE_DIM}"] if args.in_memory else ["--dataset", f"folder:{folder / 'ds'}"])
    cmd = setup.GSPLIT_CLI + ["train", *data, "--num-ranks", TRAIN_RANKS, "--partition", folder / "map2",
                              "--epochs", args.epochs, "--max-iters", args.iters, "--eval-every", 0,
                              "--batch-size", args.batch_size, "--fanouts", args.fanouts, "--log", log]
    load0 = report.load_average()
    done = rounds.run_command(cmd, timeout=args.timeout, watch=memory.ProcessTree)
    mon = done.watched
    epochs = [json.loads(line) for line in log.read_text().splitlines() if '"epoch"' in line]
    epochs = [e for e in epochs if e.get("type") == "epoch"]
    last = epochs[-1]
    launcher = mon.root_peak()
    ranks = sorted((p for p in mon.peak.values() if not p["root"] and p["rss"] > 200 * MB),
                   key=lambda p: -p["rss"])[:TRAIN_RANKS]  # the rank processes (skips tiny helpers)
    return {"wall_s": round(done.seconds, 2), "epochs": len(epochs), "iters_per_epoch": args.iters,
            "last_epoch_s": last["epoch_s"], "s_per_iter": last["epoch_s"] / args.iters,
            "phases_s": {k: last.get(k) for k in ("sample_s", "load_s", "train_s")},
            "launcher_peak_rss_mb": round(launcher["rss"] / MB, 1) if launcher else None,
            "rank_peak_rss_mb": [round(p["rss"] / MB, 1) for p in ranks],
            "rank_peak_pss_mb": [round(p["pss"] / MB, 1) for p in ranks],
            "host_peak_pss_mb": round(mon.peak_host_pss / MB, 1),
            "load_before": load0, "load_after": report.load_average(), "output_tail": done.output[-600:]}


def fits(nodes: int) -> bool:
    """Whether a size's estimated peak fits the memory available now; says why not when it does not."""
    from gsplit.datasets.synthetic import synthetic_peak_bytes

    data = nodes * (AVG_DEGREE * 8 + 8 + FEATURE_DIM * 4 + 8)  # graph (int64) + features + labels
    need = max(synthetic_peak_bytes(nodes, AVG_DEGREE, FEATURE_DIM), 2.5 * data)
    if need > available_memory():
        print(f"skipping {nodes:,} vertices: about {need / 2**30:.1f} GiB needed at the peak (graph + features "
              f"{data / 2**30:.1f} GiB), {available_memory() / 2**30:.1f} GiB available", flush=True)
        return False
    return True


def fit(rows: List[dict]) -> dict:
    """Least-squares costs: seconds per edge for each stage; peak bytes per vertex and per edge."""
    e = np.array([r["prepare"]["num_edges"] for r in rows], dtype=float)
    n = np.array([r["prepare"]["num_nodes"] for r in rows], dtype=float)
    out = {"s_per_edge": {}, "cpu_s_per_edge": {}, "peak_bytes": {}}
    for stage in rows[0]["prepare"]["stages"]:
        t = np.array([r["prepare"]["stages"][stage]["wall_s"] for r in rows])
        out["s_per_edge"][stage] = float((t @ e) / (e @ e))
        if all("cpu_s" in r["prepare"]["stages"][stage] for r in rows):
            c = np.array([r["prepare"]["stages"][stage]["cpu_s"] for r in rows])
            out["cpu_s_per_edge"][stage] = float((c @ e) / (e @ e))
    peak = np.array([r["prepare"]["process_peak_rss_mb"] * MB for r in rows])
    if len(rows) >= 2:
        # bytes = b * vertices + c * edges; the two sizes share the degree, so the split between the two is
        # weakly determined: report per edge (vertices folded in at degree 15) as well
        coef, *_ = np.linalg.lstsq(np.stack([n, e], 1), peak, rcond=None)
        out["peak_bytes"] = {"per_vertex": float(coef[0]), "per_edge": float(coef[1])}
    out["peak_bytes"]["per_edge_all_in"] = float((peak @ e) / (e @ e))
    return out


def main(argv=None) -> None:
    p = setup.make_parser(__doc__.splitlines()[0], out_file=setup.RESULTS / "scale", seed=False,
                          quick_help="100k and 200k vertices, for a smoke test")
    p.add_argument("--sizes", default="1000000,4000000,8000000")
    p.add_argument("--metis-edges-per-vertex", default=None,
                   help="METIS's input bound passed to prepare (default: gsplit's default, auto; 0: every edge)")
    p.add_argument("--stats-batches", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per subprocess")
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--in-memory", action="store_true",
                   help="the old path: no prepared folder; prepare on the in-memory dataset and let `gsplit train` "
                        "generate it and hand it to the ranks in shared memory (default: write the folder, map it)")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    # worker mode
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nodes", type=int)
    p.add_argument("--map")
    p.add_argument("--result")
    p.add_argument("--data-folder")
    args = p.parse_args(argv)
    fanouts = setup.int_list(args.fanouts)
    if args.metis_edges_per_vertex is None:
        from gsplit.partitioning.budget import METIS_EDGES_PER_VERTEX

        args.metis_edges_per_vertex = METIS_EDGES_PER_VERTEX
    if args.worker:
        worker(args.nodes, args.map, args.result, args.stats_batches, args.batch_size, fanouts, args.data_folder,
               args.metis_edges_per_vertex)
        return
    sizes = [100_000, 200_000] if args.quick else setup.int_list(args.sizes)
    sizes = [n for n in sizes if fits(n)]
    if not sizes:
        raise SystemExit("no size fits this machine's memory")
    stem = report.output_stem(args, suffix=("_quick" if args.quick else "") + ("_in_memory" if args.in_memory else ""))
    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for nodes in sizes:
            folder = Path(tmp) / str(nodes)
            folder.mkdir()
            row = {"nodes_requested": nodes, "prepare": run_prepare(nodes, folder, args)}
            print(f"{nodes}: prepare {json.dumps(row['prepare']['stages'])}", flush=True)
            if not args.no_train:
                row["train"] = run_train(nodes, folder, args)
                print(f"{nodes}: train {row['train']['s_per_iter']:.3f} s/iter, ranks "
                      f"{row['train']['rank_peak_rss_mb']} MB, host PSS {row['train']['host_peak_pss_mb']} MB", flush=True)
            rows.append(row)
    write_report(rows, fit(rows), stem, args)


def write_report(rows: List[dict], costs: dict, stem: Path, args) -> None:
    base = rows[0]["prepare"]
    headers = ["vertices", "edges", "stage", "wall s", "CPU s", "ns/edge", "x per-edge vs smallest",
               "CPU ns/edge", "x CPU per-edge", "RSS before MB", "peak RSS MB"]
    table = []
    for r in rows:
        pr = r["prepare"]
        for stage, s in pr["stages"].items():
            per_edge = s["wall_s"] / pr["num_edges"]
            ratio = per_edge / (base["stages"][stage]["wall_s"] / base["num_edges"])
            cpu_edge = s["cpu_s"] / pr["num_edges"]
            cpu_ratio = cpu_edge / max(base["stages"][stage]["cpu_s"] / base["num_edges"], 1e-12)
            table.append([pr["num_nodes"], pr["num_edges"], stage, s["wall_s"], s["cpu_s"], per_edge * 1e9,
                          ratio, cpu_edge * 1e9, cpu_ratio, s["rss_before_mb"], s["peak_rss_mb"]])
    print(report.format_table(headers, table))
    summary = []
    for r in rows:
        pr = r["prepare"]
        data_mb = (pr["graph_bytes"] + pr["feature_bytes"] + pr["label_bytes"]) / MB
        prep_s = sum(s["wall_s"] for k, s in pr["stages"].items() if k != "generate")
        line = {"vertices": pr["num_nodes"], "edges": pr["num_edges"], "graph+features+labels MB": round(data_mb, 1),
                "prepare s (no generation)": round(prep_s, 2),
                "prepare ns/edge": round(prep_s / pr["num_edges"] * 1e9, 1),
                "prepare CPU ns/edge": round(sum(s["cpu_s"] for k, s in pr["stages"].items()
                                                 if k in ("weights", "metis", "stats")) / pr["num_edges"] * 1e9, 1),
                "host peak MB": pr.get("host_peak_mb"),
                "host peak / data": round(pr["host_peak_mb"] / data_mb, 2) if pr.get("host_peak_mb") else None,
                "METIS private peak MB": pr.get("metis_private_peak_mb"),
                "METIS entries": pr.get("metis_entries"),
                "peak RSS MB": pr["process_peak_rss_mb"],
                "peak / data": round(pr["process_peak_rss_mb"] / data_mb, 2),
                "prepare stages peak MB": pr.get("prepare_peak_rss_mb"),
                "prepare stages peak / data": round(pr.get("prepare_peak_rss_mb", 0) / data_mb, 2),
                "METIS child peak MB": pr.get("metis_child_peak_rss_mb"),
                # less the interpreter with torch and gsplit loaded (RSS before generation): the data's share
                "(peak - interpreter) / data": round((pr["process_peak_rss_mb"]
                                                      - pr["stages"]["generate"]["rss_before_mb"]) / data_mb, 2)}
        if "train" in r:
            t = r["train"]
            line.update({"train s/iter": round(t["s_per_iter"], 3),
                         "rank peak RSS MB": t["rank_peak_rss_mb"], "rank peak PSS MB": t["rank_peak_pss_mb"],
                         "host peak PSS MB": t["host_peak_pss_mb"]})
        summary.append(line)
    keys = list(summary[0])
    print(report.format_table(keys, [[s.get(k) for k in keys] for s in summary]))
    base_ns, base_cpu = summary[0]["prepare ns/edge"], summary[0]["prepare CPU ns/edge"]
    for s in summary[1:]:
        print(f"prepare time per edge at {s['vertices']:,} vertices: {s['prepare ns/edge'] / base_ns:.2f}x wall, "
              f"{s['prepare CPU ns/edge'] / base_cpu:.2f}x CPU the {summary[0]['vertices']:,}-vertex one "
              "(target for 16M vs 1M: <= 1.5x)")
    for s in summary:
        if s.get("host peak / data"):
            print(f"host peak while preparing {s['vertices']:,} vertices: {s['host peak / data']:.2f}x graph + features "
                  "+ labels (target <= 2.5x)")
    loads = [r["prepare"]["load_before"] for r in rows]
    print(f"shared machine: 1-min load average before each prepare {[round(l[0], 1) for l in loads]} on "
          f"{os.cpu_count()} cores; wall times include other jobs' load, CPU times less so")
    payload = {"rows": rows, "summary": summary, "costs": costs,
               "settings": {"avg_degree": AVG_DEGREE, "feature_dim": FEATURE_DIM, "num_parts": NUM_PARTS,
                            "train_ranks": TRAIN_RANKS, "batch_size": args.batch_size, "fanouts": args.fanouts,
                            "stats_batches": args.stats_batches, "epochs": args.epochs, "iters": args.iters,
                            "data": "in memory" if args.in_memory else "prepared folder, memory-mapped"},
                   "shared_machine_note":
                   "the 2-core machine was shared with other jobs during the run: see load_before/load_after"}
    report.save_json(stem, payload)
    fig, axes = report.figure(2)
    edges = [r["prepare"]["num_edges"] for r in rows]
    for stage in rows[0]["prepare"]["stages"]:
        axes[0].plot(edges, [r["prepare"]["stages"][stage]["wall_s"] for r in rows], "o-", label=stage)
    axes[0].set(xlabel="edges (both directions)", ylabel="wall seconds", title="prepare, 4 parts", xscale="log", yscale="log")
    axes[0].legend(fontsize=7)
    axes[1].plot(edges, [r["prepare"]["process_peak_rss_mb"] / 1024 for r in rows], "o-", label="prepare peak RSS")
    if all(r["prepare"].get("host_peak_mb") for r in rows):
        axes[1].plot(edges, [r["prepare"]["host_peak_mb"] / 1024 for r in rows], "v-",
                     label="prepare host peak (PSS, with METIS)")
    axes[1].plot(edges, [s["graph+features+labels MB"] / 1024 for s in summary], "s--", label="graph+features+labels")
    if all("train" in r for r in rows):
        axes[1].plot(edges, [r["train"]["host_peak_pss_mb"] / 1024 for r in rows], "^-", label="train host PSS, 2 ranks")
    axes[1].set(xlabel="edges (both directions)", ylabel="GiB", title="memory", xscale="log", yscale="log")
    axes[1].legend(fontsize=7)
    report.save_figure(fig, stem)


if __name__ == "__main__":
    main()
