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


def add_co_batch_args(p: argparse.ArgumentParser) -> None:
    """``gsplit train``'s cooperative batching options of full-graph training."""
    p.add_argument("--co-batches", type=int, default=None, metavar="N",
                   help="--full-graph: train each host's share in N co-batches of its training vertices, each fetched "
                        "once per host and split over its ranks, gradients accumulated into one step per epoch "
                        "(exact); 1: the share at once; default: the fewest that fit --memory-limit by the memory "
                        "estimate (1 where the share fits)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="--full-graph: the memory budget per rank the estimate is held against (e.g. 2G); default: "
                        "the GPU's free memory, or the host's available memory shared by its CPU ranks")


def check_co_batch_args(args) -> None:
    """Refuse the co-batch options where they do not apply, ``--co-batches`` below 1 and a bad ``--memory-limit``."""
    if args.system != "full":
        if args.co_batches is not None or args.memory_limit is not None:
            raise CliError("--co-batches and --memory-limit are full-graph training's; add --full-graph")
        return
    if args.co_batches is not None and args.co_batches < 1:
        raise CliError(f"--co-batches {args.co_batches}; pass at least 1 (1: each host's share at once), or leave it "
                       "out to let the memory estimate choose")
    if args.memory_limit is not None:
        from gsplit.data.feature_store import parse_size

        try:
            parse_size(args.memory_limit, "--memory-limit")
        except ValueError as e:
            raise CliError(str(e)) from None


def check_co_batch_count(args, ds, owner, hosts: int) -> None:
    """Refuse ``--co-batches N`` above the training vertices a host has (``owner``: the host map under
    ``--host-mode preload``; else one host trains them all)."""
    import torch

    if args.system != "full" or args.co_batches is None or args.co_batches <= 1:
        return
    train = ds.train_idx.to(torch.int64)
    if args.host_mode == "preload" and owner is not None:
        counts = torch.bincount(torch.as_tensor(owner).to(torch.int64)[train], minlength=hosts).tolist()
        host = min((h for h in range(hosts) if counts[h]), key=lambda h: counts[h], default=0)
        fewest, where = counts[host], f"host {host} trains only"
    else:
        fewest, where = train.numel(), "the graph has only"
    if args.co_batches > fewest:
        raise CliError(f"--co-batches {args.co_batches} but {where} {fewest} training vertices; pass at most "
                       f"{fewest}, or leave --co-batches out")


def co_batch_config(args) -> dict:
    """TrainConfig's co-batch fields (full-graph training only)."""
    if args.system != "full":
        return {}
    return {"co_batches": args.co_batches, "memory_limit": args.memory_limit}


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
