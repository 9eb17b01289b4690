"""``gsplit estimate --hosts H --inter-link LINK``: full-graph training across hosts, predicted for both host modes.

The options (:func:`add_host_arguments`), their checks (:func:`check_hosts`, one line each) and the run
(:func:`main_hosts`); the model is :mod:`gsplit.estimate.hosts`.
"""

from __future__ import annotations

import time
from pathlib import Path

from gsplit.estimate.links import INTER_LINKS

NOTE = ("predicted: gsplit train --full-graph on H hosts of --gpus GPUs; span: one split group over every GPU, every "
        "layer's shuffle crosses hosts; preload: each host its vertices plus their L-hop halo, shuffles inside "
        "hosts, only the gradient all-reduce crosses; preload-eas: preload with the halo bounded (approximate). "
        "Per-rank work measured on the graph's own maps and shares; seconds from the device profile and the two "
        "links (gsplit/estimate/hosts.py, docs/guides/estimate.md); no multi-host GPU run has been measured.")


def add_host_arguments(p) -> None:
    """``gsplit estimate``'s options of full-graph training across hosts."""
    p.add_argument("--hosts", type=int, default=None,
                   help="predict full-graph training on this many hosts of --gpus GPUs each, both host modes "
                        "(span and preload), instead of split vs dp mini-batch training on one host")
    p.add_argument("--inter-link", choices=sorted(INTER_LINKS), default=None,
                   help="with --hosts: the network between hosts (one port: ib-qdr 32, ib-edr 100, ib-hdr 200, "
                        "ib-ndr 400 Gb/s InfiniBand; eth-25g, eth-100g Ethernet)")
    p.add_argument("--nics-per-host", type=int, default=1,
                   help="with --hosts: network ports per host (a DGX H100 has 8, one per GPU; default 1)")
    p.add_argument("--layers", type=int, default=None,
                   help="with --hosts: the model's depth (default: one per --fanouts entry; full-graph training "
                        "samples nothing)")
    p.add_argument("--external-hops", type=int, default=None, metavar="M",
                   help="with --hosts: also predict preload with the halo bounded to M hops outside a host "
                        "(expansion-aware sampling; GraNNDis uses 1)")
    p.add_argument("--external-fanout", type=int, default=None, metavar="K",
                   help="with --hosts: ... and at most K in-edges from other halo vertices each (GraNNDis uses 15)")


def check_hosts(args, num_layers: int) -> None:
    """Refuse, in one line, host options that do not apply or cannot be answered."""
    host_only = {"--inter-link": args.inter_link is not None, "--layers": args.layers is not None,
                 "--external-hops": args.external_hops is not None,
                 "--external-fanout": args.external_fanout is not None, "--nics-per-host": args.nics_per_host != 1}
    if args.hosts is None:
        given = [k for k, v in host_only.items() if v]
        if given:
            raise ValueError(f"{given[0]} is an option of full-graph training across hosts; add --hosts H (2 or more)")
        return
    if args.hosts < 2:
        raise ValueError(f"--hosts must be at least 2, got {args.hosts}; one host is gsplit estimate without --hosts")
    if args.inter_link is None:
        raise ValueError(f"--hosts {args.hosts} needs --inter-link, the network between the hosts: one of "
                         f"{', '.join(sorted(INTER_LINKS))}")
    if args.nics_per_host < 1:
        raise ValueError(f"--nics-per-host must be at least 1, got {args.nics_per_host}")
    if args.layers is not None and args.layers < 1:
        raise ValueError(f"--layers must be at least 1, got {args.layers}")
    if args.partition:
        raise ValueError("--partition with --hosts: the host map and the ranks' maps are made here, as training "
                         "makes them; leave --partition out")
    from gsplit.fullgraph.hosts import check_halo_options

    try:
        check_halo_options(num_layers, args.external_hops, args.external_fanout)
    except ValueError as e:
        raise ValueError(str(e).replace("external_hops=", "--external-hops ").replace(
            "external_fanout=", "--external-fanout ")) from None


def main_hosts(args, graph, feat_dim: int, classes: int, full_nodes, desc: str, num_layers: int) -> int:
    """Predict and print every host mode's epoch, the bytes across and inside hosts, and which mode to choose."""
    from gsplit.estimate.hosts import estimate_hosts
    from gsplit.estimate.links import default_device_for, get_inter_link, get_link
    from gsplit.estimate.model import ModelShape
    from gsplit.estimate.profiles import get_device

    t0 = time.perf_counter()
    device = get_device(args.device_profile or default_device_for(args.link))
    intra, inter = get_link(args.link), get_inter_link(args.inter_link)
    shape = ModelShape(args.model, feat_dim, args.hidden, classes, num_layers, args.heads,
                       feature_bytes=2 if args.feature_dtype != "float32" else 4)
    print(desc, flush=True)
    est = estimate_hosts(graph, shape, args.hosts, args.gpus, device, intra, inter, args.nics_per_host,
                         args.external_hops, args.external_fanout, full_nodes=full_nodes, seed=args.seed)
    print(f"{args.hosts} hosts x {args.gpus} {device.name} over {intra.name}, {args.nics_per_host} x {inter.name} "
          f"({inter.gbit_s:g} Gb/s) per host; full-graph {args.model.upper()}, {num_layers} layers, hidden "
          f"{args.hidden}")
    print(f"{'mode':>12} {'s/epoch':>9} {'across GiB':>11} {'inside GiB':>11} {'edges/layer':>12} {'halo':>10} "
          f"{'GiB/GPU':>8}  largest terms")
    for mode, p in est.predictions.items():
        terms = ", ".join(f"{k} {v:.0%}" for k, v in p.dominant(3))
        print(f"{mode:>12} {p.epoch_s:>9.4g} {p.cross_host_bytes / 2**30:>11.3g} {p.inside_host_bytes / 2**30:>11.3g} "
              f"{p.edges_per_layer:>12.3g} {p.halo_vertices:>10.3g} {p.memory_per_gpu / 2**30:>8.2f}  {terms}")
    span, pre = est.predictions["span"].epoch_s, est.predictions["preload"].epoch_s
    print(f"choose: {est.choice()} (span / preload = {span / pre:.2f}; 'either' within 5 %; both exact)")
    if "preload-eas" in est.predictions:
        eas = est.predictions["preload-eas"].epoch_s
        print(f"preload-eas: span / preload-eas = {span / eas:.2f}, an approximation (the halo's edge misses in-edges: "
              "check accuracy, e.g. experiments/host_halo.py)")
    if device.memory_bytes:
        for mode, p in est.predictions.items():
            if p.memory_per_gpu > device.memory_bytes:
                print(f"note: {mode} needs {p.memory_per_gpu / 2**30:.1f} GiB per GPU, more than the "
                      f"{device.memory_bytes / 2**30:.0f} GiB of a {device.name} (cooperative batching is not in "
                      "gsplit yet)")
    print("note: " + NOTE)
    if args.json:
        from gsplit.runtime.io import atomic_write_json

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.json, {"description": desc, **est.to_dict()}, default=float)
    print(f"({time.perf_counter() - t0:.1f}s)")
    return 0
