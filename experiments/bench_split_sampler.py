"""Issue 20: split sampling alone (``gsplit.split.sp_sample``) on 2 CPU ranks, per layer, and an A/B of two code trees.

Setup (as ``profile_iteration.py``): synthetic 100k (``--quick``: 20k) vertices, the ``edge`` map of
``harness.setup.make_map`` for 2 ranks, fanouts 15,10,5, 1024 targets per rank (global batches of
2048 of the training targets, epoch 0), one torch thread per rank (``gsplit.launch``'s default on 2 cores).
Also the CPU time of the sampling thread per batch (``time.thread_time``: what it computed, not what it
waited; less sensitive to other jobs on the cores than wall time). Every iteration starts after a barrier
(training syncs once per iteration at the gradient all-reduce), so the times below are those of sampling
alone; ``--warmup`` (3) iterations untimed, ``--iters`` (30) timed.

Per rank and layer (L2 is sampled first), median ms: ``sample`` (``ops.sample_neighbors``), ``relabel``
(the block's ``ops.relabel``), ``before`` (from the layer's start to its id exchange: what the other rank
waits for), ``exchange`` (``exchange_ids`` whole), in it ``a2a`` (the collectives, ``Communicator._all_to_all``),
``wait`` (from this rank's entry into the first collective of the layer to the later rank's entry: the part
of ``a2a`` that is waiting for the other rank) and ``around`` (exchange minus collectives: packing, capacity
bookkeeping, the new frontier and the shuffle index); ``before cpu`` and ``around cpu``: the same two spans in
the thread's CPU time (what the rank computed there, without the time other jobs held the core). Timestamps are ``time.perf_counter`` (CLOCK_MONOTONIC,
one clock for both processes of the host).

The data (graph, map, targets) are made once and saved under ``OUT/scratch/bench_split_sampler/``; each
run is a fresh process (``--worker``) that imports ``gsplit`` from ``--tree`` (its PYTHONPATH). With
``--old TREE`` the script runs ``--rounds`` (5) rounds, each one run of the old tree and one of this tree
(alternating which goes first), and reports medians over rounds and the ratio new/old; it also checks that
every batch is identical in both trees (a SHA-256 of every block's edges, vertices and shuffle plan).

    git worktree add /tmp/old_sampling 26a9732
    python experiments/bench_split_sampler.py --old /tmp/old_sampling        # A/B, 5 rounds
    python experiments/bench_split_sampler.py                                 # this tree, one run
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

FANOUTS = [15, 10, 5]
PHASES = ["sample", "relabel", "before", "exchange", "a2a", "wait", "around", "before cpu", "around cpu"]


def batch_digest(batch) -> str:
    """SHA-256 of everything a split batch fixes: every block's vertices, edges and shuffle plan, and the input."""
    h = hashlib.sha256()

    def add(t):
        if isinstance(t, torch.Tensor):
            h.update(str(t.dtype).encode())
            h.update(t.contiguous().cpu().numpy().tobytes())
        else:
            h.update(repr(t).encode())

    add(batch.input_nodes)
    for b in batch.blocks:
        for t in (b.src_nodes, b.num_dst, b.edge_src, b.edge_dst, b.edge_ids):
            add(t)
        s = b.shuffle_index
        if s is not None:
            for t in (s.send_idx, list(s.send_counts), s.recv_pos, list(s.recv_counts), s.num_local, s.num_mixed,
                      s.num_interior):
                add(t)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------- one rank
