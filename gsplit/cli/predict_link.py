"""``gsplit predict`` of a link prediction model: every vertex's embedding, and the scores of a file of pairs.

The embeddings come from layer-wise inference over the message-passing graph the model trained on (the
dataset ``model.pt`` names, its edges split again with the run's ``--edge-split`` and ``--seed``), in one
process; a pair ``(u, v)`` is scored by the run's predictor (dot product, or the MLP in ``predictor.pt``).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from gsplit.cli.options import CliError
from gsplit.data.graph import check_id_range


def read_pairs(path: str, num_nodes: int) -> torch.Tensor:
    """``[n, 2]`` int64 vertex pairs from a ``.npy`` of shape ``[n, 2]`` or a text file with two ids a line."""
    p = Path(path)
    if not p.exists():
        raise CliError(f"--pairs {path} does not exist")
    try:
        pairs = np.load(p, allow_pickle=False) if p.suffix == ".npy" else np.loadtxt(p, dtype=np.int64, ndmin=2, delimiter=None)
    except ValueError as e:
        raise CliError(f"--pairs {path}: not two integer vertex ids a line ({e})") from None
    t = torch.as_tensor(np.asarray(pairs))
    if t.dim() != 2 or t.shape[1] != 2 or t.dtype.is_floating_point:
        raise CliError(f"--pairs {path} holds {tuple(t.shape)} {t.dtype} values; pass n pairs of integer vertex ids")
    t = t.to(torch.int64)
    try:
        check_id_range(t.reshape(-1), num_nodes, f"--pairs {path}", "the dataset")
    except ValueError as e:
        raise CliError(str(e)) from None
    return t


def predict_link(args, mf) -> int:
    """Write embeddings (``.npy``: ``[num_nodes, hidden]``; ``.npz``: ``embeddings``) or, with ``--pairs``, the
    pairs' scores (``.npy``: one score a pair; ``.csv``: ``u,v,score``; ``.npz``: ``pairs``, ``scores``,
    ``embeddings``)."""
    from gsplit import datasets
    from gsplit.minibatch.inference import layerwise_inference
    from gsplit.runtime.io import atomic_write_bytes
    from gsplit.link.edge_split import split_edges
    from gsplit.link.train import make_predictor, score_pairs

    out = Path(args.out)
    cfg = mf.train_config
    if args.ids:
        raise CliError("--ids is for node classification models; a link model's --out holds every vertex's "
                       "embedding, or with --pairs FILE the scores of those pairs")
    if args.dataset is None and not mf.dataset.get("name"):
        raise CliError(f"{args.checkpoint} does not say which dataset it was trained on; pass --dataset")
    spec = {"name": args.dataset, "options": {}} if args.dataset else mf.dataset
    if args.dataset:
        from gsplit.cli.options import parse_dataset_options
        spec["options"] = parse_dataset_options(args.dataset_opts)
    ds = datasets.load(spec["name"], **spec.get("options", {}))
    pairs = read_pairs(args.pairs, ds.num_nodes) if args.pairs else None
    if pairs is None and out.suffix == ".csv":
        raise CliError("--out .csv writes pair scores; pass --pairs FILE, or write embeddings to .npy / .npz")
    val, test = cfg.get("edge_split", [0.05, 0.1])
    split = split_edges(ds.graph, val, test, seed=int(cfg.get("seed", 0)))
    predictor = make_predictor(cfg.get("predictor", "dot"), int(mf.spec["hidden"]))
    if predictor is not None:
        folder = Path(args.checkpoint) if Path(args.checkpoint).is_dir() else Path(args.checkpoint).parent
        state_path = folder / "predictor.pt"
        if not state_path.exists():
            raise CliError(f"{state_path} does not exist: the model's MLP predictor was saved beside model.pt; "
                           "pass the run's --checkpoint folder")
        predictor.load_state_dict(torch.load(state_path, map_location="cpu", weights_only=True))
        predictor.eval()
    with torch.no_grad():
        h = layerwise_inference(mf.model, split.graph, ds.features).output
        scores = None if pairs is None else score_pairs(predictor, h[pairs[:, 0]], h[pairs[:, 1]])
    if out.suffix == ".csv":
        text = "u,v,score\n" + "".join(f"{u},{v},{s:.6g}\n" for (u, v), s in zip(pairs.tolist(), scores.tolist()))
        atomic_write_bytes(out, text)
    else:
        buf = io.BytesIO()
        if out.suffix == ".npy":
            np.save(buf, (h if scores is None else scores).numpy())
        else:
            extra = {} if pairs is None else {"pairs": pairs.numpy(), "scores": scores.numpy()}
            np.savez(buf, embeddings=h.numpy(), **extra)
        atomic_write_bytes(out, buf.getvalue())
    what = f"scores of {pairs.shape[0]} pairs" if pairs is not None else f"embeddings of {ds.num_nodes} vertices"
    print(f"{what} written to {out}")
    return 0
