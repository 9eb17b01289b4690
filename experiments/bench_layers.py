"""Issue 10's aggregation microbenchmark: forward + backward of one layer's aggregation, three ways.

Block: ``--dst`` destinations (default 60,000) with ``--fanout`` sampled sources each (default 15, so
900,000 edges), sources drawn uniformly from ``--src`` rows (default 100,000, the synthetic-100k
graph's vertices), edges grouped by destination as in every gsplit block. Timed: the aggregation's
forward and its backward w.r.t. the source rows (for GAT also w.r.t. the two score halves), median
of ``--repeats`` runs after one warm-up, the methods interleaved within each repeat so that load
drifts hit them alike. ``--threads`` torch/OpenMP threads (default 2).

Sum aggregation of ``width``-wide rows (``update_all(copy_u, sum)`` in DGL), width 64 and 256:

* ``gsplit compiled``: :func:`gsplit.ops.aggregate.copy_u_sum` (C++/OpenMP CSR kernel, row pointers
  built per call, transpose built in backward);
* ``gather+index_add``: :func:`gsplit.ops.aggregate.copy_u_sum_torch`, gsplit's previous path;
* ``torch.sparse.mm``: a CSR matrix built per call (as a layer would per block) times the rows.

GAT (4 heads, per-head width = width / 4): edge scores, edge softmax and the weighted sum:

* ``gsplit fused``: :func:`gsplit.ops.aggregate.gat_aggregate` (one C++ pass per destination);
* ``torch unfused``: :func:`gsplit.ops.aggregate.gat_aggregate_torch` (gather, softmax through
  ``scatter_reduce`` / ``index_add_``, [E, H, D] messages), gsplit's previous path.

The DGL figure for sum aggregation at width 64 (127 ms on this machine, quiet) is the issue's,
quoted, not measured here: DGL is not installed in gsplit's environment.

    python experiments/bench_layers.py            # ~2-4 min on 2 busy cores
    python experiments/bench_layers.py --quick    # 1/10 of the edges
"""

from __future__ import annotations

import statistics
import time
import warnings

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

from gsplit.ops import aggregate

DGL_SUM64_MS = 127.0
"""The issue's figure for DGL ``update_all(copy_u, sum)``, width 64, 900k edges, forward + backward."""


