"""Half precision on CPU ranks: accuracy of bfloat16/float16 features and autocast against float32, epoch time
and peak memory per rank, and the bytes of a dataset folder in each dtype.

Accuracy (``--part accuracy``): for each dataset (Cora and CiteSeer: Planetoid split; synthetic: 60/20/20),
seed and mode (split mini-batch, full-graph), one run per variant, all through ``gsplit.run.trainer`` on 2 CPU
ranks: ``fp32`` (float32 features, no autocast), ``bf16`` (bfloat16 features + bfloat16 autocast), ``fp16``
(float16 features + float16 autocast with the gradient scaler). The number is the final layer-wise test accuracy;
the table gives the mean over the seeds and the difference to fp32. One launch per (variant, seed), the JSON
saved after each (``partial`` until the end), so a long float16 run stopped part-way keeps its seeds.

Speed and memory (``--part speed``): 2 ranks, split and dp, fp32 against ``bf16-features`` (bfloat16 storage,
float32 arithmetic) and bf16 (features and autocast), on the synthetic graph; the median epoch time after the first and each rank's peak resident memory (VmHWM, the
rank's whole life: setup included). Variants run in turn in one command, ABAB, so the machine's load
drifts hit both. Also: the bytes of a prepared folder in float32 and bfloat16, and the CPU's flags that
decide how bfloat16 products run (``avx512_bf16``, ``amx_bf16``: native; without them oneDNN converts to
float32 around each product).

Bytes (``--part bytes``): ``gsplit prepare --dataset-out`` of the synthetic graph (``--nodes``,
``--feature-dim``) in float32, then again from that folder with ``--feature-dtype bfloat16``; every file's bytes,
and per vertex scaled to ``--extrapolate`` vertices (arithmetic, said so). DGL's float32 epoch beside split and
dp in bf16 is ``experiments/vs_dgl.py --systems dgl,split,dp,split-bf16,dp-bf16``.

    python experiments/precision.py --quick
    python experiments/precision.py --part speed --nodes 100000
    python experiments/precision.py --part bytes --nodes 2000000 --feature-dim 128
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import report, rounds, runs, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
from harness.memory import vm_hwm

import gsplit
from gsplit.data.precision import cast_features
from gsplit.run.trainer import TrainConfig, train_rank

VARIANTS = {"fp32": ("float32", "fp32"), "bf16": ("bfloat16", "bf16"), "fp16": ("float16", "fp16"),
            "bf16-features": ("bfloat16", "fp32")}
"""Variant: (feature dtype, training precision). ``bf16-features``: bfloat16 storage, float32 arithmetic."""


def cpu_flags() -> dict:
    """The CPU model and the flags that matter for half-precision products."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "f16c")
    return {"model": model, "flags": {f: f in flags for f in wanted}}


def with_dtype(ds, dtype: str):
    return ds if dtype == "float32" else dataclasses.replace(ds, features=cast_features(ds.features, dtype))


def accuracy(args, save=lambda partial: None) -> tuple:
    """One launch per (variant, seed): its mini-batch and full-graph runs; ``save`` gets what has run after each
    launch (a long fp16 run stopped part-way keeps its finished seeds)."""
    results, rows, data_info = [], [], {}
    for key, label, ds in setup.each_dataset(args.datasets, args.nodes, 0, data_info, data_dir=args.data_dir):
        small = key != "synthetic"
        mb = {"batch": 32 if small else 1024, "epochs": args.small_epochs if small else args.epochs}
        full_epochs = args.full_epochs
        maps = {}
        for seed in args.seeds:
            maps[seed] = setup.make_map(ds, 2, "gsplit", args.fanouts, mb["batch"], seed, 5)[0].assignment
        full_owner = gsplit.partition_full_graph(ds.graph, 2, seed=0).assignment
        acc = {}
        for variant in args.variants:
            fdt, precision = VARIANTS[variant]
            cast = with_dtype(ds, fdt)
            for seed in args.seeds:
                jobs = [(TrainConfig(model=args.model, fanouts=args.fanouts, batch_size=mb["batch"],
                                     epochs=mb["epochs"], lr=args.lr, system="split", seed=seed,
                                     eval_every=mb["epochs"], device="cpu", log_iterations=False,
                                     precision=precision), maps[seed]),
                        (TrainConfig(model=args.model, fanouts=[-1] * len(args.fanouts), epochs=full_epochs,
                                     lr=args.lr, system="full", seed=seed, eval_every=full_epochs, device="cpu",
                                     log_iterations=False, precision=precision), full_owner)]
                print(f"  {variant} seed {seed}: mini-batch and full-graph", flush=True)
                t = time.perf_counter()
                logs = runs.run_jobs(cast, 2, jobs)
                wall = time.perf_counter() - t
                for mode, log in zip(("mini-batch", "full-graph"), logs):
                    acc.setdefault((mode, variant), []).append(log["final_test_acc"])
                    results.append({"dataset": label, "mode": mode, "variant": variant, "seed": seed,
                                    "final_test_acc": log["final_test_acc"], "final_val_acc": log.get("final_val_acc"),
                                    "skipped_steps": log["epochs"][-1].get("skipped_steps"),
                                    "launch_wall_s": wall, "load_average": report.load_average()})
                save({"datasets": data_info, "results": results, "partial": True})
            del cast
        for mode in ("mini-batch", "full-graph"):
            base = statistics.mean(acc[(mode, "fp32")]) if (mode, "fp32") in acc else None
            for variant in args.variants:
                vals = acc[(mode, variant)]
                mean = statistics.mean(vals)
                rows.append([label, mode, variant, len(vals), 100 * mean, 100 * (max(vals) - min(vals)),
                             "" if base is None else f"{100 * (mean - base):+.2f}"])
    headers = ["graph", "mode", "variant", "seeds", "test acc % (mean)", "spread (points)", "vs fp32 (points)"]
    return {"datasets": data_info, "results": results}, report.format_table(headers, rows, ".2f")


