"""Paper Figure 5 and the Node/Edge/Rand rows of Table 3: partition maps compared.

For each map strategy (``gsplit``: METIS on pre-sampled vertex and edge weights; ``node``: pre-sampled
vertex weights only; ``edge``: plain METIS balancing edges and training vertices; ``random``):

* split quality on held-out mini-batches (:func:`gsplit.split_stats`): cross-split edge fraction and
  edge/vertex load imbalance per layer;
* a real split-parallel training run through ``gsplit.run.trainer`` (CPU ranks over gloo): shuffle and
  id-exchange bytes from the communicator's traffic counters, per-layer edge imbalance measured on
  the ranks, and time per iteration with its sample/load/forward-backward breakdown.

    python experiments/maps.py --quick
"""

from __future__ import annotations

import sys
import time

from harness import report, runs, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import gsplit
from gsplit.partitioning import METHODS
from gsplit.sampling.batches import num_iterations
from gsplit.run.trainer import TrainConfig


def run_maps(ds, label, world, args, fanouts, iters, pre_epochs, stats_batches, sampler, results, rows) -> None:
    """Every map strategy for ``world`` ranks on ``ds``: split statistics and one training run each."""
    L = len(fanouts)
    maps, weights = {}, None
    for method in METHODS:
        pmap, info, weights = setup.make_map(ds, world, method, fanouts, args.batch_size, args.seed,
                                              pre_epochs, weights)
        t = time.perf_counter()
        stats = gsplit.split_stats(ds.graph, pmap, sampler, ds.train_idx, args.batch_size * world,
                                   num_batches=stats_batches, seed=args.seed)
        info["stats_s"] = time.perf_counter() - t
        maps[method] = (pmap, info, stats)
        print(f"  {world} ranks, {method}: presample {info['presample_s']:.1f}s, partition "
              f"{info['partition_s']:.1f}s, cross-edges {[round(x, 3) for x in stats.cross_edge_fraction]}",
              flush=True)
    jobs = {m: (TrainConfig(model=args.model, fanouts=fanouts, batch_size=args.batch_size, epochs=1, system="split",
                            seed=args.seed, eval_every=0, max_iters=iters, device="cpu",
                            input_features="shuffle"), maps[m][0].assignment)  # rows loaded per GPU, as the paper
            for m in METHODS}
    logs = runs.run_repeated(ds, world, jobs, args.repeats)
    per_epoch = num_iterations(ds.train_idx.numel(), args.batch_size, world)
    for method in METHODS:
        pmap, info, stats = maps[method]
        c = runs.epoch_counters(logs[method][0])  # counters are identical across repeats (same batches)
        times = runs.iteration_times(logs[method])
        shuffle = runs.shuffle_bytes_per_layer(c["traffic_bytes_by_tag"], L)
        res = {"dataset": label, "world": world, "method": method, "map": info, "split_stats": stats.to_dict(),
               "run": {**c, "iteration_times": times, "iterations_per_epoch": per_epoch,
                       "epoch_s_est": times["total_s"] * per_epoch,
                       "shuffle_bytes_per_iteration": sum(shuffle) / c["iterations"],
                       "shuffle_bytes_per_layer_per_iteration": [b / c["iterations"] for b in shuffle],
                       "id_bytes_per_iteration": runs.id_bytes(c["traffic_bytes_by_tag"]) / c["iterations"]}}
        results.append(res)
        r = res["run"]
        rows.append([label, method, world, "/".join(f"{x:.2f}" for x in stats.cross_edge_fraction),
                     "/".join(f"{x:.2f}" for x in stats.edge_imbalance),
                     "/".join(f"{x:.2f}" for x in r["edge_imbalance_run"]),
                     r["shuffle_bytes_per_iteration"] / 2**20, r["id_bytes_per_iteration"] / 2**20,
                     1e3 * times["sample_s"], 1e3 * times["load_s"], 1e3 * times["train_s"],
                     1e3 * times["total_s"], times["total_s"] * per_epoch, info["presample_s"] + info["partition_s"]])


