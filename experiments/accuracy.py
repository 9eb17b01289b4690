"""Paper Figure 7: test accuracy per epoch, split parallelism vs data parallelism.

Both systems train the same model from the same initialisation on the same global mini-batches
through ``gsplit.run.trainer`` (CPU ranks over gloo). Split parallelism computes exactly the
single-process mini-batch (mean loss over the global batch); data parallelism computes each rank's
micro-batch (mean loss per micro-batch, gradients averaged: DDP semantics). With equal micro-batches
and counter-based sampling the two compute the same gradient, so the curves should differ only by
dropout randomness, float rounding and the weighting of the last, short global batch of each epoch.

Datasets: Cora (Planetoid split: 20 labelled vertices per class, 500 val, 1000 test, seed 0) and
the synthetic graph (random 60/20/20 split).

    python experiments/accuracy.py --quick
"""

from __future__ import annotations

import sys

from harness import report, runs, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
from gsplit.run.trainer import TrainConfig


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_argument("--datasets", default="cora,synthetic")
    p.add_sized("--nodes", quick=10_000, full=50_000, type=int,
                help="synthetic graph size (default 10000 quick, 50000 full)")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--model", default="sage")
    p.add_argument("--fanouts", default="15,10,5", type=setup.int_list)
    p.add_sized("--epochs", quick=10, full=15, type=int, help="synthetic graph (default 10 quick, 15 full)")
    p.add_sized("--cora-epochs", quick=30, full=60, type=int, help="Cora (default 30 quick, 60 full)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--cora-batch-size", type=int, default=32, help="per rank; Cora has 140 training vertices")
    p.add_argument("--batch-size", type=int, default=1024, help="per rank, synthetic graph")
    args = p.parse_args(argv)
    fanouts = args.fanouts
    stem = report.output_stem(args, "accuracy")

    results, rows, data_info = [], [], {}
    for key, label, ds in setup.each_dataset(args.datasets, args.nodes, args.seed, data_info):
        batch = args.cora_batch_size if key == "cora" else args.batch_size
        n_epochs = args.cora_epochs if key == "cora" else args.epochs  # Cora's epochs are 3 tiny iterations
        print(f"  {n_epochs} epochs", flush=True)
        pmap, prep, _ = setup.make_map(ds, args.world, "gsplit", fanouts, batch, args.seed, 5)
        jobs = [(TrainConfig(model=args.model, fanouts=fanouts, batch_size=batch, epochs=n_epochs, lr=args.lr,
                             system=system, seed=args.seed, eval_every=1, device="cpu", log_iterations=False),
                 pmap.assignment if system == "split" else None) for system in ("split", "dp")]
        logs = runs.run_jobs(ds, args.world, jobs)
        for system, log in zip(("split", "dp"), logs):
            keep = ("epoch", "loss", "val_acc", "test_acc", "epoch_s")
            curve = [{k: rec.get(k) for k in keep} for rec in log["epochs"]]
            best = max(curve, key=lambda r: r["val_acc"])
            res = {"dataset": label, "system": system, "world": args.world, "batch_size": batch,
                   "epochs": curve, "final_test_acc": curve[-1]["test_acc"], "best_val_acc": best["val_acc"],
                   "test_acc_at_best_val": best["test_acc"], "best_epoch": best["epoch"]}
            results.append(res)
            rows.append([label, system, args.world, n_epochs, curve[-1]["loss"], curve[-1]["test_acc"],
                         best["val_acc"], best["test_acc"], best["epoch"]])
        sp, dp = results[-2], results[-1]
        diffs = [abs(a["test_acc"] - b["test_acc"]) for a, b in zip(sp["epochs"], dp["epochs"])]
        half = diffs[len(diffs) // 2:]
        sp["test_acc_diff_vs_dp"] = {"max_abs": max(diffs), "mean_abs": sum(diffs) / len(diffs),
                                     "mean_abs_second_half": sum(half) / len(half)}
        print(f"  |test acc split - dp| over epochs: max {max(diffs):.4f}, mean {sum(diffs) / len(diffs):.4f}, "
              f"mean over the second half {sum(half) / len(half):.4f}", flush=True)

    headers = ["graph", "system", "ranks", "epochs", "final loss", "final test acc", "best val acc",
               "test acc @ best val", "best epoch"]
    table = report.format_table(headers, rows, ".4f")
    print(f"\n{args.model}, fanouts {fanouts}, lr {args.lr}")
    print(table)
    report.save_json(stem, {"experiment": "accuracy per epoch (paper Fig. 7)", "datasets": data_info,
                            "model": args.model, "fanouts": fanouts, "lr": args.lr, "results": results,
                            "table": table})
    fig, axes = report.figure(len(data_info))
    for ax, label in zip(axes, data_info):
        curves = {}
        for r in results:
            if r["dataset"] == label:
                curves[r["system"]] = ([e["epoch"] for e in r["epochs"]], [e["test_acc"] for e in r["epochs"]])
        report.line_panel(ax, curves, "epoch", "test accuracy", f"{label}, {args.model}, {args.world} ranks")
    report.save_figure(fig, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
