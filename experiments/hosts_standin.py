"""How far a synthetic stand-in's host-mode counts are from a real graph's: Cora and CiteSeer against stand-ins of
their size and degree.

``gsplit estimate --hosts --shape`` measures span's rows across hosts and preload's halo on gsplit's synthetic
power-law graph (:mod:`gsplit.estimate.hosts`). A real graph has communities that METIS keeps together; the
stand-in has none. This script measures both counts on the real graphs we have and on synthetic graphs of the
same vertices and average degree, with the same maps and shares (``H`` hosts of ``G`` ranks, ``L`` layers,
expansion-aware m, k): rows that cross hosts per vertex in each span shuffle, rows inside, the exact halo's
vertices and edges relative to the graph's, and the same with the halo bounded.

    python experiments/hosts_standin.py --data-dir DIR
"""

from __future__ import annotations

import sys

from harness import report, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
from gsplit.datasets.synthetic import synthetic_graph
from gsplit.estimate.hosts import measure_host_modes


def counts(graph, args) -> dict:
    w = measure_host_modes(graph, args.hosts, args.gpus, args.layers, args.external_hops, args.external_fanout,
                           args.seed)
    span, pre, eas = w["span"], w["preload"], w["preload-eas"]
    n, e = graph.num_nodes, graph.num_edges
    return {"num_nodes": n, "num_edges": e, "span_rows_across_per_vertex": sum(span.sent_cross) / n,
            "span_rows_inside_per_vertex": (sum(span.sent_rows) - sum(span.sent_cross)) / n,
            "halo_per_vertex_exact": sum(pre.halo_vertices) / n, "edges_over_graph_exact": sum(pre.in_edges) / e,
            "halo_per_vertex_eas": sum(eas.halo_vertices) / n, "edges_over_graph_eas": sum(eas.in_edges) / e}


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0], name="hosts_standin")
    p.add_argument("--datasets", default="cora,citeseer")
    p.add_argument("--data-dir", default=str(setup.DATA), help=f"where cora.npz is (default {setup.DATA})")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--gpus", type=int, default=4, help="ranks per host")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--external-hops", type=int, default=1)
    p.add_argument("--external-fanout", type=int, default=15)
    args = p.parse_args(argv)
    stem = report.output_stem(args)
    data_info, results, rows = {}, [], []
    for _, label, ds in setup.each_dataset(args.datasets, 0, args.seed, data_info, args.data_dir):
        stand_in, _ = synthetic_graph(ds.num_nodes, avg_degree=ds.graph.num_edges / ds.num_nodes, seed=args.seed)
        for kind, graph in (("real", ds.graph), ("synthetic stand-in", stand_in)):
            res = {"dataset": label, "graph": kind, **counts(graph, args)}
            results.append(res)
            rows.append([label, kind] + [res[k] for k in list(res)[4:]])
    headers = ["graph", "kind", "span rows across / vertex", "span rows inside / vertex", "halo / vertices (exact)",
               "edges / graph's (exact)", "halo / vertices (eas)", "edges / graph's (eas)"]
    table = report.format_table(headers, rows, ".3g")
    print(f"\n{args.hosts} hosts x {args.gpus} ranks, {args.layers} layers, eas m={args.external_hops} "
          f"k={args.external_fanout}; per shuffle (span) and per host summed (halo)")
    print(table)
    report.save_json(stem, {"experiment": "host-mode counts: real graphs vs synthetic stand-ins",
                            "datasets": data_info, "settings": report.settings(args), "results": results,
                            "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