def compare_presampling(ds, label, world, args, fanouts, pre_epochs, stats_batches, sampler, results, rows) -> None:
    """``gsplit`` maps from expected weights vs from ``pre_epochs`` epochs of sampled weights, for ``world``
    parts: time of each step and split quality on the same held-out mini-batches (``split_stats``)."""
    for presample_method in ("expected", "sampled"):
        prepared = gsplit.prepare_partition(ds, world, fanouts, args.batch_size, "gsplit", args.seed, pre_epochs,
                                            stats_batches=stats_batches, presample_method=presample_method)
        r, st = prepared.report, prepared.report["stats"]
        res = {"dataset": label, "world": world, "presample_method": presample_method,
               "presample_epochs": r["presample_epochs"], "presample_s": r["presample_s"],
               "partition_s": r["partition_s"], "partition_stage_s": r["partition_stage_s"],
               "ncon": prepared.pmap.metadata.get("ncon"), "split_stats": st}
        results.append(res)
        rows.append([label, world, presample_method if presample_method == "expected" else f"sampled x{pre_epochs}",
                     r["presample_s"], r["partition_s"], 100 * st["mean_cross_edge_fraction"],
                     "/".join(f"{100 * x:.1f}" for x in st["cross_edge_fraction"]),
                     "/".join(f"{x:.3f}" for x in st["edge_imbalance"]),
                     "/".join(f"{x:.3f}" for x in st["vertex_imbalance"]), st["input_imbalance"]])
        print(f"  {label}, {world} parts, {presample_method}: weights {r['presample_s']:.1f}s, partition "
              f"{r['partition_s']:.1f}s, cross-edges {100 * st['mean_cross_edge_fraction']:.2f}%, edge imbalance "
              f"{[round(x, 3) for x in st['edge_imbalance']]}", flush=True)


