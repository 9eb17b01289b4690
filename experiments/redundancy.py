"""Paper Table 1: the redundant work of data parallelism that split parallelism removes.

For every iteration, data parallelism samples one micro-batch of ``batch_size`` targets per rank and
loads/computes all of it; split parallelism samples the union of those micro-batches once (the global
mini-batch) and every rank computes a disjoint part of it. The counts per iteration:

* data parallel: sum over ranks of ``NeighborSampler.sample_blocks(micro-batch)`` (what
  :class:`gsplit.baselines.DataParallelLoader` runs on each rank);
* split: ``NeighborSampler.sample_blocks(global mini-batch)``, which the split loader reproduces
  exactly, spread over ranks (the parity test proves it).

Then one real multi-rank run of each system through ``gsplit.run.trainer`` confirms that the trainer's
counters (summed over ranks) equal these counts, iteration by iteration.

    python experiments/redundancy.py --quick
"""

from __future__ import annotations

import itertools
import statistics
import sys

from harness import report, runs, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

import gsplit
from gsplit.sampling.batches import epoch_permutation, num_iterations
from gsplit.run.trainer import TrainConfig


def batches(train_idx: torch.Tensor, global_batch: int, seed: int, count: int):
    """The first ``count`` full global mini-batches ``(epoch, iteration, seeds)``, as the loaders cut them."""
    out, epoch = [], 0
    full = train_idx.numel() // global_batch
    if full == 0:
        raise ValueError(f"{train_idx.numel()} training vertices hold no full global mini-batch of {global_batch}; "
                         "lower --batch-size")
    while len(out) < count:
        order = epoch_permutation(train_idx, seed, epoch, True)
        for it in range(min(full, count - len(out))):
            out.append((epoch, it, order[it * global_batch:(it + 1) * global_batch]))
        epoch += 1
    return out


def count_blocks(blocks) -> dict:
    return {"input_rows": blocks[0].num_src_nodes(), "edges": [b.num_edges() for b in blocks],
            "dst_vertices": [b.num_dst_nodes() for b in blocks]}


def add(a: dict, b: dict) -> dict:
    return {"input_rows": a["input_rows"] + b["input_rows"],
            "edges": [x + y for x, y in zip(a["edges"], b["edges"])],
            "dst_vertices": [x + y for x, y in zip(a["dst_vertices"], b["dst_vertices"])]}


def count_iteration(graph, sampler, epoch: int, it: int, seeds: torch.Tensor, world: int, batch_size: int):
    """``(split, data_parallel)`` counts of one iteration."""
    split = count_blocks(sampler.sample_blocks(graph, seeds, epoch, it))
    dp = None
    for r in range(world):
        micro = seeds[r * batch_size:(r + 1) * batch_size]
        c = count_blocks(sampler.sample_blocks(graph, micro, epoch, it))
        dp = c if dp is None else add(dp, c)
    return split, dp


def measure(ds, world: int, batch_size: int, fanouts, iters: int, seed: int) -> dict:
    sampler = gsplit.NeighborSampler(fanouts, seed=seed)
    per_iter = []
    for epoch, it, seeds in batches(ds.train_idx, world * batch_size, seed, iters):
        split, dp = count_iteration(ds.graph, sampler, epoch, it, seeds, world, batch_size)
        per_iter.append({"epoch": epoch, "iteration": it, "split": split, "dp": dp})
    mean = lambda xs: statistics.fmean(xs)  # noqa: E731
    res = {"iterations": len(per_iter), "per_iteration": per_iter}
    for system in ("split", "dp"):
        res[system] = {"input_rows": mean([p[system]["input_rows"] for p in per_iter]),
                       "edges": mean([sum(p[system]["edges"]) for p in per_iter]),
                       "edges_per_layer": [mean([p[system]["edges"][layer] for p in per_iter])
                                           for layer in range(len(fanouts))],
                       "dst_vertices": mean([sum(p[system]["dst_vertices"]) for p in per_iter])}
    res["edge_ratio"] = res["dp"]["edges"] / res["split"]["edges"]
    res["feature_ratio"] = res["dp"]["input_rows"] / res["split"]["input_rows"]
    res["vertex_ratio"] = res["dp"]["dst_vertices"] / res["split"]["dst_vertices"]
    return res


