"""Issue 52: sampling time per epoch, split against data parallelism, on CPU ranks (loaders alone, no training).

Each rank iterates one epoch of its loader, as ``gsplit train`` builds it: ``split`` is :class:`gsplit.DataLoader`
(the partition map, overlap plans as for SAGE, input rows read directly from the shared table: the CPU
default), ``dp`` is :class:`gsplit.baselines.DataParallelLoader`; synthetic graph (100k vertices; ``--quick``
20k), fanouts 15,10,5, 1024 targets per rank, one torch thread per rank (``gsplit.launch``'s default). A
barrier after every batch stands for training's once-per-iteration meeting (the gradient all-reduce), so a
split rank's waits inside its id exchanges are the skew of sampling alone, not of compute. The first
epoch (capacities learnt, caches warm) is not counted; the second is.

Per system and world size, medians over interleaved rounds (each run a fresh process; the order alternates):
``sample s`` (the loaders' own ``sample_s`` summed over the epoch, the slowest rank: what ``gsplit train``
reports as ``sample``), ``load s`` likewise, and ``CPU s``: the thread CPU time of the rank's ``next(loader)``
calls over the epoch (sampling and loading as computed, without the time other jobs held the cores or the
rank waited: much less sensitive to a loaded machine than wall time), the largest over ranks.

    python experiments/bench_sampling_epoch.py                  # 2 and 4 ranks, 3 rounds
    python experiments/bench_sampling_epoch.py --ranks 2 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

FANOUTS = [15, 10, 5]
BATCH = 1024
SYSTEMS = ("split", "dp")


def rank_body(rank, world_size, data_path, system):
    import torch.distributed as dist

    import gsplit
    from gsplit.baselines.data_parallel import DataParallelLoader

    data = torch.load(data_path, weights_only=False)
    graph, train, features = data["graph"], data["train"], data["features"]
    sampler = gsplit.NeighborSampler(FANOUTS, seed=0)
    if system == "split":
        loader = gsplit.DataLoader(graph, train, sampler, partition=data["owners"][world_size], device="cpu",
                                   use_ddp=True, ddp_seed=0, batch_size=BATCH, shuffle=True, features=features,
                                   overlap=True, input_features="auto")  # gsplit train's defaults for SAGE
    else:
        loader = DataParallelLoader(graph, train, sampler, device="cpu", use_ddp=True, ddp_seed=0,
                                    batch_size=BATCH, shuffle=True, features=features)
    epochs = []
    for _ in range(2):
        sample_s = load_s = cpu_s = wall_s = 0.0
        edges = rows = iters = 0
        it = iter(loader)
        while True:
            dist.barrier()  # training's one meeting per iteration
            c0, t0 = time.thread_time(), time.perf_counter()
            batch = next(it, None)
            c1, t1 = time.thread_time(), time.perf_counter()
            if batch is None:
                break
            stats = loader.last_stats
            sample_s, load_s, cpu_s, wall_s = sample_s + stats.sample_s, load_s + stats.load_s, \
                cpu_s + c1 - c0, wall_s + t1 - t0
            edges += sum(stats.edges)
            rows += stats.input_rows
            iters += 1
        epochs.append({"sample_s": sample_s, "load_s": load_s, "cpu_s": cpu_s, "wall_s": wall_s, "edges": edges,
                       "input_rows": rows, "iterations": iters})
    return epochs[-1]


def worker(args) -> int:
    from gsplit.launcher import launch

    ranks = launch(rank_body, args.world, args=(args.data, args.system), devices="cpu")
    res = {"system": args.system, "ranks": args.world, "per_rank": ranks, "load": report.load_average(),
           **{k: max(r[k] for r in ranks) for k in ("sample_s", "load_s", "cpu_s", "wall_s")},
           "edges": sum(r["edges"] for r in ranks), "input_rows": sum(r["input_rows"] for r in ranks),
           "iterations": max(r["iterations"] for r in ranks)}
    report.write_json(args.result, res)
    return 0


def make_data(path: Path, nodes: int, worlds, seed: int, method: str) -> None:
    if path.exists():
        return
    ds = setup.load_named("synthetic", nodes, seed)
    owners = {w: setup.make_map(ds, w, method, FANOUTS, BATCH, seed, presample_epochs=5)[0].assignment.long()
              for w in worlds}
    torch.save({"graph": ds.graph, "train": ds.train_idx, "features": ds.features, "owners": owners}, path)


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0], name="bench_sampling_epoch")
    p.add_argument("--ranks", type=setup.int_list, default=[2, 4], help="comma-separated world sizes (default 2,4)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--method", default="gsplit", choices=["gsplit", "node", "edge", "random"],
                   help="split's partition method (default gsplit, as vs_dgl.py)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds allowed per run")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--system", default="split", help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    nodes = 20_000 if args.quick else 100_000
    stem = report.output_stem(args)
    scratch = setup.scratch(args.out, "bench_sampling_epoch")
    worlds = sorted(set(args.ranks))
    data = scratch / f"synthetic_{nodes}_seed{args.seed}_{args.method}_w{'-'.join(map(str, worlds))}.pt"
    make_data(data, nodes, worlds, args.seed, args.method)
    runs = []
    for rnd, order in rounds.orders(list(SYSTEMS), args.rounds):
        for world in worlds:
            for system in order:
                load = report.load_average()
                cmd = [sys.executable, Path(__file__).resolve(), "--worker", "--world", world, "--system", system,
                       "--data", data]
                res = rounds.run_json(cmd, flag="--result", path=scratch / f"result_{system}_w{world}.json",
                                      env=rounds.checkout_env(setup.REPO), timeout=args.timeout)
                res.update(round=rnd, load_before=load)
                runs.append(res)
                print(f"round {rnd} {world} ranks {system:>5}: sample {res['sample_s']:.2f} s, load "
                      f"{res['load_s']:.2f} s, CPU {res['cpu_s']:.2f} s, {res['iterations']} it "
                      f"(load avg {load[0] if load else float('nan'):.1f})", flush=True)
    summary, rows = [], []
    for world in worlds:
        got = {}
        for system in SYSTEMS:
            rs = [r for r in runs if (r["system"], r["ranks"]) == (system, world)]
            got[system] = {k: statistics.median(r[k] for r in rs) for k in ("sample_s", "load_s", "cpu_s", "wall_s")}
            got[system].update(edges=rs[-1]["edges"], input_rows=rs[-1]["input_rows"],
                               iterations=rs[-1]["iterations"], sample_s_all=[r["sample_s"] for r in rs],
                               cpu_s_all=[r["cpu_s"] for r in rs])
        # split over dp per round (same round: the same state of the machine), then the median
        ratio = {k: statistics.median(
            a[k] / b[k] for a, b in zip(*[[r for r in runs if (r["system"], r["ranks"]) == (s, world)]
                                          for s in SYSTEMS])) for k in ("sample_s", "cpu_s")}
        summary.append({"ranks": world, **{s: got[s] for s in SYSTEMS}, "split_over_dp": ratio})
        rows.append([world, got["split"]["iterations"], got["split"]["sample_s"], got["dp"]["sample_s"],
                     ratio["sample_s"], got["split"]["cpu_s"], got["dp"]["cpu_s"], ratio["cpu_s"],
                     got["split"]["load_s"], got["dp"]["load_s"],
                     f"{got['split']['edges'] / 1e6:.2f} / {got['dp']['edges'] / 1e6:.2f}"])
    loads = [r["load_before"][0] for r in runs if r["load_before"]]
    table = report.format_table(["ranks", "iterations", "split sample s", "dp sample s", "split/dp sample",
                                 "split CPU s", "dp CPU s", "split/dp CPU", "split load s", "dp load s",
                                 "edges M split / dp"], rows, ".2f")
    print(f"\nsampling per epoch (loaders alone), synthetic {nodes:,}, fanouts {FANOUTS}, {BATCH} targets per rank, "
          f"median of {args.rounds} interleaved round(s); load average (1 min) {min(loads):.1f}-{max(loads):.1f}")
    print(table)
    report.save_json(stem, {"experiment": "sampling per epoch, split vs dp, loaders alone (issue 52)",
                            "nodes": nodes, "fanouts": FANOUTS, "batch_per_rank": BATCH, "rounds": args.rounds,
                            "method": args.method, "settings": report.settings(args), "machine": report.machine_info(),
                            "loads": loads, "summary": summary, "runs": runs, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
