"""Full-graph training across hosts, counted: one split group spanning the hosts vs shared preloading.

2 "hosts" of 2 CPU ranks (one launch of 4 ranks over gloo, ``TrainConfig.ranks_per_host=2``, as torchrun gives
two hosts of two GPUs) train the same model with ``gsplit.run.trainer``: ``span`` (one split group of the 4 ranks,
a 4-part full-graph map: every layer's shuffle crosses hosts), ``preload`` (a 2-part host map, each host its
vertices plus their exact halo over its 2 ranks) and ``preload`` with expansion-aware sampling. Reported per
epoch from the trainer's counters (summed over ranks, mean over the epochs after the first): bytes the split
groups sent to ranks on the other host and inside a host, bytes of the gradient all-reduce (over every rank;
how much of it crosses hosts depends on the all-reduce's algorithm), edges computed per layer over all ranks
(the halo's redundant work), the largest memory estimate of a rank, and the epoch time. On one machine the
times say nothing about a network between hosts (and the 2 cores are shared): the counts are what to read.

    python experiments/host_modes.py --quick
"""

from __future__ import annotations

import statistics
import sys

from harness import report, runs, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
from gsplit.nn import build_model
from gsplit.partitioning import partition_full_graph
from gsplit.run.trainer import TrainConfig
from host_halo import host_parts, peak_memory

HOSTS, RANKS_PER_HOST = 2, 2


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0], name="host_modes")
    p.add_argument("--datasets", default="synthetic")
    p.add_argument("--data-dir", default=str(setup.DATA), help=f"where cora.npz is (default {setup.DATA})")
    p.add_sized("--nodes", quick=5000, full=50_000, type=int, help="synthetic graph size (default 5000 quick, 50000)")
    p.add_argument("--model", default="sage")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--external-hops", type=int, default=1)
    p.add_argument("--external-fanout", type=int, default=15)
    p.add_sized("--epochs", quick=3, full=6, type=int, help="epochs per run, the first not counted (default 3, 6)")
    p.add_sized("--repeats", quick=1, full=2, type=int, help="runs of every mode, ABBA order (default 1 quick, 2)")
    args = p.parse_args(argv)
    stem = report.output_stem(args)
    world = HOSTS * RANKS_PER_HOST
    modes = {"span (one split group)": ("span", None, None), "preload, exact halo": ("preload", None, None),
             f"preload, m={args.external_hops} k={args.external_fanout}":
                 ("preload", args.external_hops, args.external_fanout)}
    data_info, results, rows = {}, [], []
    for _, label, ds in setup.each_dataset(args.datasets, args.nodes, args.seed, data_info, args.data_dir):
        maps = {"span": partition_full_graph(ds.graph, world, seed=args.seed).assignment,
                "preload": partition_full_graph(ds.graph, HOSTS, seed=args.seed).assignment}
        model = build_model(args.model, ds.features.shape[1], args.hidden, ds.num_classes, num_layers=args.layers)
        jobs = {name: (TrainConfig(model=args.model, fanouts=[-1] * args.layers, hidden=args.hidden, epochs=args.epochs,
                                   system="full", seed=args.seed, eval_every=0, device="cpu",
                                   ranks_per_host=RANKS_PER_HOST, host_mode=mode, external_hops=hops,
                                   external_fanout=fanout), maps[mode])
                for name, (mode, hops, fanout) in modes.items()}
        logs = runs.run_repeated(ds, world, jobs, repeats=args.repeats)
        for name, (mode, hops, fanout) in modes.items():
            epochs = [e for log in logs[name] for e in log["epochs"][1:]]
            mean = lambda key: statistics.mean(e[key] for e in epochs)  # noqa: E731
            if mode == "span":
                mem = peak_memory(ds.graph, world, model, ds.features.shape[1], args.seed)
            else:
                _, shares = host_parts(ds, maps["preload"], args.layers, hops, fanout, args.seed)
                mem = max(peak_memory(s.graph, RANKS_PER_HOST, model, ds.features.shape[1], args.seed) for s in shares)
            res = {"dataset": label, "mode": name, "loss_first_epoch": logs[name][0]["epochs"][0]["loss"],
                   "cross_host_bytes": mean("cross_host_bytes"), "inside_host_bytes": mean("inside_host_bytes"),
                   "gradient_bytes": mean("gradient_bytes"),
                   "edges_per_layer": statistics.mean(sum(e["edges"]) / args.layers for e in epochs),
                   "graph_edges": ds.graph.num_edges, "peak_rank_memory_estimate_bytes": mem,
                   "epoch_s": [e["epoch_s"] for e in epochs]}
            results.append(res)
            rows.append([label, name, f"{res['loss_first_epoch']:.6f}", res["cross_host_bytes"] / 2**20,
                         res["inside_host_bytes"] / 2**20, res["gradient_bytes"] / 2**20,
                         res["edges_per_layer"] / ds.graph.num_edges, mem / 2**20, statistics.median(res["epoch_s"])])
    headers = ["dataset", "2 hosts x 2 ranks", "loss (epoch 0)", "across hosts MiB/epoch", "inside hosts MiB/epoch",
               "gradient all-reduce MiB/epoch", "edges / graph's", "peak MiB per rank (estimate)",
               "s/epoch (2 shared cores)"]
    table = report.format_table(headers, rows, ".4g")
    print(f"\n{args.model}, {args.layers} layers, hidden {args.hidden}; counts summed over the 4 ranks")
    print(table)
    report.save_json(stem, {"experiment": "full-graph across hosts: span vs preload vs preload + expansion-aware",
                            "datasets": data_info, "settings": report.settings(args), "results": results,
                            "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