def confirm_with_trainer(ds, world: int, batch_size: int, fanouts, iters: int, seed: int) -> dict:
    """Run both systems through ``gsplit.run.trainer`` and compare its per-iteration counters with the offline counts."""
    pmap, _, _ = setup.make_map(ds, world, "edge", fanouts, batch_size, seed)
    jobs = [(TrainConfig(model="sage", fanouts=list(fanouts), batch_size=batch_size, hidden=32, epochs=1,
                         system=system, seed=seed, eval_every=0, max_iters=iters, device="cpu",
                         input_features="shuffle"),  # the paper's rows loaded: each by one GPU
             pmap.assignment if system == "split" else None) for system in ("split", "dp")]
    logs = runs.run_jobs(ds, world, jobs)
    sampler = gsplit.NeighborSampler(fanouts, seed=seed)
    order = epoch_permutation(ds.train_idx, seed, 0, True)
    gb = world * batch_size
    rows, ok = [], True
    n_iter = min(iters, num_iterations(ds.train_idx.numel(), batch_size, world))
    for it in range(n_iter):
        split, dp = count_iteration(ds.graph, sampler, 0, it, order[it * gb:(it + 1) * gb], world, batch_size)
        for system, log, ref in (("split", logs[0], split), ("dp", logs[1], dp)):
            recs = [r["per_iteration"][it] for r in log["epochs"][0]["ranks"]]
            got = {"input_rows": sum(r["input_rows"] for r in recs),
                   "edges": [sum(r["edges"][l] for r in recs) for l in range(len(fanouts))],
                   "dst_vertices": [sum(r["dst_vertices"][l] for r in recs) for l in range(len(fanouts))]}
            same = got == ref
            ok &= same
            rows.append({"iteration": it, "system": system, "trainer": got, "offline": ref, "equal": same})
    traffic = logs[0]["epochs"][0]["traffic_bytes_by_tag"]
    return {"dataset": ds.name, "world": world, "map": "edge", "iterations": n_iter, "all_equal": ok,
            "rows": rows, "split_traffic_bytes_by_tag": traffic,
            "split_traffic_bytes_per_iteration": sum(traffic.values()) / max(n_iter, 1)}


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=1024, help="targets per rank per iteration (default 1024)")
    p.add_argument("--fanouts", default="15,10,5", type=setup.int_list)
    p.add_sized("--iters", quick=4, full=10, type=int, help="iterations averaged (default 4 quick, 10 full)")
    p.add_sized("--synthetic-nodes", quick=[20_000], full=[100_000, 1_000_000], type=setup.int_list,
                help="comma-separated sizes (default 20000 quick, 100000,1000000 full)")
    p.add_argument("--worlds", default="2,4", type=setup.int_list)
    args = p.parse_args(argv)
    fanouts, iters, worlds = args.fanouts, args.iters, args.worlds
    stem = report.output_stem(args, "redundancy")

    keys = [("synthetic", n) for n in args.synthetic_nodes] + [("bio", 0)]
    results, rows, confirm, data_info = [], [], None, {}
    for _, label, ds in itertools.chain(*(setup.each_dataset([k], n, args.seed, data_info) for k, n in keys)):
        for world in worlds:
            res = measure(ds, world, args.batch_size, fanouts, iters, args.seed)
            results.append({"dataset": label, "world": world, **res})
            rows.append([label, world, round(res["dp"]["edges"]), round(res["split"]["edges"]), res["edge_ratio"],
                         round(res["dp"]["input_rows"]), round(res["split"]["input_rows"]), res["feature_ratio"]])
        if confirm is None:  # one real run per system, through the trainer, on the first dataset
            print(f"confirming with real {worlds[0]}-rank runs of both systems on {label}", flush=True)
            confirm = confirm_with_trainer(ds, worlds[0], args.batch_size, fanouts, 3 if args.quick else 5, args.seed)
            confirm["dataset"] = label
        del ds

    headers = ["graph", "ranks", "edges DP", "edges split", "DP/split", "features DP", "features split", "DP/split"]
    table = report.format_table(headers, rows, ".2f")
    print(f"\nper iteration, batch {args.batch_size} per rank, fanouts {fanouts}, mean of {iters} iterations")
    print(table)
    if confirm is not None:
        print(f"\ntrainer counters == offline counts on {confirm['dataset']} ({confirm['world']} ranks, "
              f"{confirm['iterations']} iterations, both systems): {confirm['all_equal']}")
    for r in results:  # keep the JSON small: per-iteration detail only for the first configuration
        if r is not results[0]:
            r.pop("per_iteration")
    report.save_json(stem, {"experiment": "redundancy (paper Table 1)", "batch_size": args.batch_size,
                            "fanouts": fanouts, "iterations": iters, "datasets": data_info, "results": results,
                            "trainer_confirmation": confirm, "table": table})
    fig, axes = report.figure(2)
    groups = [f"{r['dataset']}\n{r['world']} ranks" for r in results]
    report.bar_panel(axes[0], groups, {"data parallel": [r["dp"]["edges"] for r in results],
                                       "split": [r["split"]["edges"] for r in results]}, "edges computed / iteration")
    report.bar_panel(axes[1], groups, {"data parallel": [r["dp"]["input_rows"] for r in results],
                                       "split": [r["split"]["input_rows"] for r in results]},
                     "feature rows loaded / iteration")
    report.save_figure(fig, stem)
    if confirm is not None and not confirm["all_equal"]:
        print("ERROR: the trainer's counters differ from the offline counts", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
