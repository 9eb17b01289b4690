"""``gsplit eval``: accuracy of a trained model by split-parallel layer-wise inference (a link prediction model:
MRR and Hits@K of its held-out edges, :func:`gsplit.cli.predict_link.eval_link`)."""

from __future__ import annotations

import torch

from gsplit.cli.common import _add_inference_args, _add_model_args, _model_and_dataset, _read_ids, _run_inference
from gsplit.cli.options import CliError


def cmd_eval(args) -> int:
    from gsplit.run.model_io import load_model

    mf = load_model(args.checkpoint, trust=args.trust_model)
    if mf.train_config.get("task") == "link":  # MRR / Hits@K of the run's held-out edges
        from gsplit.cli.predict_link import eval_link

        return eval_link(args, mf)
    mf, ds = _model_and_dataset(args, mf)
    all_sets = {"train": ds.train_idx, "val": ds.val_idx, "test": ds.test_idx,
                "all": torch.arange(ds.num_nodes)}
    names = [s.strip() for s in args.split.split(",") if s.strip()]
    bad = [s for s in names if s not in all_sets]
    if bad:
        raise CliError(f"--split {args.split}: unknown set(s) {bad}; use train, val, test, all")
    id_sets = {s: all_sets[s] for s in names}
    if args.ids:
        id_sets[args.ids] = _read_ids(args.ids, ds.num_nodes, ds)  # the dataset's own ids (an edge list's)
    empty = [s for s, ids in id_sets.items() if not ids.numel()]
    if len(empty) == len(id_sets):
        raise CliError(f"every vertex set asked for is empty ({empty}) on dataset {ds.name}")
    res = _run_inference(args, ds, id_sets)
    for name, ids in id_sets.items():
        text = f"{res.accuracy[name]:.4f}" if name in res.accuracy else "(empty set)"
        print(f"{name} accuracy {text}  ({ids.numel()} vertices)")
    print(f"({res.seconds:.1f}s)")
    return 0


def add_parser(sub) -> None:
    """``gsplit eval``'s options."""
    p = sub.add_parser("eval", help="accuracy of a trained model (--checkpoint DIR) by split-parallel layer-wise "
                                    "inference")
    _add_model_args(p)
    p.add_argument("--split", default="val,test",
                   help="comma-separated vertex sets to score: train, val, test, all (a link prediction model: "
                        "its held-out edges, val and/or test, by MRR and Hits@K)")
    p.add_argument("--ids", metavar="FILE",
                   help="also score these vertices: .npy of ids or a boolean mask, or a text file, one id "
                        "a line; ids as in the dataset's source (an edge list's own ids)")
    _add_inference_args(p)
    p.set_defaults(func=cmd_eval)
