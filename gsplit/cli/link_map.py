"""The partition map of link prediction on the command line: made, saved and measured for the message-passing
graph of a seeded edge split (``gsplit prepare --task link``, ``gsplit stats --task link``, and ``gsplit train
--task link --partition DIR``, which reuses a map prepared there or saves the one it makes).

The map belongs to the split's graph (its fingerprint): the same dataset, ``--edge-split`` and ``--seed`` give
the same graph, so a map prepared once fits every run with those; ``link.json`` beside it records them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from gsplit.cli.common import _load_dataset, _print_stats, _say
from gsplit.cli.options import CliError, parse_fanouts
from gsplit.runtime.io import atomic_write_json


def add_link_split_args(p: argparse.ArgumentParser) -> None:
    """``--task`` and what fixes a link task's edge split and mini-batches."""
    p.add_argument("--task", default="node", choices=("node", "link"),
                   help="node: node classification (default); link: link prediction on a seeded split of the edges")
    p.add_argument("--neg-ratio", type=int, default=1, metavar="K",
                   help="link: uniform negatives per positive edge (default 1)")
    p.add_argument("--exclude", default="reverse_id", choices=("none", "self", "reverse_id"),
                   help="link: edges left out of neighbour sampling: the mini-batch's (self), also their reverses "
                        "(reverse_id, default; undirected graphs) or none")
    p.add_argument("--edge-split", default="0.05,0.1", metavar="VAL,TEST",
                   help="link: fractions of the edges held out for validation and test, removed from the "
                        "message-passing graph (default 0.05,0.1)")


def edge_split_fractions(args) -> tuple:
    if args.dataset.startswith("ogbl-"):
        raise CliError(f"--dataset {args.dataset}: OGB link datasets (their official splits and negatives) are not "
                       "supported yet; use synthetic, npz:, edgelist: or folder: data, split with --edge-split")
    if args.neg_ratio < 1:
        raise CliError(f"--neg-ratio {args.neg_ratio}: pass at least 1 negative per positive edge")
    try:
        val, test = (float(x) for x in args.edge_split.split(","))
    except ValueError:
        raise CliError(f"--edge-split {args.edge_split!r}: pass two fractions VAL,TEST, e.g. 0.05,0.1") from None
    return val, test


def load_split(args, val: float, test: float, exclude):
    """The dataset and its seeded edge split; a directed graph with ``reverse_id`` is refused."""
    from gsplit.link.edge_split import split_edges

    ds = _load_dataset(args)
    split = split_edges(ds.graph, val, test, seed=args.seed)
    if exclude == "reverse_id" and split.reverse_eids is None:
        raise CliError(f"--exclude reverse_id but {ds.name}'s graph is directed (an edge without its reverse); "
                       "pass --exclude self")
    print(f"link prediction: {split.train_eids.numel()} training edges, {split.val[0].numel()} validation and "
          f"{split.test[0].numel()} test edges held out of the message-passing graph", flush=True)
    return ds, split


def _edge_sampler(split, cfg):
    import gsplit
    from gsplit.link import negative

    return gsplit.as_edge_prediction_sampler(
        gsplit.NeighborSampler(cfg.fanouts, seed=cfg.seed), exclude=cfg.exclude,
        reverse_eids=split.reverse_eids if cfg.exclude == "reverse_id" else None,
        negative_sampler=negative.Uniform(cfg.neg_ratio))


def make_link_map(split, cfg, ranks: int, method: str, presample: str, presample_epochs: int):
    """The partition map of the message-passing graph. ``random`` and ``edge`` (plain METIS) need no weights;
    ``gsplit`` and ``node`` weigh by pre-sampling: ``sampled`` counts the edge sampler's own mini-batches
    (:func:`gsplit.link.presample.presample_edges`), ``expected`` is the closed form with the training edges'
    endpoints as node targets (fast; it does not see the negatives or the exclusion)."""
    import gsplit
    from gsplit.link.presample import presample_edges
    from gsplit.link.sampler import edge_endpoints

    t = time.perf_counter()
    weights = None
    if method in ("gsplit", "node") and presample == "sampled":
        weights = presample_edges(split.graph, split.train_eids, _edge_sampler(split, cfg), cfg.batch_size,
                                  epochs=presample_epochs, seed=cfg.seed, num_parts=ranks)
    targets = torch.unique(torch.cat(edge_endpoints(split.graph, split.train_eids)))
    # expected: a batch of B edges has up to B * (2 + k) distinct endpoints, the targets to expect
    pmap = gsplit.partition(split.graph, ranks, method=method, weights=weights, train_idx=targets, seed=cfg.seed,
                            sampler=gsplit.NeighborSampler(cfg.fanouts, seed=cfg.seed),
                            batch_size=cfg.batch_size * (2 + cfg.neg_ratio))
    how = f", {presample} pre-sampling" if method in ("gsplit", "node") else ""
    _say(f"partition map ({method}{how}, {ranks} parts) of the message-passing graph in {time.perf_counter() - t:.1f}s")
    return pmap


