"""``gsplit train --full-graph`` across hosts: the host options (``--host-mode``, ``--external-hops``,
``--external-fanout``) and their checks, each a one-line error before any rank starts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from gsplit.cli.options import CliError, parse_fanouts


def add_host_mode_args(p: argparse.ArgumentParser) -> None:
    """``gsplit train``'s host options of full-graph training."""
    p.add_argument("--host-mode", choices=("span", "preload"), default="span",
                   help="--full-graph on several hosts (torchrun, or --ranks-per-host): 'span' (default): one split "
                        "group of every rank of every host, every layer's shuffle crosses hosts; 'preload': the map "
                        "has one part per host, each host preloads its vertices' halo and trains it over its own "
                        "ranks, only the gradient all-reduce crosses hosts (both exact)")
    p.add_argument("--external-hops", type=int, default=None, metavar="M",
                   help="--host-mode preload: keep only halo vertices at most M hops outside the host (expansion-aware "
                        "sampling; default: one hop per layer, exact)")
    p.add_argument("--external-fanout", type=int, default=None, metavar="K",
                   help="--host-mode preload: each halo vertex keeps at most K in-edges from other halo vertices "
                        "(seeded by --seed, the same on every rank; default: all)")


def check_host_mode(args, ranks: int, parts: int, torchrun: bool) -> int:
    """The parts of a full-graph map for this job (its ranks, or with ``--host-mode preload`` its hosts), after
    refusing the host options where they do not apply; 0 when the run is not full-graph training."""
    preload = args.host_mode == "preload"
    halo = args.external_hops is not None or args.external_fanout is not None
    if args.system != "full":
        if preload or halo:
            raise CliError("--host-mode preload, --external-hops and --external-fanout are full-graph training across "
                           "hosts; add --full-graph")
        return 0
    if halo and not preload:
        raise CliError("--external-hops and --external-fanout bound the halo of --host-mode preload; add it")
    if preload and parts == ranks:
        how = "torchrun started one host" if torchrun else (
            "it was not started by torchrun" if not args.ranks_per_host else "--ranks-per-host is every rank")
        raise CliError(f"--host-mode preload trains several hosts, but this job has one ({ranks} rank(s): {how}); "
                       f"start it with torchrun --nnodes H, or simulate hosts with --num-ranks N --ranks-per-host G, "
                       f"or leave --host-mode out on one host")
    if halo:
        from gsplit.fullgraph.hosts import check_halo_options

        try:
            check_halo_options(len(parse_fanouts(args.fanouts)), args.external_hops, args.external_fanout)
        except ValueError as e:
            raise CliError(str(e).replace("external_hops=", "--external-hops ").replace(
                "external_fanout=", "--external-fanout ")) from None
    return ranks // parts if preload else ranks  # span: one split group over every rank of every host


def host_mode_config(args) -> dict:
    """TrainConfig's host fields (full-graph training only; their defaults otherwise)."""
    if getattr(args, "host_mode", "span") != "preload":
        return {}
    return {"host_mode": "preload", "external_hops": args.external_hops, "external_fanout": args.external_fanout}


def check_host_map(partition: Optional[str], ds, hosts: int, ranks: int) -> None:
    """Refuse a ``--partition`` map for ``--host-mode preload`` made for another graph or number of hosts."""
    import gsplit

    if partition and (Path(partition) / "meta.json").exists():
        pmap = gsplit.PartitionMap.load(partition)
        pmap.check_graph(ds.graph)
        if pmap.num_parts != hosts:
            raise CliError(f"--partition {partition} holds a map of {pmap.num_parts} parts, but --host-mode preload "
                           f"needs a host map of one part per host: {hosts} for this job of {hosts} hosts x "
                           f"{ranks // hosts} ranks; make one with gsplit prepare --full-graph --num-parts {hosts}")
