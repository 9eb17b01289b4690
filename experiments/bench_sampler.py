"""Issue 2's sampler benchmark: time per 3-layer mini-batch, and the offline pre-sampling + partitioning time.

Graph: a uniform random graph (the kind the issue's DGL figure is for) and the power-law synthetic
graph with planted communities, each with 1M vertices and ~20M directed edges (symmetric); ``--quick``
uses 100k vertices and ~2M edges. Targets: a seeded random 60% of the vertices. Mini-batches of 1024
targets, fanouts 15,10,5, median time of ``--batches`` batches after 2 warm-up batches
(:func:`gsplit.sampling.bench.time_sampler`).

Compared in the same run, on the same batches:

* ``gsplit`` sampler (counter-based, Floyd's algorithm per vertex, vectorised in torch) with 1 and
  2 torch threads;
* a baseline that is the usual simple vectorised way to sample without replacement: expand every
  in-edge of the frontier, give each a random key, sort by (destination, key) and keep the first
  ``fanout`` of each destination; same relabelling into blocks.

The DGL reference (~77 ms per batch on a 2-core machine for a uniform random graph of this size) is
the issue's figure, quoted, not measured here: DGL is not installed.

    python experiments/bench_sampler.py --quick
"""

from __future__ import annotations

import sys
import time

import common  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

import gsplit
from gsplit.datasets import random_split, synthetic_graph
from gsplit.sampling.bench import time_sampler
from gsplit.sampling.block import Block
from gsplit.ops import relabel

DGL_REFERENCE_MS = 77.0
"""The issue's figure for DGL on a 1M-vertex / 20M-edge uniform random graph, 2 cores (not measured here)."""


class SortKeySampler:
    """Baseline: sample without replacement by sorting random keys of all candidate edges per destination."""

    def __init__(self, fanouts, seed: int = 0):
        self.fanouts = list(fanouts)
        self.gen = torch.Generator().manual_seed(seed)

    def sample_blocks(self, graph, seeds, epoch: int = 0, iteration: int = 0):
        del epoch, iteration  # a stateful generator: not reproducible per batch, which the baseline need not be
        frontier = seeds
        blocks = []
        for layer in reversed(range(len(self.fanouts))):
            k = self.fanouts[layer]
            start = graph.indptr[frontier]
            deg = graph.indptr[frontier + 1] - start
            total = int(deg.sum())
            dst = torch.repeat_interleave(torch.arange(frontier.numel()), deg, output_size=total)
            seg_start = torch.cumsum(deg, 0) - deg
            eids = start[dst] + (torch.arange(total) - seg_start[dst])
            keys = dst.to(torch.float64) + torch.rand(total, generator=self.gen, dtype=torch.float64)
            order = torch.argsort(keys)        # grouped by destination (integer part), random inside
            keep = (torch.arange(total) - seg_start[dst]) < k   # dst is unchanged by the sort: same groups
            picked = eids[order][keep]
            edge_dst = dst[keep]
            src_nodes, src_local = relabel(frontier, graph.indices[picked])
            blocks.append(Block(src_nodes=src_nodes, num_dst=frontier.numel(), edge_src=src_local,
                                edge_dst=edge_dst, edge_ids=picked, layer=layer))
            frontier = src_nodes
        blocks.reverse()
        return blocks


def uniform_graph(num_nodes: int, num_edges: int, seed: int) -> gsplit.Graph:
    """Symmetric uniform random graph with about ``num_edges`` directed edges (``num_edges / 2`` random pairs)."""
    g = torch.Generator().manual_seed(seed)
    m = num_edges // 2
    src = torch.randint(num_nodes, (m,), generator=g)
    dst = torch.randint(num_nodes, (m,), generator=g)
    return gsplit.Graph.from_edges(src, dst, num_nodes, symmetric=True, remove_self_loops=True)


def bench_graph(name: str, graph, targets, args, fanouts) -> dict:
    res = {"graph": name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
           "max_in_degree": int(graph.in_degrees().max()), "targets": int(targets.numel()), "runs": []}
    for label, sampler, threads in (("gsplit", gsplit.NeighborSampler(fanouts, seed=args.seed), 1),
                                    ("gsplit", gsplit.NeighborSampler(fanouts, seed=args.seed), 2),
                                    ("sort-key baseline", SortKeySampler(fanouts, seed=args.seed), 1),
                                    ("sort-key baseline", SortKeySampler(fanouts, seed=args.seed), 2)):
        torch.set_num_threads(threads)
        r = time_sampler(graph, targets, sampler, args.batch_size, num_batches=args.batches, seed=args.seed)
        r.update(sampler=label, threads=threads)
        res["runs"].append(r)
        print(f"  {name}: {label}, {threads} thread(s): {r['ms_per_batch']:.1f} ms/batch "
              f"({r['edges_per_batch']:,.0f} edges)", flush=True)
    torch.set_num_threads(args.threads)
    if not args.skip_partition:
        sampler = gsplit.NeighborSampler(fanouts, seed=args.seed)
        t0 = time.perf_counter()
        weights = gsplit.presample(graph, targets, sampler, batch_size=args.batch_size * args.parts,
                                   epochs=args.presample_epochs, seed=args.seed)
        t1 = time.perf_counter()
        pmap = gsplit.partition(graph, args.parts, method="gsplit", weights=weights)
        t2 = time.perf_counter()
        res["offline"] = {"parts": args.parts, "presample_epochs": args.presample_epochs,
                          "presample_batches": weights.num_batches, "presample_s": t1 - t0,
                          "presample_ms_per_batch": 1e3 * (t1 - t0) / weights.num_batches,
                          "partition_s": t2 - t1, "total_s": t2 - t0, "threads": args.threads,
                          "part_sizes": pmap.part_sizes().tolist(), "metis": pmap.metadata}
        print(f"  {name}: presample {args.presample_epochs} epoch(s) ({weights.num_batches} batches of "
              f"{args.batch_size * args.parts}) {t1 - t0:.1f}s + partition into {args.parts} {t2 - t1:.1f}s",
              flush=True)
    return res


