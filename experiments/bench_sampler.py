"""Sampler benchmark (issues 2 and 10): time per 3-layer mini-batch, compiled sampler vs plain torch, same run.

Graphs: a uniform random graph and the power-law synthetic graph with planted communities, each with
1M vertices and ~20M directed edges (symmetric); ``--quick`` uses 100k vertices and ~2M edges.
Targets: a seeded random 60% of the vertices. Mini-batches of 1024 targets, fanouts 15,10,5, ``--threads``
torch threads (default 2), ``--batches`` timed batches after 2 warm-up batches.

Compared in the same run, batch by batch on the same seeds (alternating which goes first, so both see
the same load from other jobs), with ``NeighborSampler.sample`` (sample + relabel per layer):

* ``C++`` -- gsplit with its compiled CPU sampler and relabel (``kernels/sample_cpu.cpp``), what
  ``gsplit.ops`` runs when the extension builds;
* ``torch`` -- the same sampler with ``GSPLIT_NO_EXTENSIONS=1`` (the plain-torch fallback,
  :mod:`gsplit.ops.torch_ops`); both give identical mini-batches, which the script checks;
* with ``--sort-key-baseline``: the usual simple vectorised way to sample without replacement: expand
  every in-edge of the frontier, give each a random key, sort by (destination, key) and keep the first
  ``fanout`` of each destination; same relabelling into blocks.

Reported per sampler: median and minimum wall ms per batch, median CPU ms per batch (all threads; less
sensitive to other jobs than wall time), and torch / C++ ratios. DGL's figures for the same graphs are
issue 10's (59 / 46 ms per batch, 2 cores, quiet machine), quoted, not measured here; the side-by-side
DGL benchmark is a separate script.

    python experiments/bench_sampler.py --quick
    python experiments/bench_sampler.py --skip-partition     # the README's table
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from types import SimpleNamespace

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

import gsplit
from gsplit.datasets import random_split, synthetic_graph
from gsplit import ops
from gsplit.ops import relabel, sample_cpu
from gsplit.sampling.batches import global_batches
from gsplit.sampling.block import Block

DGL_MS = {"uniform": 59.0, "synthetic": 46.0}
"""Issue 10's figures for DGL's CPU sampler on these 1M-vertex / 20M-edge graphs, 2 cores, quiet machine
(quoted, not measured here)."""
LAYER_COLUMNS = ["L0 sample", "L0 relabel", "L1 sample", "L1 relabel", "L2 sample", "L2 relabel", "batch"]
"""Steps of the ``--layers`` table (L0 is the input layer; the loop runs from L2 down)."""
ISSUE_GSPLIT_MS = {"uniform": 137.0, "synthetic": 115.0}
"""Issue 10's figures for gsplit's torch sampler on the same graphs when the issue was written."""


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


def make_graph(name: str, nodes: int, edges: int, seed: int) -> gsplit.Graph:
    """The benchmark's graphs: ``uniform`` (:func:`uniform_graph`) or ``synthetic`` (power law, communities)."""
    if name == "uniform":
        return uniform_graph(nodes, edges, seed)
    if name == "synthetic":
        return synthetic_graph(nodes, avg_degree=edges / nodes, seed=seed)[0]
    raise SystemExit(f"--graphs: unknown graph {name!r}; use uniform and/or synthetic")


