"""Issue 10: gsplit's 3-layer neighbour sampler against DGL's, same graphs, same seed batches, same threads.

Graphs as in ``bench_sampler.py``: a symmetric uniform random graph and gsplit's power-law synthetic
graph with planted communities, each 1M vertices and ~20M directed edges (``--quick``: 100k / ~2M).
Seed batches: ``--batch-size`` (1024) targets of a seeded random 60 % of the vertices, in the order of
gsplit's global batches of epoch 0; ``--warmup`` (2) batches untimed, then ``--batches`` (20; quick 10)
timed. Both samplers run with ``--threads`` (2) threads, fanouts 15,10,5 (input layer first):

* ``gsplit``: ``gsplit.NeighborSampler(fanouts).sample_blocks(graph, seeds, epoch, iteration)``, in
  this process (the project's venv);
* ``dgl``: ``dgl.dataloading.NeighborSampler(fanouts).sample_blocks(g, seeds)`` in
  ``experiments/dgl_sampler_peer.py`` under ``.venv-dgl`` (``./dev dgl-env``), on the same graph exported
  once as ``.npy`` files with the batches (``OUT/scratch/vs_dgl_sampler/``, git-ignored).

Each ``--rounds`` round times gsplit then DGL (reversed on odd rounds); reported: median ms per batch
(median over rounds of each round's median), edges per batch (both sample without replacement, so
the counts agree closely: a check that the two do the same work).

    ./dev dgl-env
    python experiments/vs_dgl_sampler.py --quick
    python experiments/vs_dgl_sampler.py
"""

from __future__ import annotations

import statistics
import sys
import time

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

import gsplit
from bench_sampler import make_graph
from gsplit.datasets import random_split
from gsplit.sampling.batches import global_batches


def blocks_of(out) -> list:
    """The blocks of a ``sample_blocks`` result: a list of blocks, an ``(input_nodes, output_nodes, blocks)``
    triple, or a record with a ``blocks`` field (gsplit's return type is changing to the DGL-style triple)."""
    if hasattr(out, "blocks"):
        return list(out.blocks)
    seq = list(out)
    if seq and all(hasattr(b, "num_edges") for b in seq):
        return seq
    if len(seq) == 3 and isinstance(seq[2], (list, tuple)):
        return list(seq[2])
    raise TypeError(f"sample_blocks returned {type(out).__name__}, neither a list of blocks nor an "
                    "(input_nodes, output_nodes, blocks) triple")


def seed_batches(nodes: int, batch_size: int, count: int, seed: int) -> torch.Tensor:
    """``count`` full batches of a seeded random 60 % of the vertices, as ``bench_sampler.py`` draws them."""
    targets = random_split(nodes, (0.6, 0.2, 0.2), seed=seed)[0]
    out, epoch = [], 0
    while len(out) < count:
        got = list(global_batches(targets, batch_size, seed, epoch, drop_last=True))
        if not got:
            raise SystemExit(f"{targets.numel()} targets hold no full batch of {batch_size}; lower --batch-size")
        out += got
        epoch += 1
    return torch.stack(out[:count])


def time_gsplit(graph, batches: torch.Tensor, fanouts, warmup: int, threads: int, seed: int) -> dict:
    torch.set_num_threads(threads)
    sampler = gsplit.NeighborSampler(fanouts, seed=seed)

    def sample(it, seeds):
        blocks = blocks_of(sampler.sample_blocks(graph, seeds, epoch=0, iteration=it))
        return blocks, blocks[0].num_src_nodes()

    return {"sampler": "gsplit", "threads": threads, **rounds.time_batches(sample, batches, warmup)}