def rank_body(rank, world_size, data_path, warmup, iters, overlap):
    import torch.distributed as dist

    from gsplit import ops
    from gsplit.comm import communicator
    from gsplit.comm.communicator import Communicator
    from gsplit.sampling.batches import global_batches
    from gsplit.split import split_sampling

    import gsplit

    data = torch.load(data_path, weights_only=False)
    graph, owner, train = data["graph"], data["owner"], data["train"]
    sampler = gsplit.NeighborSampler(FANOUTS, seed=0)
    comm = Communicator()
    events = []  # (name, t0, t1)

    def timed(name, fn):
        def wrapper(*a, **k):
            c0, t0 = time.thread_time(), time.perf_counter()
            out = fn(*a, **k)
            events.append((name, t0, time.perf_counter(), c0, time.thread_time()))
            return out
        return wrapper

    ops.sample_neighbors = timed("sample", ops.sample_neighbors)
    ops.relabel = timed("relabel", ops.relabel)
    # the id exchange sp_sample calls, once per layer (exchange_ids_many since macrobatches; a tree from before
    # them calls exchange_ids)
    name = "exchange_ids_many" if hasattr(split_sampling, "exchange_ids_many") else "exchange_ids"
    setattr(split_sampling, name, timed("exchange", getattr(split_sampling, name)))
    split_sampling.plan_overlap = timed("plan", split_sampling.plan_overlap)
    communicator.Communicator._all_to_all = timed("a2a", communicator.Communicator._all_to_all)

    per_iter, digests, batch_ms, tail, cpu_ms = [], [], [], [], []
    seeds_list = list(global_batches(train, 1024 * world_size, 0, 0, drop_last=True))
    for it in range(warmup + iters):
        seeds = seeds_list[it % len(seeds_list)]
        targets = split_sampling.local_targets(seeds, owner, rank)
        dist.barrier()
        events.clear()
        c0, t0 = time.thread_time(), time.perf_counter()
        batch = split_sampling.sp_sample(graph, seeds, owner, sampler, comm, epoch=0, iteration=it,
                                         targets=targets, overlap=overlap)
        t1, c1 = time.perf_counter(), time.thread_time()
        digests.append(batch_digest(batch))
        if it >= warmup:
            batch_ms.append(1e3 * (t1 - t0))
            cpu_ms.append(1e3 * (c1 - c0))
            per_iter.append({"start": t0, "start_cpu": c0, "end": t1, "events": list(events)})
            last_exchange = max(e[2] for e in events if e[0] == "exchange")  # (name, t0, t1, cpu0, cpu1)
            tail.append((1e3 * (t1 - last_exchange), 1e3 * sum(e[2] - e[1] for e in events if e[0] == "plan")))
    sizes = [{"layer": b.layer, "dst": int(b.num_dst), "src": int(b.src_nodes.numel()), "edges": int(b.num_edges()),
              "ids_sent": list(b.shuffle_index.recv_counts), "ids_received": list(b.shuffle_index.send_counts)}
             for b in batch.blocks]  # the last batch's: rows this rank receives in the shuffle = ids it sent
    return {"rank": rank, "batch_ms": batch_ms, "iters": per_iter, "digests": digests, "sizes": sizes,
            "cpu_ms": statistics.median(cpu_ms), "after_ms": statistics.median(a for a, _ in tail),
            "plan_ms": statistics.median(p for _, p in tail)}


