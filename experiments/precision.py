"""Half precision on CPU ranks: accuracy of bfloat16/float16 features and autocast against float32, epoch time
and peak memory per rank, and the bytes of a dataset folder in each dtype.

Accuracy (``--part accuracy``): for each dataset (Cora and CiteSeer: Planetoid split; synthetic: 60/20/20),
seed and mode (split mini-batch, full-graph), one run per variant, all through ``gsplit.run.trainer`` on 2 CPU
ranks: ``fp32`` (float32 features, no autocast), ``bf16`` (bfloat16 features + bfloat16 autocast), ``fp16``
(float16 features + float16 autocast with the gradient scaler). The number is the final layer-wise test accuracy;
the table gives the mean over the seeds and the difference to fp32.

Speed and memory (``--part speed``): 2 ranks, split and dp, fp32 against ``bf16-features`` (bfloat16 storage,
float32 arithmetic) and bf16 (features and autocast), on the synthetic graph; the median epoch time after the first and each rank's peak resident memory (VmHWM, the
rank's whole life: setup included). Variants run in turn in one command, ABAB, so the machine's load
drifts hit both. Also: the bytes of a prepared folder in float32 and bfloat16, and the CPU's flags that
decide how bfloat16 products run (``avx512_bf16``, ``amx_bf16``: native; without them oneDNN converts to
float32 around each product).

    python experiments/precision.py --quick
    python experiments/precision.py --part speed --nodes 100000
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

from harness import report, runs, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
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


def accuracy(args) -> tuple:
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
            jobs, keys = [], []
            for seed in args.seeds:
                jobs.append((TrainConfig(model=args.model, fanouts=args.fanouts, batch_size=mb["batch"],
                                         epochs=mb["epochs"], lr=args.lr, system="split", seed=seed,
                                         eval_every=mb["epochs"], device="cpu", log_iterations=False,
                                         precision=precision), maps[seed]))
                keys.append(("mini-batch", seed))
                jobs.append((TrainConfig(model=args.model, fanouts=[-1] * len(args.fanouts), epochs=full_epochs,
                                         lr=args.lr, system="full", seed=seed, eval_every=full_epochs, device="cpu",
                                         log_iterations=False, precision=precision), full_owner))
                keys.append(("full-graph", seed))
            print(f"  {variant}: {len(jobs)} runs", flush=True)
            for (mode, seed), log in zip(keys, runs.run_jobs(with_dtype(ds, fdt), 2, jobs)):
                acc.setdefault((mode, variant), []).append(log["final_test_acc"])
                results.append({"dataset": label, "mode": mode, "variant": variant, "seed": seed,
                                "final_test_acc": log["final_test_acc"], "final_val_acc": log.get("final_val_acc"),
                                "skipped_steps": log["epochs"][-1].get("skipped_steps")})
        for mode in ("mini-batch", "full-graph"):
            base = statistics.mean(acc[(mode, "fp32")]) if (mode, "fp32") in acc else None
            for variant in args.variants:
                vals = acc[(mode, variant)]
                mean = statistics.mean(vals)
                rows.append([label, mode, variant, 100 * mean, 100 * (max(vals) - min(vals)),
                             "" if base is None else f"{100 * (mean - base):+.2f}"])
    headers = ["graph", "mode", "variant", f"test acc % (mean of {len(args.seeds)})", "spread (points)",
               "vs fp32 (points)"]
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


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_argument("--part", choices=("accuracy", "speed", "all"), default="all")
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
    args = p.parse_args(argv)
    stem = report.output_stem(args, "precision" if args.part == "all" else f"precision_{args.part}")
    data = {"experiment": "half precision on CPU ranks", "cpu": cpu_flags(), "model": args.model,
            "fanouts": args.fanouts, "lr": args.lr}
    print(f"CPU: {data['cpu']['model']}; {data['cpu']['flags']}", flush=True)
    tables = []
    if args.part in ("accuracy", "all"):
        data["accuracy"], table = accuracy(args)
        tables.append(table)
    if args.part in ("speed", "all"):
        data["speed"], table = speed(args)
        tables.append(table)
    data["table"] = "\n\n".join(tables)
    print("\n" + data["table"])
    report.save_json(stem, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