@contextlib.contextmanager
def torch_kernels_only():
    """Run gsplit's plain-torch kernels inside the block (the documented ``GSPLIT_NO_EXTENSIONS`` switch)."""
    before = os.environ.get("GSPLIT_NO_EXTENSIONS")
    os.environ["GSPLIT_NO_EXTENSIONS"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["GSPLIT_NO_EXTENSIONS"]
        else:
            os.environ["GSPLIT_NO_EXTENSIONS"] = before


def time_interleaved(graph, targets, runners: dict, batch_size: int, num_batches: int, seed: int, warmup: int = 2):
    """Wall and CPU seconds per batch of every runner, batch by batch on the same seeds, alternating the order."""
    wall = {k: [] for k in runners}
    cpu = {k: [] for k in runners}
    edges = {k: [] for k in runners}
    same = True
    it, epoch = 0, 0
    while len(next(iter(wall.values()))) < num_batches:
        for seeds in global_batches(targets, batch_size, seed, epoch, drop_last=True):
            outs = {}
            for name in rounds.alternate(list(runners), it):
                out, dw, dc = rounds.timed_call(runners[name], seeds, epoch, it)
                outs[name] = out
                if it >= warmup:
                    wall[name].append(dw)
                    cpu[name].append(dc)
                    edges[name].append(sum(b.num_edges() for b in out.blocks))
            if "C++" in outs and "torch" in outs:
                same &= all(torch.equal(a.edge_ids, b.edge_ids) and torch.equal(a.src_nodes, b.src_nodes)
                            for a, b in zip(outs["C++"].blocks, outs["torch"].blocks))
            it += 1
            if len(next(iter(wall.values()))) == num_batches:
                break
        epoch += 1
    res = {}
    for name in runners:
        res[name] = {"ms_per_batch": 1e3 * statistics.median(wall[name]), "ms_min": 1e3 * min(wall[name]),
                     "cpu_ms_per_batch": 1e3 * statistics.median(cpu[name]),
                     "edges_per_batch": statistics.fmean(edges[name]), "num_batches": num_batches}
    return res, same


def layer_profile(graph, targets, sampler, batch_size: int, num_batches: int, seed: int) -> dict:
    """Median CPU ms per layer of sampling and of relabelling, for both implementations (``--layers``).

    Runs the layer loop of ``NeighborSampler.sample_layers`` step by step through ``gsplit.ops``, one
    batch at a time under each implementation, and times each step with the process CPU clock.
    """
    cpu = {"C++": {}, "torch": {}}
    batches = [b for _, b in zip(range(num_batches + 2), global_batches(targets, batch_size, seed, 0, drop_last=True))]
    for it, seeds in enumerate(batches):
        for name in ("C++", "torch"):
            with (torch_kernels_only() if name == "torch" else contextlib.nullcontext()):
                frontier = seeds
                total = time.process_time()
                for layer in reversed(range(sampler.num_layers)):
                    t0 = time.process_time()
                    picked = sampler.sample_neighbors(graph, frontier, layer, 0, it)
                    t1 = time.process_time()
                    frontier, _ = ops.relabel(frontier, picked.src, graph.num_nodes)
                    t2 = time.process_time()
                    if it >= 2:
                        cpu[name].setdefault(f"L{layer} sample", []).append(t1 - t0)
                        cpu[name].setdefault(f"L{layer} relabel", []).append(t2 - t1)
                if it >= 2:
                    cpu[name].setdefault("batch", []).append(time.process_time() - total)
    return {name: {k: 1e3 * statistics.median(v) for k, v in steps.items()} for name, steps in cpu.items()}


def bench_graph(name: str, graph, targets, args, fanouts) -> dict:
    res = {"graph": name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
           "max_in_degree": int(graph.in_degrees().max()), "targets": int(targets.numel()), "threads": args.threads}
    sampler = gsplit.NeighborSampler(fanouts, seed=args.seed)

    def torch_run(seeds, epoch, it):
        with torch_kernels_only():
            return sampler.sample(graph, seeds, epoch, it)

    runners = {"C++": lambda seeds, epoch, it: sampler.sample(graph, seeds, epoch, it), "torch": torch_run}
    if args.sort_key_baseline:
        base = SortKeySampler(fanouts, seed=args.seed)
        runners["sort-key baseline"] = lambda seeds, epoch, it: SimpleNamespace(blocks=base.sample_blocks(graph, seeds))
    torch.set_num_threads(args.threads)
    runs, same = time_interleaved(graph, targets, runners, args.batch_size, args.batches, args.seed)
    res["runs"] = runs
    res["identical_mini_batches"] = same
    for label, r in runs.items():
        print(f"  {name}: {label}: {r['ms_per_batch']:.1f} ms/batch (min {r['ms_min']:.1f}, CPU {r['cpu_ms_per_batch']:.1f}) "
              f"({r['edges_per_batch']:,.0f} edges)", flush=True)
    print(f"  {name}: C++ and torch mini-batches identical: {same}", flush=True)
    if args.layers:
        res["layer_cpu_ms"] = layer_profile(graph, targets, sampler, args.batch_size, args.batches, args.seed)
        for label, steps in res["layer_cpu_ms"].items():
            print(f"  {name}: {label} CPU ms: " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items()), flush=True)
    if not args.skip_partition:
        t0 = time.perf_counter()
        weights = gsplit.presample(graph, targets, sampler, batch_size=args.batch_size, num_parts=args.parts,
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
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_sized("--nodes", quick=100_000, full=1_000_000, type=int, help="default 100000 quick, 1000000 full")
    p.add_argument("--edges", type=int, default=0, help="directed edges, default 20 x nodes")
    p.add_argument("--graphs", default="uniform,synthetic")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5", type=setup.int_list)
    p.add_sized("--batches", quick=10, full=20, type=int, help="timed batches (default 10 quick, 20 full)")
    p.add_argument("--threads", type=int, default=2, help="torch threads for sampling, pre-sampling and partitioning")
    p.add_argument("--sort-key-baseline", action="store_true", help="also time the sort-key baseline (slow on power-law graphs)")
    p.add_argument("--layers", action="store_true", help="also print CPU ms per layer for sampling and relabelling")
    p.add_argument("--parts", type=int, default=2, help="parts of the partition map (world size)")
    p.add_argument("--presample-epochs", type=int, default=1)
    p.add_argument("--skip-partition", action="store_true")
    args = p.parse_args(argv)
    nodes, fanouts = args.nodes, args.fanouts
    edges = args.edges or 20 * nodes
    stem = report.output_stem(args, "bench_sampler")
    torch.set_num_threads(args.threads)

    t = time.perf_counter()
    ext = sample_cpu.extension()
    ext_s = time.perf_counter() - t
    if ext is None:
        print("the C++ sampler extension is not available (no compiler, or GSPLIT_NO_EXTENSIONS is set): "
              "both columns run the torch sampler", file=sys.stderr)
    print(f"C++ sampler extension {'ready' if ext is not None else 'unavailable'} after {ext_s:.1f}s "
          "(built now, or loaded from the cache of an earlier build)", flush=True)

    results = []
    for name in args.graphs.split(","):
        t = time.perf_counter()
        graph = make_graph(name, nodes, edges, args.seed)
        targets = random_split(nodes, (0.6, 0.2, 0.2), seed=args.seed)[0]
        print(f"{name}: {graph.num_nodes:,} vertices, {graph.num_edges:,} edges, generated in "
              f"{time.perf_counter() - t:.1f}s", flush=True)
        results.append(bench_graph(name, graph, targets, args, fanouts))
        del graph

    full_size = nodes == 1_000_000 and edges == 20_000_000 and fanouts == [15, 10, 5] and args.batch_size == 1024
    rows = []
    for res in results:
        cpp = res["runs"]["C++"]
        for label, r in res["runs"].items():
            dgl = DGL_MS.get(res["graph"]) if full_size else None
            rows.append([res["graph"], f"{res['num_nodes']:,} / {res['num_edges']:,}", label, r["ms_per_batch"],
                         r["ms_min"], r["cpu_ms_per_batch"], round(r["edges_per_batch"]),
                         r["ms_per_batch"] / cpp["ms_per_batch"], r["cpu_ms_per_batch"] / cpp["cpu_ms_per_batch"],
                         "-" if dgl is None else f"{r['ms_per_batch'] / dgl:.2f}"])
    table = report.format_table(["graph", "vertices / edges", "sampler", "ms/batch (median)", "ms (min)",
                                 "CPU ms (median)", "edges/batch", "this/C++ (wall)", "this/C++ (CPU)",
                                 "this/DGL quoted"], rows, ".1f")
    off_rows = [[r["graph"], r["offline"]["presample_epochs"], r["offline"]["presample_batches"],
                 r["offline"]["presample_s"], r["offline"]["presample_ms_per_batch"], r["offline"]["partition_s"],
                 r["offline"]["total_s"]] for r in results if "offline" in r]
    off_table = report.format_table(["graph", "presample epochs", "batches", "presample s", "ms/batch",
                                     f"METIS ({args.parts} parts) s", "total s"], off_rows, ".1f")
    print(f"\nbatch {args.batch_size}, fanouts {fanouts}, {args.threads} threads, median of {args.batches} batches; "
          f"DGL: issue 10's figures (not measured here): {DGL_MS['uniform']:.0f} ms uniform, "
          f"{DGL_MS['synthetic']:.0f} ms power-law, 2 cores, quiet machine")
    print(table)
    layer_rows = [[res["graph"], label] + [steps.get(k, float("nan")) for k in LAYER_COLUMNS]
                  for res in results for label, steps in res.get("layer_cpu_ms", {}).items()]
    layer_table = report.format_table(["graph", "sampler"] + [f"{k} (CPU ms)" for k in LAYER_COLUMNS], layer_rows, ".2f")
    if layer_rows:
        print(f"\nCPU ms per step, median of {args.batches} batches, {args.threads} threads")
        print(layer_table)
    if off_rows:
        print(f"\noffline half ({args.threads} threads)")
        print(off_table)
    report.save_json(stem, {"experiment": "sampler benchmark (issues 2 and 10)", "batch_size": args.batch_size,
                            "fanouts": fanouts, "threads": args.threads,
                            "extension_available": ext is not None, "extension_ready_s": ext_s,
                            "dgl_ms_quoted_from_issue_10": DGL_MS, "gsplit_ms_quoted_from_issue_10": ISSUE_GSPLIT_MS,
                            "results": results, "table": table, "layer_table": layer_table,
                            "offline_table": off_table})
    fig, axes = report.figure(len(results))
    for ax, res in zip(axes, results):
        labels = [label.replace(" ", "\n") for label in res["runs"]]
        report.bar_panel(ax, labels, {"median ms per mini-batch": [r["ms_per_batch"] for r in res["runs"].values()]},
                         "ms per mini-batch", f"{res['graph']}: {res['num_nodes']:,} v, {res['num_edges']:,} e")
        if full_size and res["graph"] in DGL_MS:
            ax.axhline(DGL_MS[res["graph"]], color="gray", linestyle="--", label="DGL, issue 10's figure (not measured)")
            ax.legend(fontsize=7)
    report.save_figure(fig, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
