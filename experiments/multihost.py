"""Many hosts: 2 hosts x 2 ranks (hybrid) vs 4 split ranks on one host vs 4 data-parallel ranks.

All three train the same model on the same global mini-batches (``batch_size`` per rank, 4 ranks) through
``gsplit.run.trainer`` in one launch of 4 CPU ranks over gloo; the 2 x 2 layout makes the host groups
[0, 1] and [2, 3] (``TrainConfig.ranks_per_host=2``), exactly what torchrun gives two hosts of two
GPUs. Reported per iteration, summed over ranks, from the trainer's own counters: input-feature rows
loaded, edges computed, bytes sent inside the split groups (id exchanges and shuffles: inside one
host) and bytes of the gradient all-reduce (over every rank: the traffic between hosts). On one
machine the timings say nothing about a network between hosts; the counts are what to read.

    python experiments/multihost.py --quick
"""

from __future__ import annotations

import sys

from harness import report, runs, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
from gsplit.run.trainer import TrainConfig

LAYOUTS = (("2 hosts x 2 (hybrid)", "split", 2), ("1 host x 4 (split)", "split", 0), ("4 data-parallel", "dp", 0))
"""(label, system, ranks_per_host): the three ways of using 4 ranks."""


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=100_000, help="synthetic graph size (default 100000)")
    p.add_argument("--model", default="sage")
    p.add_argument("--batch-size", type=int, default=512, help="targets per rank per iteration")
    p.add_argument("--fanouts", default="15,10,5", type=setup.int_list)
    p.add_argument("--hidden", type=int, default=128)
    p.add_sized("--iters", quick=3, full=10, type=int, help="iterations per run (default 3 quick, 10 full)")
    p.add_sized("--presample-epochs", quick=1, full=5, type=int, help="default 1 quick, 5 full")
    args = p.parse_args(argv)
    iters, pre_epochs, fanouts = args.iters, args.presample_epochs, args.fanouts
    world = 4
    stem = report.output_stem(args, "multihost")

    data_info, results, rows = {}, [], []
    for _, label, ds in setup.each_dataset("synthetic", args.nodes, args.seed, data_info):
        # one map per split group size: 2 parts (shared by both hosts of the hybrid), 4 parts (one host)
        maps = {}
        for parts in (2, 4):
            pmap, prep, _ = setup.make_map(ds, parts, "gsplit", fanouts, args.batch_size, args.seed, pre_epochs)
            maps[parts] = pmap.assignment
            print(f"  gsplit map with {parts} parts in {prep['presample_s'] + prep['partition_s']:.1f}s", flush=True)
        jobs = {name: (TrainConfig(model=args.model, fanouts=fanouts, batch_size=args.batch_size, hidden=args.hidden,
                                   epochs=1, system=system, seed=args.seed, eval_every=0, max_iters=iters,
                                   device="cpu", ranks_per_host=per_host, input_features="shuffle"),
                       None if system == "dp" else maps[per_host or world])
                for name, system, per_host in LAYOUTS}
        logs = runs.run_repeated(ds, world, jobs)
        for name, system, per_host in LAYOUTS:
            log = logs[name][0]
            c = runs.epoch_counters(log)
            rec = log["epochs"][0]
            n = c["iterations"]
            t = runs.iteration_times(log)
            res = {"dataset": label, "layout": name, "system": system, "hosts": log["hosts"],
                   "ranks_per_host": log["ranks_per_host"], "iterations_run": n, "loss": rec["loss"],
                   "input_rows_per_iteration": c["input_rows"] / n, "edges_per_iteration": sum(c["edges"]) / n,
                   "split_group_bytes_per_iteration": rec["split_group_bytes"] / n,
                   "id_bytes_per_iteration": runs.id_bytes(c["traffic_bytes_by_tag"]) / n,
                   "gradient_bytes_per_iteration": rec["gradient_bytes"] / n,
                   "iteration_times": t, "counters": c}
            results.append(res)
            rows.append([name, f"{res['loss']:.6f}", round(res["input_rows_per_iteration"]), round(res["edges_per_iteration"]),
                         res["split_group_bytes_per_iteration"] / 2**20, res["id_bytes_per_iteration"] / 2**20,
                         res["gradient_bytes_per_iteration"] / 2**20, t["total_s"]])

    headers = ["4 ranks as", "loss", "features/it", "edges/it", "in split group MiB/it", "of which ids MiB/it",
               "gradient all-reduce MiB/it", "s/it (2 shared cores)"]
    table = report.format_table(headers, rows, ".4g")
    print(f"\n{'quick run' if args.quick else 'run'}: {iters} iterations of batch {args.batch_size}/rank "
          f"({args.batch_size * world} targets per global mini-batch), fanouts {fanouts}, {args.model} "
          f"hidden {args.hidden}; counts summed over the 4 ranks")
    print(table)
    report.save_json(stem, {"experiment": "many hosts: hybrid 2x2 vs split 4x1 vs data-parallel 4", "datasets": data_info,
                            "fanouts": fanouts, "batch_size": args.batch_size, "hidden": args.hidden,
                            "model": args.model, "iterations": iters, "presample_epochs": pre_epochs,
                            "results": results, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
