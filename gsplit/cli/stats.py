"""``gsplit stats``: cross-split edges and load imbalance of a partition map."""

from __future__ import annotations

from gsplit.cli.common import _load_dataset, _print_full_graph_stats, _print_stats
from gsplit.cli.options import _add_dataset_args, parse_fanouts
from gsplit.runtime.io import atomic_write_json, check_writable


def cmd_stats(args) -> int:
    import gsplit

    if args.json:
        check_writable(args.json, "--json file")
    if args.task == "link":  # edge mini-batches of a seeded edge split (gsplit.cli.link_map)
        from gsplit.cli.link_map import cmd_stats_link

        return cmd_stats_link(args)
    ds = _load_dataset(args)
    pmap = gsplit.PartitionMap.load(args.partition)
    if args.full_graph or pmap.method == "full-graph":
        stats = gsplit.full_graph_stats(ds.graph, pmap)
        print(f"{pmap!r}\nfull-graph training (every layer over all in-edges):")
        _print_full_graph_stats(stats)
        if args.json:
            atomic_write_json(args.json, stats.to_dict())
        return 0
    fanouts = parse_fanouts(args.fanouts) if args.fanouts else list(pmap.fanouts or [15, 10, 5])
    global_batch = (args.batch_size or pmap.batch_size or 1024) * pmap.num_parts  # the map stores targets per rank
    sampler = gsplit.NeighborSampler(fanouts, seed=args.seed)
    stats = gsplit.split_stats(ds.graph, pmap, sampler, ds.train_idx, global_batch,
                               num_batches=args.num_batches, seed=args.seed)
    print(f"{pmap!r}")
    _print_stats(stats.to_dict())
    if args.json:
        atomic_write_json(args.json, stats.to_dict())
    return 0


def add_parser(sub) -> None:
    """``gsplit stats``'s options."""
    p = sub.add_parser("stats", help="cross-split edges and load imbalance of a partition map")
    _add_dataset_args(p)
    p.add_argument("--partition", required=True)
    p.add_argument("--fanouts", default=None)
    p.add_argument("--batch-size", type=int, default=None, help="targets per rank (default: the map's)")
    p.add_argument("--num-batches", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the stats here")
    p.add_argument("--full-graph", action="store_true",
                   help="full-graph statistics (cut edges, halo rows per rank, balance); the default for a map "
                        "made with prepare --full-graph")
    from gsplit.cli.link_map import add_link_split_args

    add_link_split_args(p)
    p.set_defaults(func=cmd_stats)
