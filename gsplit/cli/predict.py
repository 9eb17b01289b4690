"""``gsplit predict``: a trained model's predictions for any vertices, written to a file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gsplit.cli.common import _add_inference_args, _add_model_args, _model_and_dataset, _read_ids, _run_inference
from gsplit.cli.options import CliError
from gsplit.runtime.io import check_writable


def cmd_predict(args) -> int:
    out = Path(args.out)
    if out.suffix not in (".csv", ".npy", ".npz"):
        raise CliError(f"--out {args.out}: write .csv, .npy or .npz")
    check_writable(out, "--out file", replace=True)
    from gsplit.run.model_io import load_model

    mf = load_model(args.checkpoint, trust=args.trust_model)
    if mf.train_config.get("task") == "link":  # embeddings and pair scores
        from gsplit.cli.predict_link import predict_link

        return predict_link(args, mf)
    if args.pairs:
        raise CliError("--pairs scores vertex pairs with a link prediction model; this one classifies vertices")
    mf, ds = _model_and_dataset(args, mf)
    ids = _read_ids(args.ids, ds.num_nodes, ds) if args.ids else torch.arange(ds.num_nodes)
    if ds.node_ids is not None:  # renumbered by its loader: the user's ids in, the user's ids out
        print(f"vertex ids: those of {ds.meta.get('source', 'the source')} (the dataset renumbered them 0..N-1 and "
              f"keeps the originals)", flush=True)
    res = _run_inference(args, ds, {}, predict_ids=ids)
    logits = res.predictions
    pred = logits.argmax(1)
    named = ds.source_ids(ids)
    from gsplit.runtime.io import atomic_write_bytes

    if out.suffix == ".csv":
        atomic_write_bytes(out, "vertex,prediction\n" + "".join(f"{v},{p}\n" for v, p in zip(named.tolist(), pred.tolist())))
    else:
        import io

        buf = io.BytesIO()
        if out.suffix == ".npy":
            np.save(buf, pred.numpy())
        else:
            np.savez(buf, ids=named.numpy(), prediction=pred.numpy(), logits=logits.numpy())
        atomic_write_bytes(out, buf.getvalue())
    print(f"predictions of {ids.numel()} vertices written to {out} ({res.seconds:.1f}s)")
    return 0


def add_parser(sub) -> None:
    """``gsplit predict``'s options."""
    p = sub.add_parser("predict", help="a trained model's predictions for any vertices, written to a file")
    _add_model_args(p)
    p.add_argument("--ids", metavar="FILE",
                   help="vertices to predict: .npy of ids or a boolean mask, or a text file, one id a line "
                        "(default: every vertex); ids as in the dataset's source: an edge list's own ids")
    p.add_argument("--pairs", metavar="FILE",
                   help="link prediction models: score these vertex pairs (.npy of shape [n, 2], or a text file "
                        "with two ids a line); without it --out gets every vertex's embedding")
    p.add_argument("--out", required=True, metavar="FILE",
                   help=".csv (vertex,prediction), .npy (predicted class per vertex of --ids) or .npz "
                        "(ids, prediction, logits); vertex ids as in the dataset's source (an edge list's own ids)")
    _add_inference_args(p)
    p.set_defaults(func=cmd_predict)