def time_dgl(folder, args, rnd: int) -> dict:
    cmd = [args.dgl_python, setup.REPO / "experiments" / "dgl_sampler_peer.py", "--data", folder,
           "--fanouts", args.fanouts, "--warmup", args.warmup, "--threads", args.threads, "--seed", args.seed]
    return rounds.run_json(cmd, path=folder / f"dgl-r{rnd}.json", capture=True, timeout=args.timeout, cwd=setup.REPO,
                           env=rounds.peer_env(OMP_NUM_THREADS=str(args.threads)))


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_sized("--nodes", quick=100_000, full=1_000_000, type=int, help="default 1000000; quick 100000")
    p.add_argument("--edges", type=int, default=0, help="directed edges, default 20 x nodes")
    p.add_argument("--graphs", default="uniform,synthetic")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_sized("--batches", quick=10, full=20, type=int, help="timed batches (default 20; quick 10)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="threads of both samplers")
    p.add_argument("--rounds", type=int, default=1, help="gsplit/DGL alternations per graph")
    setup.add_dgl_python(p)
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args(argv)
    setup.check_python(args.dgl_python)
    nodes = args.nodes
    edges = args.edges or 20 * nodes
    fanouts = setup.int_list(args.fanouts)
    stem = report.output_stem(args, "vs_dgl_sampler")
    scratch = setup.scratch(args.out, "vs_dgl_sampler")

    results = []
    for name in args.graphs.split(","):
        t = time.perf_counter()
        graph = make_graph(name, nodes, edges, args.seed)
        batches = seed_batches(nodes, args.batch_size, args.warmup + args.batches, args.seed)
        meta = {"graph": name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges, "seed": args.seed,
                "batches": list(batches.shape)}
        folder = setup.export_arrays(scratch / f"{name}-n{nodes}-e{edges}-s{args.seed}",
                                     {"indptr": graph.indptr, "indices": graph.indices, "batches": batches}, meta)
        print(f"{name}: {graph.num_nodes:,} vertices, {graph.num_edges:,} edges, max in-degree "
              f"{int(graph.in_degrees().max()):,}; made and exported in {time.perf_counter() - t:.1f}s", flush=True)
        runs = {"gsplit": [], "dgl": []}
        for rnd, order in rounds.orders(["gsplit", "dgl"], args.rounds):
            for who in order:
                r = (time_gsplit(graph, batches, fanouts, args.warmup, args.threads, args.seed) if who == "gsplit"
                     else time_dgl(folder, args, rnd))
                runs[who].append(r)
                print(f"  round {rnd} {who:>6}: {r['ms_per_batch']:.1f} ms/batch (min {r['ms_min']:.1f}), "
                      f"{r['edges_per_batch']:,.0f} edges/batch", flush=True)
        torch.set_num_threads(args.threads)
        res = {**meta, "max_in_degree": int(graph.in_degrees().max()), "runs": runs}
        for who, rs in runs.items():
            res[who] = {"ms_per_batch": statistics.median(r["ms_per_batch"] for r in rs),
                        "ms_min": min(r["ms_min"] for r in rs),
                        "edges_per_batch": statistics.fmean(r["edges_per_batch"] for r in rs),
                        "input_nodes_per_batch": statistics.fmean(r["input_nodes_per_batch"] for r in rs)}
        res["dgl"]["fused"] = runs["dgl"][0]["fused"]
        results.append(res)
        del graph

    rows = []
    for res in results:
        for who in ("gsplit", "dgl"):
            r = res[who]
            rows.append([res["graph"], f"{res['num_nodes']:,} / {res['num_edges']:,}", who, args.threads,
                         r["ms_per_batch"], r["ms_min"], round(r["edges_per_batch"]),
                         round(r["input_nodes_per_batch"]), res["dgl"]["ms_per_batch"] / r["ms_per_batch"]])
    table = report.format_table(["graph", "vertices / edges", "sampler", "threads", "ms/batch (median)", "ms (min)",
                                 "edges/batch", "input vertices/batch", "DGL ms / this ms"], rows, ".1f")
    print(f"\nbatch {args.batch_size}, fanouts {fanouts}, median of {args.batches} batches after {args.warmup} "
          f"warm-up, {args.rounds} round(s); DGL {'fused' if results and results[0]['dgl']['fused'] else 'per-layer'} "
          "CPU sampler")
    print(table)
    report.save_json(stem, {"experiment": "sampler: gsplit vs DGL (issue 10)", "batch_size": args.batch_size,
                            "fanouts": fanouts, "threads": args.threads, "warmup": args.warmup,
                            "timed_batches": args.batches, "rounds": args.rounds,
                            "dgl": results[0]["runs"]["dgl"][0]["dgl"] if results else None,
                            "results": results, "table": table})
    fig, axes = report.figure(len(results))
    for ax, res in zip(axes, results):
        report.bar_panel(ax, ["gsplit", "DGL"], {"median ms per mini-batch": [res["gsplit"]["ms_per_batch"],
                                                                             res["dgl"]["ms_per_batch"]]},
                         "ms per mini-batch", f"{res['graph']}: {res['num_nodes']:,} v, {res['num_edges']:,} e")
    report.save_figure(fig, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