def make_block(num_src: int, num_dst: int, fanout: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    edge_dst = torch.arange(num_dst).repeat_interleave(fanout)
    edge_src = torch.randint(0, num_src, (edge_dst.numel(),), generator=g)
    return edge_src, edge_dst


def sparse_mm_sum(x, edge_src, edge_dst, num_dst):
    counts = torch.bincount(edge_dst, minlength=num_dst)
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    adj = torch.sparse_csr_tensor(indptr, edge_src, torch.ones(edge_src.numel(), dtype=x.dtype),
                                  size=(num_dst, x.shape[0]))
    return torch.sparse.mm(adj, x)


def time_fwd_bwd(fn, inputs, grad_out):
    """(wall, process CPU) seconds for one forward and backward (w.r.t. every input that requires grad).

    CPU time (summed over threads) is reported beside wall time: on a shared machine it is much less
    sensitive to other processes than wall time."""
    for t in inputs:
        t.grad = None
    _, wall, cpu = rounds.timed_call(lambda: fn(*inputs).backward(grad_out))
    return wall, cpu


def run_case(name: str, methods: dict, inputs: list, out_shape: tuple, repeats: int, seed: int) -> dict:
    grad_out = torch.randn(out_shape, generator=torch.Generator().manual_seed(seed))
    times = {m: [] for m in methods}
    cpu = {m: [] for m in methods}
    ref = None
    for m, fn in methods.items():  # warm-up, and check that every method computes the same thing
        time_fwd_bwd(fn, inputs, grad_out)
        grads = [t.grad.clone() for t in inputs]
        if ref is None:
            ref = grads
        else:
            for a, b in zip(grads, ref):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for _ in range(repeats):
        for m, fn in methods.items():
            wall, cpu_s = time_fwd_bwd(fn, inputs, grad_out)
            times[m].append(wall)
            cpu[m].append(cpu_s)
    return {m: {"median_ms": 1000 * statistics.median(v), "min_ms": 1000 * min(v), "runs_ms": [1000 * t for t in v],
                "cpu_median_ms": 1000 * statistics.median(cpu[m]), "cpu_runs_ms": [1000 * t for t in cpu[m]]}
            for m, v in times.items()}


def main(argv=None) -> None:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_argument("--src", type=int, default=100_000, help="source rows")
    p.add_sized("--dst", quick=6_000, full=60_000, type=int, help="destinations (default 60,000; 6,000 with --quick)")
    p.add_argument("--fanout", type=int, default=15, help="edges per destination")
    p.add_argument("--widths", default="64,256", help="row widths, comma-separated")
    p.add_argument("--heads", type=int, default=4, help="GAT heads")
    p.add_sized("--repeats", quick=3, full=7, type=int, help="timed runs per method (default 7; 3 with --quick)")
    p.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads")
    args = p.parse_args(argv)
    num_dst, repeats = args.dst, args.repeats
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")  # torch's beta / invariant-check notes
    t0 = time.perf_counter()
    compiled = aggregate.extension_available()
    build_s = time.perf_counter() - t0
    if not compiled:
        print("note: the C++ extension is not available; 'gsplit compiled' and 'gsplit fused' run the fallback")
    edge_src, edge_dst = make_block(args.src, num_dst, args.fanout, args.seed)
    print(f"block: {args.src:,} sources, {num_dst:,} destinations, {edge_src.numel():,} edges; "
          f"{args.threads} threads; extension ready in {build_s:.1f}s")
    results, rows = [], []
    g = torch.Generator().manual_seed(args.seed)
    for width in (int(w) for w in args.widths.split(",")):
        x = torch.randn(args.src, width, generator=g).requires_grad_(True)
        methods = {
            "gsplit compiled": lambda x: aggregate.copy_u_sum(x, edge_src, edge_dst, num_dst),
            "gather+index_add": lambda x: aggregate.copy_u_sum_torch(x, edge_src, edge_dst, num_dst),
            "torch.sparse.mm": lambda x: sparse_mm_sum(x, edge_src, edge_dst, num_dst),
        }
        res = run_case(f"sum w{width}", methods, [x], (num_dst, width), repeats, args.seed)
        results.append({"op": "sum", "width": width, "times": res})
        H, D = args.heads, width // args.heads
        z = torch.randn(args.src, H, D, generator=g).requires_grad_(True)
        el = torch.randn(args.src, H, generator=g).requires_grad_(True)
        er = torch.randn(num_dst, H, generator=g).requires_grad_(True)
        gat = {
            "gsplit fused": lambda z, el, er: aggregate.gat_aggregate(z, el, er, edge_src, edge_dst, num_dst),
            "torch unfused": lambda z, el, er: aggregate.gat_aggregate_torch(z, el, er, edge_src, edge_dst, num_dst),
        }
        res_gat = run_case(f"gat w{width}", gat, [z, el, er], (num_dst, H, D), repeats, args.seed)
        results.append({"op": f"gat {H}x{D}", "width": width, "times": res_gat})
        for r in results[-2:]:
            base = r["times"]["gather+index_add" if r["op"] == "sum" else "torch unfused"]
            for m, t in r["times"].items():
                rows.append([r["op"], width, m, t["median_ms"], t["min_ms"], t["median_ms"] / base["median_ms"],
                             t["cpu_median_ms"], t["cpu_median_ms"] / base["cpu_median_ms"]])
                print(f"  {r['op']} width {width}: {m}: {t['median_ms']:.1f} ms (min {t['min_ms']:.1f}, "
                      f"CPU {t['cpu_median_ms']:.1f})", flush=True)
    table = report.format_table(["op", "width", "method", "wall ms (median)", "wall ms (min)", "wall vs previous",
                                 "CPU ms (median)", "CPU vs previous"], rows, ".3g")
    print(table)
    print(f"DGL update_all(copy_u, sum), width 64, quoted from the issue (quiet machine): {DGL_SUM64_MS:.0f} ms")
    stem = report.output_stem(args, "bench_layers")
    report.save_json(stem, {"num_src": args.src, "num_dst": num_dst, "num_edges": int(edge_src.numel()),
                            "threads": args.threads, "repeats": repeats, "extension": compiled,
                            "extension_ready_s": build_s, "dgl_sum64_ms_quoted": DGL_SUM64_MS,
                            "results": results, "table": table})


if __name__ == "__main__":
    main()
