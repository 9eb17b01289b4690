"""Full-graph training across hosts, predicted: span vs preload vs preload + expansion-aware, 2-4 servers of 8 GPUs.

What ``gsplit estimate --hosts H --inter-link LINK`` prints, for the paper-shaped stand-ins (``--shape``) at
GraNNDis's depths (3 and 28 layers, SAGE, hidden 64) and every link between hosts of the table, each rank's work
measured once per (graph, hosts, depth) on the stand-in's own maps and shares and scaled to the full size
(:mod:`gsplit.estimate.hosts`). Reported per setting: predicted seconds per epoch of each mode, span / preload
(> 1: preload is faster), span / preload-eas, the bytes across hosts of span per epoch, the halo and the edges
computed per layer relative to the graph's, and the largest memory per GPU. Nothing here ran on a GPU: the
seconds are the H100 profile's and the link table's.

    python experiments/hosts_estimate.py --quick
"""

from __future__ import annotations

import sys
import time

from harness import report, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
from gsplit.estimate.hosts import measure_host_modes, predict_host_mode
from gsplit.estimate.links import INTER_LINKS, get_inter_link, get_link
from gsplit.estimate.model import ModelShape
from gsplit.estimate.profiles import get_device
from gsplit.estimate.setting import SHAPES, shaped_graph


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0], name="hosts_estimate")
    p.add_sized("--shapes", quick="ogbn-products", full="ogbn-products,ogbn-papers100M",
                help="published shapes (gsplit/estimate/setting.py SHAPES)")
    p.add_sized("--hosts", quick=[2], full=[2, 3, 4], type=setup.int_list, help="hosts (default 2 quick, 2,3,4)")
    p.add_sized("--layers", quick=[3], full=[3, 28], type=setup.int_list, help="depths (default 3 quick, 3,28)")
    p.add_sized("--sample-nodes", quick=20_000, full=100_000, type=int, help="stand-in size (default 20k quick, 100k)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per host")
    p.add_argument("--link", default="nvlink4", help="the link inside a host")
    p.add_argument("--inter-links", default=",".join(sorted(INTER_LINKS)))
    p.add_argument("--nics-per-host", type=int, default=1)
    p.add_argument("--model", default="sage")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--external-hops", type=int, default=1)
    p.add_argument("--external-fanout", type=int, default=15)
    args = p.parse_args(argv)
    stem = report.output_stem(args)
    device, intra = get_device("h100"), get_link(args.link)
    results, rows = [], []
    for name in [s for s in args.shapes.split(",") if s]:
        gshape = SHAPES[name]
        graph, _ = shaped_graph(gshape, args.sample_nodes, args.seed)
        scale = gshape.num_nodes / graph.num_nodes
        for layers in args.layers:
            shape = ModelShape(args.model, gshape.feat_dim, args.hidden, gshape.num_classes, layers)
            for hosts in args.hosts:
                t0 = time.perf_counter()
                works = measure_host_modes(graph, hosts, args.gpus, layers, args.external_hops, args.external_fanout,
                                           args.seed)
                measure_s = time.perf_counter() - t0
                for inter_name in [s for s in args.inter_links.split(",") if s]:
                    inter = get_inter_link(inter_name)
                    preds = {m: predict_host_mode(w.scaled(scale), shape, device, intra, inter, args.nics_per_host)
                             for m, w in works.items()}
                    span, pre, eas = (preds[m] for m in ("span", "preload", "preload-eas"))
                    res = {"shape": name, "layers": layers, "hosts": hosts, "gpus_per_host": args.gpus,
                           "inter_link": inter_name, "nics_per_host": args.nics_per_host, "scale": scale,
                           "measure_s": measure_s, "stand_in": {"num_nodes": graph.num_nodes,
                                                                "num_edges": graph.num_edges},
                           "predictions": {m: v.to_dict() for m, v in preds.items()},
                           "span_over_preload": span.epoch_s / pre.epoch_s,
                           "span_over_preload_eas": span.epoch_s / eas.epoch_s}
                    results.append(res)
                    edges = gshape.num_edges
                    rows.append([name, layers, f"{hosts} x {args.gpus}", inter_name, span.epoch_s, pre.epoch_s,
                                 eas.epoch_s, res["span_over_preload"], res["span_over_preload_eas"],
                                 span.cross_host_bytes / 2**30, pre.halo_vertices / gshape.num_nodes,
                                 eas.halo_vertices / gshape.num_nodes, pre.edges_per_layer / edges,
                                 eas.edges_per_layer / edges,
                                 max(v.memory_per_gpu for v in preds.values()) / 2**30])
                print(f"{name}, {layers} layers, {hosts} hosts: measured in {measure_s:.0f}s", flush=True)
    headers = ["shape", "layers", "hosts x GPUs", "between hosts", "span s/epoch", "preload s/epoch",
               "preload-eas s/epoch", "span / preload", "span / preload-eas", "span across hosts GiB/epoch",
               "halo / vertices (exact)", "halo / vertices (eas)", "edges / graph's (exact)", "edges / graph's (eas)",
               "largest GiB/GPU"]
    table = report.format_table(headers, rows, ".3g")
    print(f"\n{args.model.upper()} hidden {args.hidden}, h100 over {args.link} inside a host, {args.nics_per_host} "
          f"port(s) per host; eas: m={args.external_hops} k={args.external_fanout}")
    print(table)
    report.save_json(stem, {"experiment": "full-graph across hosts, predicted (gsplit estimate --hosts)",
                            "settings": report.settings(args), "results": results, "table": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
