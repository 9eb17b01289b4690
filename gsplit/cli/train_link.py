"""``gsplit train --task link``: link prediction on a seeded train / validation / test split of the edges.

The validation and test edges are removed from the message-passing graph (as OGB's link datasets are split);
the model trains on the rest with uniform negatives, split-parallel; at the end every vertex's embedding comes
from layer-wise inference and the held-out edges are scored: MRR against per-edge negatives and Hits@K against
shared negatives (OGB's evaluators' definitions).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from gsplit.cli.common import _load_dataset, _prepare_kernels, _say, default_num_ranks
from gsplit.cli.options import CliError, check_dataset_options, parse_dataset_options, parse_fanouts
from gsplit.io import append_jsonl, check_writable

# options of node classification that link prediction does not take yet, with their defaults
_NODE_ONLY = {"system": "split", "full_graph": False, "resume_anyway": False, "checkpoint_every": 0, "partition": None,
              "cache_size": "0", "uva": False, "ranks_per_host": 0, "recompute": False}


def add_link_args(p: argparse.ArgumentParser) -> None:
    """The options of ``--task link`` (on ``gsplit train``'s parser)."""
    p.add_argument("--task", default="node", choices=("node", "link"),
                   help="node: node classification (default); link: link prediction on a seeded split of the edges")
    p.add_argument("--neg-ratio", type=int, default=1, metavar="K",
                   help="link: uniform negatives per positive edge (default 1)")
    p.add_argument("--exclude", default="reverse_id", choices=("none", "self", "reverse_id"),
                   help="link: edges left out of neighbour sampling: the mini-batch's (self), also their reverses "
                        "(reverse_id, default; undirected graphs) or none")
    p.add_argument("--predictor", default="dot", choices=("dot", "mlp"),
                   help="link: score of a pair: dot product of the endpoints' embeddings, or an MLP on their "
                        "element-wise product")
    p.add_argument("--edge-split", default="0.05,0.1", metavar="VAL,TEST",
                   help="link: fractions of the edges held out for validation and test, removed from the "
                        "message-passing graph (default 0.05,0.1)")
    p.add_argument("--eval-negatives", type=int, default=100,
                   help="link: negatives per held-out edge for MRR (default 100)")
    p.add_argument("--hits-k", type=int, default=50,
                   help="link: K of Hits@K against 1000 shared negatives (default 50)")


def _check_options(args) -> tuple:
    for name, default in _NODE_ONLY.items():
        if getattr(args, name, default) != default:
            flag = "--" + name.replace("_", "-")
            raise CliError(f"{flag} is not supported with --task link yet; leave it out (link prediction trains "
                           "split-parallel on one host, with a checkpoint at the end of every epoch)")
    if args.launcher == "torchrun":
        raise CliError("--task link runs on the ranks gsplit starts; torchrun is not supported for it yet")
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


def cmd_train_link(args) -> int:
    import gsplit
    from gsplit.cli.train import EpochReport, _tensorboard
    from gsplit.link.edge_split import split_edges
    from gsplit.link.train import LinkTrainConfig, train_link_rank

    val, test = _check_options(args)
    if args.log:
        check_writable(args.log, "--log file")
    check_dataset_options(args.dataset, parse_dataset_options(args.dataset_opts))
    fanouts = parse_fanouts(args.fanouts)
    cfg = LinkTrainConfig(model=args.model, fanouts=fanouts, batch_size=args.batch_size, hidden=args.hidden,
                          heads=args.heads, dropout=args.dropout, epochs=args.epochs, lr=args.lr, seed=args.seed,
                          neg_ratio=args.neg_ratio, exclude=None if args.exclude == "none" else args.exclude,
                          predictor=args.predictor, eval_negatives=args.eval_negatives, hits_k=args.hits_k,
                          max_iters=args.max_iters, device="cpu" if args.device == "auto" and not
                          torch.cuda.is_available() else args.device, prefetch=args.prefetch,
                          macrobatch=args.macrobatch, checkpoint_dir=args.checkpoint or "", resume=args.resume,
                          edge_split=[val, test])
    if args.resume and not args.checkpoint:
        raise CliError("--resume needs --checkpoint DIR: the folder to resume from")
    if args.checkpoint:
        _check_checkpoint(args.checkpoint, args.resume)
    ds = _load_dataset(args)
    cfg.dataset_spec = ds.meta.get("load", {"name": args.dataset, "options": parse_dataset_options(args.dataset_opts)})
    split = split_edges(ds.graph, val, test, seed=args.seed)
    if cfg.exclude == "reverse_id" and split.reverse_eids is None:
        raise CliError(f"--exclude reverse_id but {ds.name}'s graph is directed (an edge without its reverse); "
                       "pass --exclude self")
    print(f"link prediction: {split.train_eids.numel()} training edges, {split.val[0].numel()} validation and "
          f"{split.test[0].numel()} test edges held out of the message-passing graph", flush=True)
    ranks = args.num_ranks or default_num_ranks()
    _prepare_kernels()
    owner = None
    if ranks > 1:
        owner = _link_map(split, cfg, ranks, args.method, args.presample, args.presample_epochs)
    report = EpochReport(args.log, _tensorboard(args))
    if args.log:
        Path(args.log).write_bytes(b"")  # a new run starts its log afresh
        append_jsonl(args.log, {"type": "run", "task": "link", "dataset": ds.name, "world_size": ranks,
                                "config": asdict(cfg), "command": "gsplit " + " ".join(sys.argv[1:])})
    print(f"training {args.model} for link prediction with split on {ranks} rank(s)", flush=True)
    t = time.perf_counter()
    run_args = (cfg, split, ds.features, ds.graph, owner, report)
    if ranks == 1:
        result = train_link_rank(0, 1, *run_args)
    else:
        backend = None if args.device != "cpu" else "gloo"
        result = gsplit.launch(train_link_rank, ranks, args=run_args, backend=backend, timeout=args.timeout,
                               progress_timeout=args.progress_timeout)[0]
    result["dataset"], result["wall_s"] = ds.name, time.perf_counter() - t
    if args.log:
        append_jsonl(args.log, {"type": "summary", **{k: v for k, v in result.items() if k != "epochs"}})
        print(f"log written to {args.log} (JSON Lines; read it with gsplit.io.read_run_log)")
    k = cfg.hits_k
    for name in ("val", "test"):
        if f"final_{name}_mrr" in result:
            print(f"final {name}: MRR {result[f'final_{name}_mrr']:.4f}  "
                  f"Hits@{k} {result[f'final_{name}_hits@{k}']:.4f} (layer-wise embeddings of every vertex)",
                  flush=True)
    if report.tensorboard is not None:
        report.tensorboard.close()
    return 0


def _check_checkpoint(folder: str, resume: bool) -> None:
    """A checkpoint folder a link run may write: empty, or (with ``--resume``) a link run's."""
    from gsplit.checkpoint import load_checkpoint, prepare_checkpoint_dir

    prepare_checkpoint_dir(folder)
    latest = load_checkpoint(folder, state=False)
    if latest is None:
        return
    if not resume:
        raise CliError(f"--checkpoint {folder} already holds a checkpoint (step {latest.step}); pass --resume to "
                       "continue it, or another folder for a new run")
    if latest.run.get("task") != "link":
        raise CliError(f"--checkpoint {folder} holds a node classification run's checkpoint; resume it without "
                       "--task link, or pass another folder")


def _link_map(split, cfg, ranks: int, method: str, presample: str, presample_epochs: int):
    """The partition map of the message-passing graph. ``random`` and ``edge`` (plain METIS) need no weights;
    ``gsplit`` and ``node`` weigh by pre-sampling: ``sampled`` counts the edge sampler's own mini-batches
    (:func:`gsplit.link.presample.presample_edges`), ``expected`` is the closed form with the training edges'
    endpoints as node targets (fast; it does not see the negatives or the exclusion)."""
    import gsplit
    from gsplit.link import negative
    from gsplit.link.presample import presample_edges
    from gsplit.link.sampler import edge_endpoints

    t = time.perf_counter()
    sampler = gsplit.NeighborSampler(cfg.fanouts, seed=cfg.seed)
    weights = None
    if method in ("gsplit", "node") and presample == "sampled":
        edge_sampler = gsplit.as_edge_prediction_sampler(
            sampler, exclude=cfg.exclude, reverse_eids=split.reverse_eids if cfg.exclude == "reverse_id" else None,
            negative_sampler=negative.Uniform(cfg.neg_ratio))
        weights = presample_edges(split.graph, split.train_eids, edge_sampler, cfg.batch_size,
                                  epochs=presample_epochs, seed=cfg.seed, num_parts=ranks)
    targets = torch.unique(torch.cat(edge_endpoints(split.graph, split.train_eids)))
    # expected: a batch of B edges has up to B * (2 + k) distinct endpoints, the targets to expect
    pmap = gsplit.partition(split.graph, ranks, method=method, weights=weights, train_idx=targets, seed=cfg.seed,
                            sampler=sampler, batch_size=cfg.batch_size * (2 + cfg.neg_ratio))
    how = f", {presample} pre-sampling" if method in ("gsplit", "node") else ""
    _say(f"partition map ({method}{how}, {ranks} parts) of the message-passing graph in {time.perf_counter() - t:.1f}s")
    _print_link_stats(split, cfg, pmap, weights)
    return pmap.assignment.long()


def _print_link_stats(split, cfg, pmap, weights) -> None:
    """The map's split of a few edge mini-batches: the blocks' cut and balance, the pairs' balance and exchange."""
    import gsplit
    from gsplit.cli.common import _print_stats
    from gsplit.link import negative
    from gsplit.link.stats import link_split_stats

    edge_sampler = gsplit.as_edge_prediction_sampler(
        gsplit.NeighborSampler(cfg.fanouts, seed=cfg.seed), exclude=cfg.exclude,
        reverse_eids=split.reverse_eids if cfg.exclude == "reverse_id" else None,
        negative_sampler=negative.Uniform(cfg.neg_ratio))
    stats = link_split_stats(split.graph, pmap.assignment, edge_sampler, split.train_eids,
                             cfg.batch_size * pmap.num_parts, num_batches=4, seed=cfg.seed, method=pmap.method)
    _print_stats(stats.blocks.to_dict())
    _say(f"pairs: scoring imbalance {stats.pair_imbalance:.3f}, {stats.remote_pair_fraction:.3f} of them need a "
         f"remote row, {stats.exchanged_rows:.0f} rows exchanged per mini-batch (4 mini-batches measured)")
