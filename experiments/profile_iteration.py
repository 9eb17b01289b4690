"""Where one training iteration's time goes, for split and data parallelism (issue: per-iteration overhead).

Each rank runs ``gsplit.run.trainer.train_rank`` for a few iterations under ``cProfile``; the cumulative time of
the functions that make up an iteration (sampling, relabelling, id and count exchanges, feature loading,
shuffles forward and backward, layer kernels, backward, gradient all-reduce, optimiser) is divided by the
number of iterations. The profiler itself costs a little per Python call, so the totals run a few percent
above an unprofiled run; the split between parts is what this measures. Rank 0 is reported (the ranks
do the same kinds of work; ``--rank`` picks another).

    python experiments/profile_iteration.py                 # synthetic 100k, SAGE hidden 256, 2 ranks
    python experiments/profile_iteration.py --quick         # a small graph, for a smoke test
    python experiments/profile_iteration.py --iters 32 --macrobatch 16 --name profile_iteration_mb16
"""

from __future__ import annotations

import cProfile
import pstats
import time

from harness import report, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import gsplit
from gsplit.run.trainer import TrainConfig, train_rank

# (label, function name as cProfile records it, file fragment): cumulative seconds of each. Cumulative means
# with everything the function calls: the loader's _prepare includes sampling and the feature gather.
PARTS = [
    ("sampling, whole (split: incl. id exchanges)", "sp_sample_many", "split_sampling.py"),
    ("layer loop (sample_many; dp: all of sampling)", "sample_many", "neighbor.py"),
    ("  pick neighbours (ops.sample_neighbors)", "sample_neighbors", "ops/__init__.py"),
    ("  relabel (ops.relabel)", "relabel", "ops/__init__.py"),
    ("  id exchange (exchange_ids_many)", "exchange_ids_many", "split_sampling.py"),
    ("    count exchange (exchange_counts)", "exchange_counts", "communicator.py"),
    ("feature gather (FeatureStore)", "gather_with_counts", "feature_store.py"),
    ("loader, whole (_prepare: sampling, gather, feature shuffle, labels)", "_prepare", "loader.py"),
    ("forward (model)", "_call_impl", "module.py"),
    ("  layers: per-source terms (project_sources)", "project_sources", "nn/layers.py"),
    ("  layers: aggregation + per-destination terms (combine)", "combine", "nn/layers.py"),
    ("  shuffles forward", "forward", "comm/shuffle.py"),
    ("  overlapped shuffles: waits, forward and backward (AsyncRows.wait)", "wait", "gsplit/minibatch/overlap.py"),
    ("backward (autograd, incl. shuffles backward)", "backward", "_tensor.py"),
    ("  shuffles backward", "backward", "comm/shuffle.py"),
    ("gradient all-reduce", "allreduce_gradients", "gradients.py"),
    ("optimiser step", "step", "adam.py"),
    ("all-to-all calls (ids + shuffles)", "all_to_all_rows", "communicator.py"),
]


LOADER = next(label for label, name, _ in PARTS if name == "_prepare")
# (label, whole, parts to take off): rows computed from the cumulative ones above
DERIVED = [
    ("feature shuffle + labels (loader minus sampling and gather)", LOADER,
     ("sampling, whole (split: incl. id exchanges)", "feature gather (FeatureStore)")),
]
ROW_ORDER = [label for label, _, _ in PARTS[:8]] + [DERIVED[0][0]] + [label for label, _, _ in PARTS[8:]]


def derived_ms(ms: dict) -> dict:
    """The computed rows of one system's ``ms_per_iteration`` (absent where a part is absent, e.g. dp's loader).

    Example:
        >>> derived_ms({LOADER: 90.0, "sampling, whole (split: incl. id exchanges)": 53.0,
        ...             "feature gather (FeatureStore)": 5.0})
        {'feature shuffle + labels (loader minus sampling and gather)': 32.0}
    """
    out = {}
    for label, whole, minus in DERIVED:
        if whole in ms and all(m in ms for m in minus):
            out[label] = ms[whole] - sum(ms[m] for m in minus)
    return out


def profiled_rank(rank, world_size, cfg, dataset, owner, report_rank):
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    log = train_rank(rank, world_size, cfg, dataset, owner)
    prof.disable()
    wall = time.perf_counter() - t0
    if rank != report_rank:
        return None
    stats = pstats.Stats(prof)
    cumulative = {}
    for (path, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
        for label, name, fragment in PARTS:
            if func == name and path.replace("\\", "/").endswith(fragment):
                cumulative[label] = cumulative.get(label, 0.0) + ct
    epochs = log["epochs"] if isinstance(log, dict) and "epochs" in log else None
    return {"cumulative_s": cumulative, "wall_s": wall, "iterations": epochs[0]["ranks"][rank]["iterations"]
            if epochs else None, "epoch": epochs[0] if epochs else None}


def main(argv=None):
    p = setup.make_parser(__doc__.splitlines()[0], name="profile_iteration")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--model", default="sage")
    p.add_argument("--rank", type=int, default=0, help="which rank's profile to report")
    p.add_argument("--macrobatch", type=int, default=1, help="mini-batches sampled and loaded together (issue 33)")
    args = p.parse_args(argv)
    num_nodes = 20_000 if args.quick else 100_000
    iters = 5 if args.quick else args.iters
    ds = setup.load_named("synthetic", num_nodes, args.seed)
    fanouts = [15, 10, 5]
    pmap, _, _ = setup.make_map(ds, args.ranks, "edge", fanouts, 1024, args.seed)
    results = {}
    for system in ("split", "dp"):
        cfg = TrainConfig(model=args.model, fanouts=fanouts, batch_size=1024, hidden=256, dropout=0.5, epochs=1,
                          lr=0.003, system=system, seed=args.seed, eval_every=0, max_iters=iters, device="cpu",
                          macrobatch=args.macrobatch)
        out = gsplit.launch(profiled_rank, args.ranks, args=(cfg, ds, pmap.assignment, args.rank), devices="cpu",
                            backend="gloo", timeout=1800)[args.rank]
        n = out["iterations"] or iters
        ms = {k: 1e3 * v / n for k, v in out["cumulative_s"].items()}
        results[system] = {"ms_per_iteration": {**ms, **derived_ms(ms)},
                           "iterations": n, "epoch_s": out["epoch"]["epoch_s"] if out["epoch"] else None}
        print(f"{system}: {n} iterations, epoch {results[system]['epoch_s']:.2f}s (profiled)", flush=True)
    rows = []
    for label in ROW_ORDER:
        vals = [results[s]["ms_per_iteration"].get(label) for s in ("split", "dp")]
        if any(v is not None for v in vals):
            rows.append([label] + [("-" if v is None else round(v, 1)) for v in vals])
    rows.append(["iteration (epoch time / iterations)"] + [round(1e3 * results[s]["epoch_s"] / results[s]["iterations"], 1)
                                                         for s in ("split", "dp")])
    print(report.format_table(["part (rank %d, ms per iteration)" % args.rank, "split", "dp"], rows))
    stem = report.output_stem(args)
    report.save_json(stem, {"config": {"num_nodes": num_nodes, "ranks": args.ranks, "iters": iters,
                                       "macrobatch": args.macrobatch,
                                       "model": args.model, "fanouts": fanouts, "batch_size": 1024, "hidden": 256},
                            "results": results})


if __name__ == "__main__":
    main()
