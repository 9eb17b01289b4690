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

from gsplit.cli.common import _prepare_kernels, default_num_ranks
from gsplit.cli.link_map import add_link_split_args, edge_split_fractions, load_split, map_for_training
from gsplit.cli.options import (CliError, check_dataset_options, layer_fanouts, parse_dataset_options,
                                parse_fanouts)
from gsplit.runtime.io import append_jsonl, check_writable

# options of node classification that link prediction does not take yet, with their defaults
_NODE_ONLY = {"full_graph": False, "resume_anyway": False, "cache_size": "0",
              "uva": False, "ranks_per_host": 0, "recompute": False, "precision": "fp32"}


def add_link_args(p: argparse.ArgumentParser) -> None:
    """The options of ``--task link`` (on ``gsplit train``'s parser)."""
    add_link_split_args(p)
    p.add_argument("--predictor", default="dot", choices=("dot", "mlp"),
                   help="link: score of a pair: dot product of the endpoints' embeddings, or an MLP on their "
                        "element-wise product")
    p.add_argument("--eval-negatives", type=int, default=100,
                   help="link: negatives per held-out edge for MRR (default 100)")
    p.add_argument("--hits-k", type=int, default=50,
                   help="link: K of Hits@K against 1000 shared negatives (default 50)")


def _check_options(args) -> tuple:
    for name, default in _NODE_ONLY.items():
        if getattr(args, name, default) != default:
            flag = "--" + name.replace("_", "-")
            raise CliError(f"{flag} is not supported with --task link yet; leave it out (link prediction trains "
                           "split-parallel or data-parallel on one host)")
    if getattr(args, "system", "split") not in ("split", "dp"):
        raise CliError(f"--system {args.system} is not supported with --task link; pass --system split (the "
                       "default) or --system dp (data parallelism, DGL's use_ddp=True)")
    if args.launcher == "torchrun":
        raise CliError("--task link runs on the ranks gsplit starts; torchrun is not supported for it yet")
    return edge_split_fractions(args)


def cmd_train_link(args) -> int:
    import gsplit
    from gsplit.cli.report import EpochReport, tensorboard_writer
    from gsplit.link.train import LinkTrainConfig, train_link_rank

    val, test = _check_options(args)
    if args.log:
        check_writable(args.log, "--log file")
    check_dataset_options(args.dataset, parse_dataset_options(args.dataset_opts))
    # the same default and --layers rule as node classification (without --fanouts: 15,10,5)
    fanouts = parse_fanouts(layer_fanouts(args.fanouts, args.layers, False))
    cfg = LinkTrainConfig(model=args.model, system=getattr(args, "system", "split"), fanouts=fanouts, batch_size=args.batch_size, hidden=args.hidden,
                          heads=args.heads, dropout=args.dropout, epochs=args.epochs, lr=args.lr, seed=args.seed,
                          neg_ratio=args.neg_ratio, exclude=None if args.exclude == "none" else args.exclude,
                          predictor=args.predictor, eval_negatives=args.eval_negatives, hits_k=args.hits_k,
                          max_iters=args.max_iters, device="cpu" if args.device == "auto" and not
                          torch.cuda.is_available() else args.device, prefetch=args.prefetch,
                          macrobatch=args.macrobatch, checkpoint_dir=args.checkpoint or "", resume=args.resume,
                          checkpoint_every=args.checkpoint_every, edge_split=[val, test])
    if args.resume and not args.checkpoint:
        raise CliError("--resume needs --checkpoint DIR: the folder to resume from")
    if args.checkpoint:
        _check_checkpoint(args.checkpoint, args.resume)
    ds, split = load_split(args, val, test, cfg.exclude)
    cfg.dataset_spec = ds.meta.get("load", {"name": args.dataset, "options": parse_dataset_options(args.dataset_opts)})
    ranks = args.num_ranks or default_num_ranks()
    _prepare_kernels()
    owner = None
    if ranks > 1 and cfg.system == "split":  # data parallelism needs no map
        owner = map_for_training(args, split, cfg, ranks, val, test)
    report = EpochReport(args.log, tensorboard_writer(args))
    if args.log:
        Path(args.log).write_bytes(b"")  # a new run starts its log afresh
        append_jsonl(args.log, {"type": "run", "task": "link", "dataset": ds.name, "world_size": ranks,
                                "config": asdict(cfg), "command": "gsplit " + " ".join(sys.argv[1:])})
    print(f"training {args.model} for link prediction with {cfg.system} on {ranks} rank(s)", flush=True)
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
        print(f"log written to {args.log} (JSON Lines; read it with gsplit.runtime.io.read_run_log)")
    k = cfg.hits_k
    for name in ("val", "test"):
        if f"final_{name}_mrr" in result:
            print(f"final {name}: MRR {result[f'final_{name}_mrr']:.4f}  "
                  f"Hits@{k} {result[f'final_{name}_hits@{k}']:.4f} (layer-wise embeddings of every vertex)",
                  flush=True)
    if report.tensorboard is not None:
        report.tensorboard.final(result, step=len(result.get("epochs", [])))
        report.tensorboard.close()
    return 0


def _check_checkpoint(folder: str, resume: bool) -> None:
    """A checkpoint folder a link run may write: empty, or (with ``--resume``) a link run's."""
    from gsplit.run.checkpoint import load_checkpoint, prepare_checkpoint_dir

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