def print_link_stats(split, cfg, pmap, num_batches: int = 4):
    """The map's split of edge mini-batches: the blocks' cut and balance, the pairs' balance and exchange."""
    from gsplit.link.stats import link_split_stats

    stats = link_split_stats(split.graph, pmap.assignment, _edge_sampler(split, cfg), split.train_eids,
                             cfg.batch_size * pmap.num_parts, num_batches=num_batches, seed=cfg.seed,
                             method=pmap.method)
    _print_stats(stats.blocks.to_dict())
    _say(f"pairs: scoring imbalance {stats.pair_imbalance:.3f}, {stats.remote_pair_fraction:.3f} of them need a "
         f"remote row, {stats.exchanged_rows:.0f} rows exchanged per mini-batch ({num_batches} mini-batches measured)")
    return stats


def save_link_map(pmap, folder: Path, args, val: float, test: float) -> None:
    pmap.save(folder)
    atomic_write_json(folder / "link.json", {"task": "link", "edge_split": [val, test], "seed": args.seed,
                                              "batch_size": args.batch_size, "neg_ratio": args.neg_ratio,
                                              "exclude": args.exclude, "fanouts": args.fanouts})


def map_for_training(args, split, cfg, ranks: int, val: float, test: float) -> torch.Tensor:
    """``--partition DIR``'s map (checked against the split's graph and the ranks), else a new one (saved in
    ``DIR`` when given)."""
    import gsplit

    folder = Path(args.partition) if args.partition else None
    if folder is not None and (folder / "meta.json").exists():
        pmap = gsplit.PartitionMap.load(folder)
        try:
            pmap.check_graph(split.graph)
        except ValueError:
            raise CliError(f"--partition {folder} was made for another graph than this run's message-passing graph; "
                           "prepare it with the same dataset, --edge-split and --seed (gsplit prepare --task link), "
                           "or pass a new folder") from None
        pmap.check_world_size(ranks)
        print(f"using partition map {folder} ({pmap.method}, {pmap.num_parts} parts)")
    else:
        pmap = make_link_map(split, cfg, ranks, args.method, args.presample, args.presample_epochs)
        if folder is not None:
            save_link_map(pmap, folder, args, val, test)
    print_link_stats(split, cfg, pmap)
    return pmap.assignment.long()


def _cfg(args):
    from gsplit.link.train import LinkTrainConfig

    return LinkTrainConfig(fanouts=parse_fanouts(args.fanouts), batch_size=args.batch_size, seed=args.seed,
                           neg_ratio=args.neg_ratio, exclude=None if args.exclude == "none" else args.exclude)


def cmd_prepare_link(args, out: Path) -> int:
    """``gsplit prepare --task link``: the map of the split's message-passing graph, saved to ``out``."""
    if args.full_graph or args.dataset_out:
        raise CliError("--task link prepares a map of the edge split's graph; leave --full-graph / --dataset-out out")
    val, test = edge_split_fractions(args)
    cfg = _cfg(args)
    _, split = load_split(args, val, test, cfg.exclude)
    pmap = make_link_map(split, cfg, args.num_parts, args.method, args.presample, args.presample_epochs)
    save_link_map(pmap, out, args, val, test)
    print(f"map written to {out}")
    print_link_stats(split, cfg, pmap)
    return 0


def cmd_stats_link(args) -> int:
    """``gsplit stats --task link``: a map of the split's graph measured on edge mini-batches."""
    import json

    import gsplit

    folder = Path(args.partition)
    saved = json.loads((folder / "link.json").read_text()) if (folder / "link.json").exists() else {}
    args.fanouts = args.fanouts or saved.get("fanouts") or "15,10,5"
    args.batch_size = args.batch_size or saved.get("batch_size") or 512
    val, test = edge_split_fractions(args)
    cfg = _cfg(args)
    _, split = load_split(args, val, test, cfg.exclude)
    pmap = gsplit.PartitionMap.load(folder)
    try:
        pmap.check_graph(split.graph)
    except ValueError:
        raise CliError(f"--partition {folder} was made for another graph than this split's message-passing graph; "
                       "pass the dataset, --edge-split and --seed it was prepared with") from None
    print(f"{pmap!r}")
    stats = print_link_stats(split, cfg, pmap, num_batches=args.num_batches)
    if args.json:
        atomic_write_json(args.json, stats.to_dict())
    return 0