def layer_phases(ranks) -> dict:
    """Per rank and layer, the median ms of each phase (see the module's doc), from both ranks' timestamps."""
    world = len(ranks)
    num_layers = len(FANOUTS)
    out = {r: {f"L{layer}": {p: [] for p in PHASES} for layer in range(num_layers)} for r in range(world)}
    for i in range(len(ranks[0]["iters"])):
        layers = {}  # rank -> list per layer (top first) of dict
        for r in range(world):
            ev = ranks[r]["iters"][i]["events"]
            start, start_cpu = ranks[r]["iters"][i]["start"], ranks[r]["iters"][i]["start_cpu"]
            rows = []
            cur = None
            for name, t0, t1, c0, c1 in ev:
                if name == "sample" and (cur is None or "exchange" in cur):
                    cur = {"start": start if not rows else rows[-1]["exchange"][1], "sample": t1 - t0,
                           "start_cpu": start_cpu if not rows else rows[-1]["exchange_cpu"][1],
                           "relabel": 0.0, "a2a": 0.0, "a2a_cpu": 0.0, "a2a_enter": None}
                    rows.append(cur)
                elif name == "relabel" and "exchange" not in cur and cur.get("relabel_done") is None:
                    cur["relabel"] = t1 - t0
                    cur["relabel_done"] = True
                elif name == "a2a":
                    cur["a2a"] += t1 - t0
                    cur["a2a_cpu"] += c1 - c0
                    if cur["a2a_enter"] is None:
                        cur["a2a_enter"] = t0
                elif name == "exchange":
                    cur["exchange"] = (t0, t1)
                    cur["exchange_cpu"] = (c0, c1)
            layers[r] = rows
        for k in range(num_layers):
            enters = [layers[r][k]["a2a_enter"] for r in range(world)]
            for r in range(world):
                row = layers[r][k]
                layer = num_layers - 1 - k
                ex0, ex1 = row["exchange"]
                cx0, cx1 = row["exchange_cpu"]
                vals = {"sample": row["sample"], "relabel": row["relabel"], "before": ex0 - row["start"],
                        "exchange": ex1 - ex0, "a2a": row["a2a"],
                        "wait": max(0.0, max(enters) - enters[r]) if None not in enters else 0.0,
                        "around": ex1 - ex0 - row["a2a"], "before cpu": cx0 - row["start_cpu"],
                        "around cpu": cx1 - cx0 - row["a2a_cpu"]}
                for p in PHASES:
                    out[r][f"L{layer}"][p].append(1e3 * vals[p])
    return {r: {lay: {p: statistics.median(v) for p, v in ph.items()} for lay, ph in layers.items()}
            for r, layers in out.items()}


def worker(args) -> int:
    from gsplit.launcher import launch

    ranks = launch(rank_body, 2, args=(args.data, args.warmup, args.iters, args.overlap), devices="cpu")
    res = {"tree": os.environ.get("PYTHONPATH", ""), "batch_ms": [statistics.median(r["batch_ms"]) for r in ranks],
           "batch_ms_max_over_ranks": statistics.median(max(a, b) for a, b in zip(ranks[0]["batch_ms"],
                                                                                   ranks[1]["batch_ms"])),
           "layers": layer_phases(ranks), "digests": [r["digests"] for r in ranks],
           "sizes": [r["sizes"] for r in ranks],
           "cpu_ms": [r["cpu_ms"] for r in ranks], "after_ms": [r["after_ms"] for r in ranks],
           "plan_ms": [r["plan_ms"] for r in ranks], "load": report.load_average()}
    report.write_json(args.result, res)
    return 0


# ---------------------------------------------------------------------------------------- driver
def make_data(path: Path, nodes: int, seed: int) -> None:
    if path.exists():
        return
    ds = setup.load_named("synthetic", nodes, seed)
    pmap, _, _ = setup.make_map(ds, 2, "edge", FANOUTS, 1024, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"graph": ds.graph, "owner": pmap.assignment.long(), "train": ds.train_idx}, path)


def run_tree(tree: Path, args, data: Path, scratch: Path, tag: str) -> dict:
    cmd = [sys.executable, Path(__file__).resolve(), "--worker", "--data", data, "--warmup", args.warmup,
           "--iters", args.iters] + (["--overlap"] if args.overlap else [])
    return rounds.run_json(cmd, flag="--result", path=scratch / f"result_{tag}.json", env=rounds.checkout_env(tree))


