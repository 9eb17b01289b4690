"""Cut quality vs METIS's memory for budgets of METIS's input (``--metis-edges-per-vertex``), issue 19 item 4.

Generates the synthetic graph of ``experiments/scale.py`` (average degree 15), computes the expected
pre-sampling weights once (4 parts, batch 1024 per rank, fanouts 15,10,5), then partitions it with each
budget (``0``: every edge) and records the pre-sampled weight cut as a share of the total weight (over every
edge of the graph, after the refinement), METIS's own pages at their peak (the forked METIS process's
private memory, ``gsplit.runtime.resources.HostMemoryMeter``), the entries METIS was given and the weight they kept.

    python experiments/metis_budgets.py --nodes 4000000 --budgets 8,10,12,0    # ~15 min, ~10 GB at its peak
    python experiments/metis_budgets.py --quick                                 # 50k vertices, seconds
"""

from __future__ import annotations

import json
import time

from harness import report, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import numpy as np

from gsplit import NeighborSampler
from gsplit.partitioning import presample
from gsplit.partitioning.strategies import partition
from gsplit.runtime.resources import HostMemoryMeter


def main(argv=None) -> None:
    p = setup.make_parser(__doc__.splitlines()[0], out_file=setup.RESULTS / "metis_budgets")
    p.add_sized("--nodes", quick=50_000, full=4_000_000, type=int, help="vertices (default 4000000; quick 50000)")
    p.add_argument("--budgets", default="8,10,12,0", help="entries per vertex; 0: every edge")
    p.add_argument("--parts", type=int, default=4)
    args = p.parse_args(argv)
    ds = setup.load_named("synthetic", args.nodes, args.seed, avg_degree=15, feature_dim=1)
    g, sampler = ds.graph, NeighborSampler([15, 10, 5])
    w = presample(g, ds.train_idx, sampler, batch_size=1024, num_parts=args.parts, method="expected")
    ew = w.edge_weights.numpy().astype(np.float64)
    dst = np.repeat(np.arange(g.num_nodes, dtype=np.int32), np.diff(g.indptr.numpy()))
    src = g.indices.numpy()
    rows = []
    for budget in [float(b) for b in args.budgets.split(",")]:
        t = time.perf_counter()
        with HostMemoryMeter() as meter:
            pmap = partition(g, args.parts, method="gsplit", weights=w, train_idx=ds.train_idx, sampler=sampler,
                             batch_size=1024, metis_edges_per_vertex=budget if budget > 0 else None)
        a = pmap.assignment.numpy()
        md = pmap.metadata
        rows.append({"budget": budget, "cut_share": round(float(ew[a[src] != a[dst]].sum() / ew.sum()), 4),
                     "metis_private_mb": round(max((c["private"] for c in meter.children_peak.values()), default=0)
                                               / 2**20),
                     "entries": md.get("metis_adjacency_entries"), "weight_kept": md.get("metis_weight_kept"),
                     "seconds": round(time.perf_counter() - t, 1), "stage_seconds": md.get("stage_seconds")})
        print(json.dumps(rows[-1]), flush=True)
    table = report.format_table(["budget", "cut share", "METIS MB", "entries", "weight kept"],
                                [[str(r["budget"] or "all"), str(r["cut_share"]), r["metis_private_mb"], r["entries"],
                                  str(r["weight_kept"] if r["weight_kept"] is not None else 1.0)] for r in rows])
    print(table)
    report.save_json(report.output_stem(args, suffix="_quick" if args.quick else ""),
                     {"nodes": args.nodes, "edges": g.num_edges, "parts": args.parts, "rows": rows, "table": table})


if __name__ == "__main__":
    main()