def speed_rank(rank, world, ds, cfg, owner):
    log = train_rank(rank, world, cfg, ds, owner)
    return {"rank": rank, "vm_hwm": vm_hwm(), "log": log if rank == 0 else None}


def speed(args) -> tuple:
    ds = setup.load_named("synthetic", args.nodes, 0, feature_dim=args.feature_dim)
    pmap = setup.make_map(ds, 2, "gsplit", args.fanouts, 1024, 0, 5)[0].assignment
    out, rows = [], []
    for round_ in range(args.rounds):
        order = list(args.speed_variants) if round_ % 2 == 0 else list(reversed(args.speed_variants))
        for system in ("split", "dp"):
            for variant in order:
                fdt, precision = VARIANTS[variant]
                cfg = TrainConfig(model=args.model, fanouts=args.fanouts, batch_size=1024, epochs=args.speed_epochs,
                                  system=system, device="cpu", eval_every=0, final_eval=False, log_iterations=False,
                                  precision=precision)
                per_rank = gsplit.launch(speed_rank, 2, args=(with_dtype(ds, fdt), cfg,
                                                              pmap if system == "split" else None),
                                         devices="cpu", backend="gloo", timeout=900)
                epochs = [e["epoch_s"] for e in per_rank[0]["log"]["epochs"]][1:]
                out.append({"round": round_, "system": system, "variant": variant, "epoch_s": epochs,
                            "median_epoch_s": statistics.median(epochs),
                            "peak_rss_per_rank": [r["vm_hwm"] for r in per_rank]})
                print(f"  round {round_} {system} {variant}: epoch {statistics.median(epochs):.2f} s, peak "
                      f"{[round(r['vm_hwm'] / 2**20) for r in per_rank]} MiB", flush=True)
    for system in ("split", "dp"):
        med = {v: statistics.median([r["median_epoch_s"] for r in out if (r["system"], r["variant"]) == (system, v)])
               for v in args.speed_variants}
        peak = {v: max(max(r["peak_rss_per_rank"]) for r in out if (r["system"], r["variant"]) == (system, v))
                for v in args.speed_variants}
        base = args.speed_variants[0]
        for v in args.speed_variants:
            rows.append([system, v, med[v], med[v] / med[base], peak[v] / 2**20, (peak[v] - peak[base]) / 2**20])
    folder_bytes = {}
    with tempfile.TemporaryDirectory(dir=args.scratch) as tmp:
        for dtype in ("float32", "bfloat16"):
            d = gsplit.datasets.save_folder(with_dtype(ds, dtype), Path(tmp) / dtype)
            folder_bytes[dtype] = {"features.npy": (d / "features.npy").stat().st_size,
                                   "total": sum(f.stat().st_size for f in d.rglob("*") if f.is_file())}
    headers = ["system", "variant", "median epoch (s)", f"vs {args.speed_variants[0]}", "peak RSS, largest rank (MiB)",
               f"vs {args.speed_variants[0]} (MiB)"]
    data = {"dataset": setup.describe_dataset(ds), "runs": out, "folder_bytes": folder_bytes}
    table = report.format_table(headers, rows, ".3f")
    table += "\n\nprepared folder bytes: " + ", ".join(
        f"{k}: features {v['features.npy'] / 2**20:.1f} MiB, whole folder {v['total'] / 2**20:.1f} MiB"
        for k, v in folder_bytes.items())
    return data, table