def print_layers(label: str, res: dict) -> list:
    rows = []
    for r, layers in sorted(res["layers"].items()):
        for lay in sorted(layers, reverse=True):
            rows.append([label, r, lay] + [layers[lay][p] for p in PHASES])
    return rows


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_argument("--old", default=None, help="the other code tree to compare with (its root folder)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--overlap", action="store_true", help="sample with overlap=True (interior-first frontiers)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    nodes = 20_000 if args.quick else 100_000
    stem = report.output_stem(args, "bench_split_sampler")
    scratch = setup.scratch(args.out, "bench_split_sampler")
    data = scratch / f"synthetic_{nodes}_seed{args.seed}.pt"
    make_data(data, nodes, args.seed)
    trees = {"new": setup.REPO} if args.old is None else {"old": Path(args.old).resolve(), "new": setup.REPO}
    n_rounds = args.rounds if args.old else 1
    runs = {k: [] for k in trees}
    loads = []
    for rnd, order in rounds.orders(list(trees), n_rounds):
        for name in order:
            loads.append(report.load_average()[0])
            res = run_tree(trees[name], args, data, scratch, name)
            runs[name].append(res)
            print(f"round {rnd}: {name}: ms per batch (rank 0, rank 1, max) "
                  f"{res['batch_ms'][0]:.1f} {res['batch_ms'][1]:.1f} {res['batch_ms_max_over_ranks']:.1f} "
                  f"(load {loads[-1]:.2f})", flush=True)
    summary = {}
    for name, rs in runs.items():
        summary[name] = {"batch_ms_rank": [statistics.median(r["batch_ms"][k] for r in rs) for k in range(2)],
                         "batch_ms_max": statistics.median(r["batch_ms_max_over_ranks"] for r in rs),
                         "per_round_max": [r["batch_ms_max_over_ranks"] for r in rs]}
        summary[name]["cpu_ms_rank"] = [statistics.median(r["cpu_ms"][k] for r in rs) for k in range(2)]
        summary[name]["after_last_exchange_ms"] = [statistics.median(r["after_ms"][k] for r in rs) for k in range(2)]
        summary[name]["plan_overlap_ms"] = [statistics.median(r["plan_ms"][k] for r in rs) for k in range(2)]
    rows = [[name, s["batch_ms_rank"][0], s["batch_ms_rank"][1], s["batch_ms_max"],
             s["batch_ms_max"] / summary[list(trees)[0]]["batch_ms_max"], s["cpu_ms_rank"][0], s["cpu_ms_rank"][1],
             sum(s["cpu_ms_rank"]) / sum(summary[list(trees)[0]]["cpu_ms_rank"]), max(s["after_last_exchange_ms"]),
             max(s["plan_overlap_ms"])] for name, s in summary.items()]
    table = report.format_table(["tree", "rank 0 ms/batch", "rank 1 ms/batch", "max over ranks ms",
                                 f"ratio to {list(trees)[0]}", "rank 0 thread CPU ms", "rank 1 thread CPU ms",
                                 "CPU ratio", "after last exchange ms", "of which plan_overlap ms"],
                                rows, ".2f")
    identical = None
    if args.old:
        identical = all(a["digests"] == b["digests"] for a, b in zip(runs["old"], runs["new"]))
    # per-layer phases: the median over rounds of each round's medians
    layer_rows = []
    for name, rs in runs.items():
        merged = {r: {lay: {ph: statistics.median(x["layers"][str(r)][lay][ph] for x in rs) for ph in PHASES}
                      for lay in rs[0]["layers"][str(r)]} for r in range(2)}
        summary[name]["layers"] = merged
        layer_rows += print_layers(name, {"layers": merged})
    layer_table = report.format_table(["tree", "rank", "layer"] + [f"{p} ms" for p in PHASES], layer_rows, ".2f")
    print(f"\nsplit sampling, synthetic {nodes:,}, 2 ranks, fanouts {FANOUTS}, 1024 targets per rank, "
          f"{args.iters} iterations x {n_rounds} round(s), medians; load average {min(loads):.2f}-{max(loads):.2f}")
    print(table)
    if identical is not None:
        print(f"every batch identical in both trees: {identical}")
    for r, blocks in enumerate(runs["new"][0]["sizes"]):
        print(f"rank {r}, last batch: " + "; ".join(
            f"L{b['layer']} dst {b['dst']:,} src {b['src']:,} edges {b['edges']:,} ids sent {b['ids_sent']}"
            for b in reversed(blocks)))
    print("\nper layer (L2 first), median ms")
    print(layer_table)
    report.save_json(stem, {"experiment": "split sampling alone, 2 ranks (issue 20)", "nodes": nodes,
                            "fanouts": FANOUTS, "iters": args.iters, "rounds": n_rounds, "overlap": args.overlap,
                            "trees": {k: str(v) for k, v in trees.items()}, "loads": loads,
                            "identical_batches": identical, "summary": summary, "table": table,
                            "layer_table": layer_table,
                            "sizes_last_batch": runs["new"][0]["sizes"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
