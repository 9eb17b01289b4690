"""Paper Table 3: training time per epoch, split parallelism vs data parallelism, SAGE and GAT.

Both systems run through ``gsplit.run.trainer`` (same models, data, global mini-batches, launcher and
counters) on CPU ranks over gloo. Split uses the ``gsplit`` partition map (pre-sampling + METIS).
Each run is bounded by ``max_iters``; the epoch time is the measured mean time per iteration (first
iteration excluded) times the iterations of a full epoch, with its sample / load / forward-backward
breakdown (each phase at its max over ranks, as in the trainer's log). The counters of the same runs
(feature rows loaded, edges computed, shuffle bytes) explain the times.

    python experiments/end_to_end.py --quick
    python experiments/end_to_end.py --quick --systems split,split-overlap   # overlapped layers vs plain

``split-overlap`` is split with overlapped layers (:mod:`gsplit.minibatch.overlap`; ``gsplit train``'s default for
SAGE and GCN),
``split`` the plain path (``gsplit train --no-overlap``: a blocking shuffle before every layer); the
systems of one (model, ranks) run in one launch, interleaved (ABBA), and ``split/this`` is the ratio of
the plain split epoch to this one (> 1: faster than plain split).
"""

from __future__ import annotations

import sys

from harness import report, runs, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
from gsplit.sampling.batches import num_iterations
from gsplit.run.trainer import TrainConfig


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_argument("--datasets", default="synthetic", help="synthetic and/or bio")
    p.add_sized("--nodes", quick=20_000, full=100_000, type=int,
                help="synthetic graph size (default 20000 quick, 100000 full)")
    p.add_argument("--worlds", default="2,4", type=setup.int_list)
    p.add_argument("--systems", default="split,split-overlap,dp",
                   help="comma-separated: split (--no-overlap), split-overlap (--overlap), dp")
    p.add_argument("--models", default="sage,gat")
    p.add_argument("--batch-size", type=int, default=1024, help="targets per rank per iteration")
    p.add_argument("--fanouts", default="15,10,5", type=setup.int_list)
    p.add_argument("--hidden", type=int, default=128)
    p.add_sized("--iters", quick=4, full=10, type=int, help="iterations per run (default 4 quick, 10 full)")
    p.add_sized("--presample-epochs", quick=2, full=5, type=int, help="default 2 quick, 5 full")
    p.add_sized("--repeats", quick=1, full=2, type=int,
                help="runs of every job, order alternated (default 1 quick, 2 full)")
    args = p.parse_args(argv)
    iters, pre_epochs, repeats, fanouts = args.iters, args.presample_epochs, args.repeats, args.fanouts
    worlds = args.worlds
    models = args.models.split(",")
    systems = [x for x in args.systems.split(",") if x]
    unknown = sorted(set(systems) - {"split", "split-overlap", "dp"})
    if unknown or not systems:
        p.error(f"--systems {args.systems!r}: use a subset of split, split-overlap, dp")
    stem = report.output_stem(args, "end_to_end")

    results, rows, data_info = [], [], {}
    for _, label, ds in setup.each_dataset(args.datasets, args.nodes, args.seed, data_info):
        for world in worlds:
            pmap, prep, _ = setup.make_map(ds, world, "gsplit", fanouts, args.batch_size, args.seed, pre_epochs)
            print(f"  {world} ranks: gsplit map in {prep['presample_s'] + prep['partition_s']:.1f}s", flush=True)
            jobs = {(model, system): (TrainConfig(model=model, fanouts=fanouts, batch_size=args.batch_size,
                                                  hidden=args.hidden, epochs=1, system=system.split("-")[0],
                                                  seed=args.seed, eval_every=0, max_iters=iters, device="cpu",
                                                  overlap=system == "split-overlap",
                                                  input_features="shuffle"),  # the paper's loading
                                      pmap.assignment if system != "dp" else None)
                    for model in models for system in systems}
            logs = runs.run_repeated(ds, world, jobs, repeats)
            per_epoch = num_iterations(ds.train_idx.numel(), args.batch_size, world)
            by_key = {}
            for model in models:
                for system in systems:
                    job_logs = logs[(model, system)]
                    c = runs.epoch_counters(job_logs[0])  # counters are identical across repeats (same batches)
                    t = runs.iteration_times(job_logs)
                    n = c["iterations"]
                    res = {"dataset": label, "world": world, "model": model, "system": system, "repeats": len(job_logs),
                           "iterations_run": n, "iterations_per_epoch": per_epoch, "iteration_times": t,
                           "epoch_s_est": t["total_s"] * per_epoch,
                           "phases_epoch_s_est": {ph: t[f"{ph}_s"] * per_epoch for ph in ("sample", "load", "train")},
                           "input_rows_per_iteration": c["input_rows"] / n,
                           "edges_per_iteration": sum(c["edges"]) / n,
                           "traffic_bytes_per_iteration": c["traffic_bytes"] / n,
                           "counters": c, "map": prep if system != "dp" else None}
                    results.append(res)
                    by_key[(model, system)] = res
            for model in models:
                sp, dp = by_key.get((model, "split")), by_key.get((model, "dp"))
                for system in systems:
                    r = by_key[(model, system)]
                    ph = r["phases_epoch_s_est"]
                    ratio = lambda base: base["epoch_s_est"] / r["epoch_s_est"] if base else float("nan")  # noqa: E731
                    rows.append([label, model, world, r["system"], ph["sample"], ph["load"], ph["train"],
                                 r["epoch_s_est"], round(r["input_rows_per_iteration"]),
                                 round(r["edges_per_iteration"]), r["traffic_bytes_per_iteration"] / 2**20,
                                 ratio(dp), ratio(sp)])

    headers = ["graph", "model", "ranks", "system", "sample s", "load s", "fwd-bwd s", "epoch s", "features/it",
               "edges/it", "shuffle+ids MiB/it", "DP/this", "split/this"]
    table = report.format_table(headers, rows, ".2f")
    print(f"\nepoch time = median time per iteration x iterations per epoch; {repeats} run(s) of {iters} iterations "
          f"per job (first of each excluded); batch {args.batch_size}/rank, "
          f"fanouts {fanouts}, hidden {args.hidden}")
    print(table)
    report.save_json(stem, {"experiment": "end-to-end epoch time (paper Table 3)", "datasets": data_info,
                            "fanouts": fanouts, "batch_size": args.batch_size, "hidden": args.hidden,
                            "iterations": iters, "repeats": repeats, "presample_epochs": pre_epochs, "results": results,
                            "table": table})
    panels = [(lab, m) for lab in data_info for m in models]
    fig, axes = report.figure(len(panels))
    for ax, (lab, model) in zip(axes, panels):
        sub = [r for r in results if r["dataset"] == lab and r["model"] == model]
        report.stacked_panel(ax, [f"{r['system']} x{r['world']}" for r in sub],
                             {label: [r["phases_epoch_s_est"][ph] for r in sub] for ph, label in runs.PHASES},
                             "epoch time (s, estimated)", f"{lab}, {model}")
    report.save_figure(fig, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