def folder_bytes(args) -> tuple:
    """``gsplit prepare --dataset-out`` of the synthetic graph in float32, then ``--feature-dtype bfloat16`` from
    that folder; the bytes of every file written (folders already there are counted, not written again), and
    the same per vertex times ``--extrapolate`` (arithmetic, labelled so)."""
    scratch = Path(args.scratch) if args.scratch else setup.scratch(args.out, "precision")
    n = args.nodes
    folders = {dtype: scratch / f"synthetic-{n}-d{args.feature_dim}-{dtype}" for dtype in ("float32", "bfloat16")}
    sources = {"float32": ["--dataset", "synthetic", "-D", f"num_nodes={n}", "-D", f"feature_dim={args.feature_dim}"],
               "bfloat16": ["--dataset", f"folder:{folders['float32']}", "--feature-dtype", "bfloat16"]}
    out = {"nodes": n, "feature_dim": args.feature_dim, "commands": {}, "wall_s": {}, "files": {}}
    for dtype, folder in folders.items():
        cmd = setup.GSPLIT_CLI + ["prepare", *sources[dtype], "--num-parts", 2, "--method", "random",
                                  "--out", scratch / f"map-{n}-{dtype}", "--dataset-out", folder]
        out["commands"][dtype] = " ".join(str(c) for c in cmd[3:])
        if not (folder / "meta.json").exists():
            out["wall_s"][dtype] = rounds.run_command(cmd, log=scratch / f"prepare-{n}-{dtype}.log",
                                                      cwd=setup.REPO).seconds
        out["files"][dtype] = {str(f.relative_to(folder)): f.stat().st_size for f in sorted(folder.rglob("*"))
                               if f.is_file()}
    rows = []
    for dtype, files in out["files"].items():
        total = sum(files.values())
        out.setdefault("total", {})[dtype] = total
        rows.append([dtype, files["features.npy"] / 1e6, total / 1e6, total / n,
                     files["features.npy"] / n * args.extrapolate / 1e9, total / n * args.extrapolate / 1e9])
    out["extrapolate_to"] = args.extrapolate
    headers = ["dtype", f"features.npy MB ({n:,} vertices)", "whole folder MB", "bytes per vertex",
               f"features GB at {args.extrapolate:,} (extrapolated)", "folder GB (extrapolated)"]
    return out, report.format_table(headers, rows, ".1f")


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_argument("--part", choices=("accuracy", "speed", "bytes", "all"), default="all",
                   help="all: accuracy and speed; bytes (a prepared folder's files in each dtype) only by name")
    p.add_argument("--datasets", default="cora,citeseer,synthetic")
    p.add_argument("--data-dir", default=str(setup.DATA), help="where cora.npz and citeseer.npz are")
    p.add_sized("--nodes", quick=20_000, full=100_000, type=int, help="synthetic graph size")
    p.add_argument("--feature-dim", type=int, default=128, help="synthetic features (speed part)")
    p.add_argument("--seeds", default="0,1,2", type=setup.int_list)
    p.add_argument("--variants", default="fp32,bf16", type=lambda s: s.split(","),
                   help="accuracy part; fp16 too where the CPU has float16 products (here: 27x float32's time)")
    p.add_argument("--speed-variants", default="fp32,bf16-features,bf16", type=lambda s: s.split(","),
                   help="speed part (the first is the baseline)")
    p.add_argument("--model", default="sage")
    p.add_argument("--fanouts", default="10,10", type=setup.int_list)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_sized("--epochs", quick=4, full=8, type=int, help="mini-batch epochs, synthetic")
    p.add_sized("--small-epochs", quick=30, full=60, type=int, help="mini-batch epochs, Cora/CiteSeer")
    p.add_sized("--full-epochs", quick=60, full=100, type=int, help="full-graph epochs")
    p.add_sized("--speed-epochs", quick=3, full=4, type=int, help="epochs per speed run (the first is not timed)")
    p.add_sized("--rounds", quick=2, full=2, type=int, help="speed: ABAB rounds")
    p.add_argument("--scratch", default=None, help="where the folders of the bytes count are written")
    p.add_argument("--extrapolate", type=int, default=10_000_000, help="bytes part: vertices to scale to")
    p.add_argument("--name", default=None, help="the JSON's name in --out (default precision_PART)")
    args = p.parse_args(argv)
    stem = report.output_stem(args, args.name or ("precision" if args.part == "all" else f"precision_{args.part}"))
    data = {"experiment": "half precision on CPU ranks", "cpu": cpu_flags(), "model": args.model,
            "fanouts": args.fanouts, "lr": args.lr}
    print(f"CPU: {data['cpu']['model']}; {data['cpu']['flags']}", flush=True)
    tables = []
    if args.part in ("accuracy", "all"):
        data["accuracy"], table = accuracy(args, lambda partial: report.save_json(stem, {**data, "accuracy": partial},
                                                                                   announce=False))
        tables.append(table)
    if args.part in ("speed", "all"):
        data["speed"], table = speed(args)
        tables.append(table)
    if args.part == "bytes":
        data["bytes"], table = folder_bytes(args)
        tables.append(table)
    data["table"] = "\n\n".join(tables)
    print("\n" + data["table"])
    report.save_json(stem, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