def main_compare(args, fanouts, worlds, nodes) -> int:
    """``--presample-compare``: expected vs sampled pre-sampling weights, time and map quality."""
    pre_epochs = args.presample_epochs or 10
    stats_batches = args.stats_batches or 20
    stem = report.output_stem(args, "presample_compare")
    sampler = gsplit.NeighborSampler(fanouts, seed=args.seed)
    results, rows, data_info = [], [], {}
    for key in args.datasets.split(","):
        if key == "synthetic-1m":  # the 1M-vertex / 20M-edge graph of the offline-time target
            ds = setup.load_named("synthetic", 1_000_000, args.seed, avg_degree=20)
            setup.announce("synthetic-1M/20M", ds, data_info)
            datasets = [(key, "synthetic-1M/20M", ds)]
        else:
            datasets = list(setup.each_dataset(key, nodes, args.seed, data_info))
        for _, label, ds in datasets:
            for world in worlds:
                compare_presampling(ds, label, world, args, fanouts, pre_epochs, stats_batches, sampler, results, rows)
    headers = ["graph", "parts", "weights", "weights s", "partition s", "cross-edges %", "cross % L0/L1/L2",
               "edge imb. L0/L1/L2", "vertex imb. L0/L1/L2", "input imb."]
    table = report.format_table(headers, rows, ".2f")
    print(f"\ngsplit maps, batch {args.batch_size}/rank, fanouts {fanouts}; split statistics over {stats_batches} "
          f"held-out mini-batches (the same for both maps)")
    print(table)
    report.save_json(stem, {"experiment": "expected vs sampled pre-sampling weights", "datasets": data_info,
                            "fanouts": fanouts, "batch_size": args.batch_size, "presample_epochs": pre_epochs,
                            "stats_batches": stats_batches, "results": results, "table": table})
    return 0


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_argument("--datasets", default="synthetic,bio", help="synthetic and/or bio (the bio-pathways PPI graph)")
    p.add_sized("--nodes", quick=20_000, full=100_000, type=int,
                help="synthetic graph size (default 20000 quick, 100000 full)")
    p.add_sized("--worlds", quick=[2], full=[2, 4], type=setup.int_list,
                help="rank counts (default 2 quick, 2,4 full)")
    p.add_argument("--batch-size", type=int, default=1024, help="targets per rank per iteration")
    p.add_argument("--fanouts", default="15,10,5", type=setup.int_list)
    p.add_argument("--model", default="sage")
    p.add_sized("--iters", quick=4, full=10, type=int, help="training iterations per map (default 4 quick, 10 full)")
    p.add_argument("--presample-epochs", type=int, default=0, help="default 2 quick, 5 full")
    p.add_argument("--stats-batches", type=int, default=0, help="held-out batches for split_stats (default 5 / 20)")
    p.add_sized("--repeats", quick=1, full=2, type=int,
                help="runs per map, order alternated (default 1 quick, 2 full)")
    p.add_argument("--presample-compare", action="store_true",
                   help="instead: gsplit maps from expected vs sampled (--presample-epochs, default 10) weights; "
                        "--datasets may also name cora and synthetic-1m (1M vertices, 20M edges)")
    args = p.parse_args(argv)
    nodes, worlds, iters, fanouts = args.nodes, args.worlds, args.iters, args.fanouts
    if args.presample_compare:
        return main_compare(args, fanouts, worlds, nodes)
    pre_epochs = args.presample_epochs or (2 if args.quick else 5)
    stats_batches = args.stats_batches or (5 if args.quick else 20)
    stem = report.output_stem(args, "maps")

    sampler = gsplit.NeighborSampler(fanouts, seed=args.seed)
    results, rows, data_info = [], [], {}
    for _, label, ds in setup.each_dataset(args.datasets, nodes, args.seed, data_info):
        for world in worlds:
            run_maps(ds, label, world, args, fanouts, iters, pre_epochs, stats_batches, sampler, results, rows)

    headers = ["graph", "map", "ranks", "cross-edge frac L0/L1/L2", "edge imb. (stats)", "edge imb. (run)",
               "shuffle MiB/it", "ids MiB/it", "sample ms", "load ms", "fwd-bwd ms", "iter ms", "epoch s (est.)",
               "prep s"]
    table = report.format_table(headers, rows, ".1f")
    print(f"\n{args.model}, batch {args.batch_size}/rank, fanouts {fanouts}; "
          f"stats over {stats_batches} held-out batches; times: median over {args.repeats} run(s) of {iters} "
          f"iterations (first of each excluded); epoch = median iteration x iterations per epoch")
    print(table)
    report.save_json(stem, {"experiment": "partition maps (paper Fig. 5, Table 3 Node/Edge/Rand)",
                            "datasets": data_info, "fanouts": fanouts, "batch_size": args.batch_size,
                            "model": args.model, "iterations": iters, "repeats": args.repeats,
                            "presample_epochs": pre_epochs,
                            "stats_batches": stats_batches, "results": results, "table": table})

    panels = sorted({(r["dataset"], r["world"]) for r in results}, key=lambda k: (list(data_info).index(k[0]), k[1]))
    fig, axes = report.figure(4, len(panels))
    for i, (label, world) in enumerate(panels):
        sub = [r for r in results if (r["dataset"], r["world"]) == (label, world)]
        layers = [f"layer {l}" for l in range(len(fanouts))]
        ax, name = axes[4 * i:4 * i + 4], f"{label}, {world} ranks"
        report.bar_panel(ax[0], layers, {r["method"]: r["split_stats"]["cross_edge_fraction"] for r in sub},
                         "cross-split edge fraction", name)
        report.bar_panel(ax[1], layers, {r["method"]: r["split_stats"]["edge_imbalance"] for r in sub},
                         "edge load imbalance (max/mean)", name)
        mib = {r["method"]: [b / 2**20 for b in r["run"]["shuffle_bytes_per_layer_per_iteration"]] for r in sub}
        report.bar_panel(ax[2], layers, mib, "shuffle MiB / iteration (fwd+bwd)", name + " (run)")
        report.stacked_panel(ax[3], [r["method"] for r in sub],
                             {label: [1e3 * r["run"]["iteration_times"][f"{ph}_s"] for r in sub]
                              for ph, label in runs.PHASES}, "ms / iteration (median)", name + " (run)")
    report.save_figure(fig, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