def main(argv=None) -> int:
    p = common.make_parser(__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=0, help="default 100000 quick, 1000000 full")
    p.add_argument("--edges", type=int, default=0, help="directed edges, default 20 x nodes")
    p.add_argument("--graphs", default="uniform,synthetic")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batches", type=int, default=0, help="timed batches (default 10 quick, 20 full)")
    p.add_argument("--threads", type=int, default=2, help="threads for pre-sampling and partitioning")
    p.add_argument("--parts", type=int, default=2, help="parts of the partition map (world size)")
    p.add_argument("--presample-epochs", type=int, default=1)
    p.add_argument("--skip-partition", action="store_true")
    args = p.parse_args(argv)
    nodes = args.nodes or (100_000 if args.quick else 1_000_000)
    edges = args.edges or 20 * nodes
    args.batches = args.batches or (10 if args.quick else 20)
    fanouts = [int(x) for x in args.fanouts.split(",")]
    stem = common.output_stem(args, "bench_sampler")
    torch.set_num_threads(args.threads)

    results = []
    for name in args.graphs.split(","):
        t = time.perf_counter()
        if name == "uniform":
            graph = uniform_graph(nodes, edges, args.seed)
        elif name == "synthetic":
            graph, _ = synthetic_graph(nodes, avg_degree=edges / nodes, seed=args.seed)
        else:
            raise ValueError(f"unknown graph {name!r}; use uniform and/or synthetic")
        targets = random_split(nodes, (0.6, 0.2, 0.2), seed=args.seed)[0]
        print(f"{name}: {graph.num_nodes:,} vertices, {graph.num_edges:,} edges, generated in "
              f"{time.perf_counter() - t:.1f}s", flush=True)
        results.append(bench_graph(name, graph, targets, args, fanouts))
        del graph

    rows = []
    for res in results:
        base = {r["threads"]: r["ms_per_batch"] for r in res["runs"] if r["sampler"] != "gsplit"}
        for r in res["runs"]:
            rows.append([res["graph"], f"{res['num_nodes']:,} / {res['num_edges']:,}", r["sampler"], r["threads"],
                         r["ms_per_batch"], r["ms_min"], round(r["edges_per_batch"]),
                         base[r["threads"]] / r["ms_per_batch"]])
    table = common.format_table(["graph", "vertices / edges", "sampler", "threads", "ms/batch (median)", "ms (min)",
                                 "edges/batch", "baseline/this"], rows, ".1f")
    off_rows = [[r["graph"], r["offline"]["presample_epochs"], r["offline"]["presample_batches"],
                 r["offline"]["presample_s"], r["offline"]["presample_ms_per_batch"], r["offline"]["partition_s"],
                 r["offline"]["total_s"]] for r in results if "offline" in r]
    off_table = common.format_table(["graph", "presample epochs", "batches", "presample s", "ms/batch",
                                     f"METIS ({args.parts} parts) s", "total s"], off_rows, ".1f")
    print(f"\nbatch {args.batch_size}, fanouts {fanouts}, median of {args.batches} batches; "
          f"DGL reference from the issue (not measured here): ~{DGL_REFERENCE_MS:.0f} ms/batch, 2 cores, uniform graph")
    print(table)
    if off_rows:
        print(f"\noffline half ({args.threads} threads)")
        print(off_table)
    common.save_json(stem, {"experiment": "sampler benchmark (issue 2)", "batch_size": args.batch_size,
                            "fanouts": fanouts, "dgl_reference_ms_quoted_from_issue": DGL_REFERENCE_MS,
                            "results": results, "table": table, "offline_table": off_table})
    fig, axes = common.figure(len(results))
    for ax, res in zip(axes, results):
        labels = ["\n".join(r["sampler"].split() + [f"{r['threads']} thr"]) for r in res["runs"]]
        common.bar_panel(ax, labels, {"median ms per mini-batch": [r["ms_per_batch"] for r in res["runs"]]},
                         "ms per mini-batch", f"{res['graph']}: {res['num_nodes']:,} v, {res['num_edges']:,} e")
        if res["graph"] == "uniform" and res["num_nodes"] >= 1_000_000:
            ax.axhline(DGL_REFERENCE_MS, color="gray", linestyle="--", label="DGL, issue's figure (not measured)")
            ax.legend(fontsize=7)
    common.save_figure(fig, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
