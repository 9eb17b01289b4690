"""Cooperative batching on CPU ranks: peak memory per rank and time per epoch, the whole graph at once vs co-batches.

One host of 2 CPU ranks over gloo trains full-graph SAGE (``gsplit.run.trainer``, ``system="full"``) on a synthetic
graph with ``co_batches`` 1 (the whole graph at once, :class:`gsplit.FullGraphLoader`) and N > 1
(:class:`gsplit.fullgraph.CoBatchLoader`: the training vertices in N chunks, each chunk's dependency subgraph
fetched once and split over the ranks, gradients accumulated into one step per epoch). Every run is its own launch
(the trainer keeps the freed heap of CPU ranks, so a run after another would start from its peak); in each rank the
peak RSS is reset (``echo 5 > /proc/self/clear_refs``) just before ``train_rank`` and read after it (``VmHWM``), and
the run's memory is the peak minus the RSS at that moment (the dataset, already in the rank, is not counted; the
training loader's setup, e.g. the whole graph's blocks, is). Time: the median ``epoch_s`` of the epochs after the
first (the co-batches' sampling happens inside the epoch; the whole graph's blocks are built once, in ``setup_s``,
also reported). Modes run in ABBA order over ``--repeats``; the loss of epoch 0 shows that every mode trains the
same step. The memory estimate the count is chosen from is reported beside it.

    python experiments/co_batches.py --quick
"""

from __future__ import annotations

import statistics
import sys

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
from harness.memory import status_kb
import gsplit
from gsplit.fullgraph.cobatch import co_batch_estimate, co_batch_targets
from gsplit.fullgraph.loader import estimate_memory, layer_dims
from gsplit.nn import build_model
from gsplit.partitioning import full_graph_stats
from gsplit.run.trainer import TrainConfig, train_rank

RANKS = 2


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure_rank(rank, world, ds, cfg, owner):
    """One run on this rank: its log (rank 0) and the peak RSS the run added above the RSS before it."""
    resettable = _reset_peak()
    before = status_kb("VmRSS") * 1024
    log = train_rank(rank, world, cfg, ds, owner)
    return {"rank": rank, "rss_before": before, "peak": status_kb("VmHWM") * 1024, "resettable": resettable,
            "log": log if rank == 0 else None}


def estimate_of(ds, owner, args, n) -> int:
    """The estimate the count is held against: the whole graph's (n = 1) or the largest co-batch's, worst rank."""
    model = build_model(args.model, ds.features.shape[1], args.hidden, ds.num_classes, num_layers=args.layers)
    dims, feat_dim = layer_dims(model), ds.features.shape[1]
    if n == 1:
        stats = full_graph_stats(ds.graph, owner, RANKS)
        return max(estimate_memory(stats, r, feat_dim, dims).total for r in range(RANKS))
    return max(co_batch_estimate(ds.graph, c, owner, RANKS, args.layers, feat_dim, dims).total
               for c in co_batch_targets(ds.graph, ds.train_idx, n, seed=args.seed))


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0], name="co_batches")
    p.add_sized("--nodes", quick=20_000, full=100_000, type=int, help="synthetic graph size (default 20000 quick)")
    p.add_argument("--model", default="sage")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--avg-degree", type=float, default=5.0)
    p.add_argument("--train-fraction", type=float, default=0.05,
                   help="training vertices' share (the rest split evenly between validation and test)")
    p.add_argument("--co-batches", default="1,2,4,8", help="counts to run (1: the whole graph at once)")
    p.add_sized("--epochs", quick=3, full=5, type=int, help="epochs per run, the first not counted (default 3, 5)")
    p.add_sized("--repeats", quick=2, full=2, type=int, help="runs of every count, ABBA order (default 2)")
    args = p.parse_args(argv)
    stem = report.output_stem(args)
    counts = [int(c) for c in args.co_batches.split(",")]
    rest = (1 - args.train_fraction) / 2
    ds = setup.load_named("synthetic", args.nodes, args.seed, avg_degree=args.avg_degree,
                          split_fractions=(args.train_fraction, rest, rest))
    owner = gsplit.partition_full_graph(ds.graph, RANKS, seed=args.seed).assignment.long()
    runs = {n: [] for n in counts}
    for _, order in rounds.orders(counts, args.repeats):
        for n in order:
            cfg = TrainConfig(model=args.model, fanouts=[-1] * args.layers, hidden=args.hidden, epochs=args.epochs,
                              system="full", seed=args.seed, eval_every=0, final_eval=False, device="cpu",
                              log_iterations=False, dropout=0.0, co_batches=n)
            per_rank = gsplit.launch(measure_rank, RANKS, args=(ds, cfg, owner), devices="cpu", backend="gloo",
                                     timeout=1200)
            log = per_rank[0]["log"]
            epochs = [e["epoch_s"] for e in log["epochs"]][1:]
            runs[n].append({"epoch_s": epochs, "setup_s": log["setup_s"], "loss0": log["epochs"][0]["loss"],
                            "peak_added": [r["peak"] - r["rss_before"] for r in per_rank],
                            "peak": [r["peak"] for r in per_rank], "resettable": all(r["resettable"] for r in per_rank)})
            print(f"  {n} co-batch(es): epoch {statistics.median(epochs):.3f} s, peak added per rank "
                  f"{[round(x / 2**20) for x in runs[n][-1]['peak_added']]} MiB", flush=True)
    rows, results = [], []
    base_t = statistics.median(t for r in runs[counts[0]] for t in r["epoch_s"])
    base_m = max(max(r["peak_added"]) for r in runs[counts[0]])
    for n in counts:
        t = statistics.median(x for r in runs[n] for x in r["epoch_s"])
        m = max(max(r["peak_added"]) for r in runs[n])
        est = estimate_of(ds, owner, args, n)
        results.append({"co_batches": n, "median_epoch_s": t, "peak_added_bytes_max_rank": m,
                        "estimate_bytes": est, "runs": runs[n]})
        rows.append([n, f"{runs[n][0]['loss0']:.6f}", m / 2**20, m / base_m, est / 2**20, t, t / base_t,
                     statistics.median(r["setup_s"] for r in runs[n])])
    headers = ["co-batches", "loss (epoch 0)", "peak MiB added, largest rank", f"vs {counts[0]}",
               "estimate MiB (largest co-batch)", "s/epoch (median)", f"vs {counts[0]}", "setup s"]
    table = report.format_table(headers, rows, ".4g")
    print(f"\n{args.model}, {args.layers} layers, hidden {args.hidden}, synthetic {args.nodes} vertices (average degree "
          f"{args.avg_degree}, {args.train_fraction:.0%} training), {RANKS} CPU ranks")
    print(table)
    report.save_json(stem, {"experiment": "cooperative batching: whole graph vs co-batches, memory and time",
                            "dataset": setup.describe_dataset(ds), "settings": report.settings(args),
                            "results": results, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
