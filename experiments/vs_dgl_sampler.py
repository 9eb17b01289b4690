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

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import numpy as np
import torch

import gsplit
from bench_sampler import uniform_graph
from gsplit.datasets import random_split, synthetic_graph
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


def make_graph(name: str, nodes: int, edges: int, seed: int):
    if name == "uniform":
        return uniform_graph(nodes, edges, seed)
    if name == "synthetic":
        return synthetic_graph(nodes, avg_degree=edges / nodes, seed=seed)[0]
    raise SystemExit(f"--graphs: unknown graph {name!r}; use uniform and/or synthetic")


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


def export(graph, batches: torch.Tensor, folder: Path, meta: dict) -> Path:
    """Write ``indptr``, ``indices`` and ``batches`` as ``.npy`` for the DGL side (reused when identical)."""
    if (folder / "meta.json").exists() and json.loads((folder / "meta.json").read_text()) == meta:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "indptr.npy", graph.indptr.numpy())
    np.save(folder / "indices.npy", graph.indices.numpy())
    np.save(folder / "batches.npy", batches.numpy())
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))  # last: marks a complete export
    return folder


def time_gsplit(graph, batches: torch.Tensor, fanouts, warmup: int, threads: int, seed: int) -> dict:
    torch.set_num_threads(threads)
    sampler = gsplit.NeighborSampler(fanouts, seed=seed)
    times, edges, inputs = [], [], []
    for it, seeds in enumerate(batches):
        t = time.perf_counter()
        blocks = blocks_of(sampler.sample_blocks(graph, seeds, epoch=0, iteration=it))
        dt = time.perf_counter() - t
        if it >= warmup:
            times.append(dt)
            edges.append(sum(int(b.num_edges()) for b in blocks))
            inputs.append(int(blocks[0].num_src_nodes()))
    med = statistics.median(times)
    return {"sampler": "gsplit", "threads": threads, "num_batches": len(times), "ms_per_batch": 1e3 * med,
            "ms_mean": 1e3 * statistics.fmean(times), "ms_min": 1e3 * min(times),
            "edges_per_batch": statistics.fmean(edges), "input_nodes_per_batch": statistics.fmean(inputs),
            "ms_all": [1e3 * x for x in times]}


def time_dgl(folder: Path, args, rnd: int, name: str) -> dict:
    out = folder / f"dgl-r{rnd}.json"
    cmd = [args.dgl_python, common.REPO / "experiments" / "dgl_sampler_peer.py", "--data", folder, "--json", out,
           "--fanouts", args.fanouts, "--warmup", args.warmup, "--threads", args.threads, "--seed", args.seed]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.run([str(c) for c in cmd], cwd=common.REPO, env=env, capture_output=True, text=True,
                          timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"exit status {proc.returncode} of {' '.join(map(str, cmd))}:\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(out.read_text())


def main(argv=None) -> int:
    p = common.make_parser(__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=0, help="default 1000000; quick 100000")
    p.add_argument("--edges", type=int, default=0, help="directed edges, default 20 x nodes")
    p.add_argument("--graphs", default="uniform,synthetic")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batches", type=int, default=0, help="timed batches (default 20; quick 10)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="threads of both samplers")
    p.add_argument("--rounds", type=int, default=1, help="gsplit/DGL alternations per graph")
    p.add_argument("--dgl-python", default=str(common.REPO / ".venv-dgl" / "bin" / "python"),
                   help="interpreter of the DGL venv (./dev dgl-env builds it)")
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args(argv)
    if not Path(args.dgl_python).exists():
        raise SystemExit(f"{args.dgl_python} does not exist; build the DGL venv with ./dev dgl-env "
                         "(or pass --dgl-python)")
    nodes = args.nodes or (100_000 if args.quick else 1_000_000)
    edges = args.edges or 20 * nodes
    args.batches = args.batches or (10 if args.quick else 20)
    fanouts = [int(x) for x in args.fanouts.split(",")]
    stem = common.output_stem(args, "vs_dgl_sampler")
    scratch = Path(args.out) / "scratch" / "vs_dgl_sampler"

    results = []
    for name in args.graphs.split(","):
        t = time.perf_counter()
        graph = make_graph(name, nodes, edges, args.seed)
        batches = seed_batches(nodes, args.batch_size, args.warmup + args.batches, args.seed)
        meta = {"graph": name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges, "seed": args.seed,
                "batches": list(batches.shape)}
        folder = export(graph, batches, scratch / f"{name}-n{nodes}-e{edges}-s{args.seed}", meta)
        print(f"{name}: {graph.num_nodes:,} vertices, {graph.num_edges:,} edges, max in-degree "
              f"{int(graph.in_degrees().max()):,}; made and exported in {time.perf_counter() - t:.1f}s", flush=True)
        runs = {"gsplit": [], "dgl": []}
        for rnd in range(args.rounds):
            for who in (("gsplit", "dgl") if rnd % 2 == 0 else ("dgl", "gsplit")):
                r = (time_gsplit(graph, batches, fanouts, args.warmup, args.threads, args.seed) if who == "gsplit"
                     else time_dgl(folder, args, rnd, name))
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
    table = common.format_table(["graph", "vertices / edges", "sampler", "threads", "ms/batch (median)", "ms (min)",
                                 "edges/batch", "input vertices/batch", "DGL ms / this ms"], rows, ".1f")
    print(f"\nbatch {args.batch_size}, fanouts {fanouts}, median of {args.batches} batches after {args.warmup} "
          f"warm-up, {args.rounds} round(s); DGL {'fused' if results and results[0]['dgl']['fused'] else 'per-layer'} "
          "CPU sampler")
    print(table)
    common.save_json(stem, {"experiment": "sampler: gsplit vs DGL (issue 10)", "batch_size": args.batch_size,
                            "fanouts": fanouts, "threads": args.threads, "warmup": args.warmup,
                            "timed_batches": args.batches, "rounds": args.rounds,
                            "dgl": results[0]["runs"]["dgl"][0]["dgl"] if results else None,
                            "results": results, "table": table})
    fig, axes = common.figure(len(results))
    for ax, res in zip(axes, results):
        common.bar_panel(ax, ["gsplit", "DGL"], {"median ms per mini-batch": [res["gsplit"]["ms_per_batch"],
                                                                             res["dgl"]["ms_per_batch"]]},
                         "ms per mini-batch", f"{res['graph']}: {res['num_nodes']:,} v, {res['num_edges']:,} e")
    common.save_figure(fig, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
