"""``gsplit predict`` and ``gsplit eval`` of a link prediction model: every vertex's embedding, the scores of a
file of pairs, and the held-out edges' MRR / Hits@K.

The embeddings come from layer-wise inference over the message-passing graph the model trained on (the
dataset ``model.pt`` names, its edges split again with the run's ``--edge-split`` and ``--seed``); a pair
``(u, v)`` is scored by the run's predictor (dot product, or the MLP in ``predictor.pt``). ``predict`` runs in
one process; ``eval`` splits the inference over ``--num-ranks`` and scores the validation and test edges
against the run's own evaluation negatives, as the end of ``gsplit train --task link`` does.
"""

from __future__ import annotations

import io
from dataclasses import fields
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


def _link_run(args, mf):
    """``(dataset, edge split, predictor or None)`` of a link model: the dataset ``model.pt`` names (or
    ``--dataset``), split again as the run split it, and the run's predictor (the MLP from ``predictor.pt``)."""
    from gsplit import datasets
    from gsplit.link.edge_split import split_edges
    from gsplit.link.train import make_predictor

    cfg = mf.train_config
    if args.dataset is None and not mf.dataset.get("name"):
        raise CliError(f"{args.checkpoint} does not say which dataset it was trained on; pass --dataset")
    spec = {"name": args.dataset, "options": {}} if args.dataset else mf.dataset
    if args.dataset:
        from gsplit.cli.options import parse_dataset_options
        spec["options"] = parse_dataset_options(args.dataset_opts)
    ds = datasets.load(spec["name"], **spec.get("options", {}))
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
    return ds, split, predictor


def predict_link(args, mf) -> int:
    """Write embeddings (``.npy``: ``[num_nodes, hidden]``; ``.npz``: ``embeddings``) or, with ``--pairs``, the
    pairs' scores (``.npy``: one score a pair; ``.csv``: ``u,v,score``; ``.npz``: ``pairs``, ``scores``,
    ``embeddings``)."""
    from gsplit.minibatch.inference import layerwise_inference
    from gsplit.runtime.io import atomic_write_bytes
    from gsplit.link.train import score_pairs

    out = Path(args.out)
    if args.ids:
        raise CliError("--ids is for node classification models; a link model's --out holds every vertex's "
                       "embedding, or with --pairs FILE the scores of those pairs")
    if not args.pairs and out.suffix == ".csv":
        raise CliError("--out .csv writes pair scores; pass --pairs FILE, or write embeddings to .npy / .npz")
    ds, split, predictor = _link_run(args, mf)
    pairs = read_pairs(args.pairs, ds.num_nodes) if args.pairs else None
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


def _eval_link_rank(rank: int, world_size: int, model, predictor, split, features, negatives, device, hits_k):
    """One rank of ``gsplit eval`` of a link model: :func:`gsplit.link.train.evaluate_link` over the default group
    (layer-wise inference split by equal ranges of vertex ids: any map gives the same rows)."""
    from gsplit.comm.communicator import as_communicator
    from gsplit.launcher import resolve_device
    from gsplit.link.train import evaluate_link

    device = resolve_device(device)
    model.to(device).eval()
    if predictor is not None:
        predictor.to(device)
    return evaluate_link(model, predictor, split, features, negatives, None, as_communicator(), device, hits_k)


def eval_link(args, mf) -> int:
    """``gsplit eval`` of a link model: validation and test MRR (against the run's per-edge negatives) and
    Hits@K (against its shared negatives) from layer-wise embeddings of every vertex, the numbers the end of
    ``gsplit train --task link`` reports for the same model."""
    from gsplit.cli.common import _prepare_kernels, default_num_ranks
    from gsplit.link.train import LinkTrainConfig, evaluation_negatives
    from gsplit.run.model_io import describe

    if args.ids:
        raise CliError("--ids scores vertices of a node classification model; a link model is scored on its run's "
                       "held-out edges (--split val,test)")
    names = [s.strip() for s in args.split.split(",") if s.strip()]
    bad = [s for s in names if s not in ("val", "test")]
    if bad or not names:
        raise CliError(f"--split {args.split}: a link model is scored on its held-out edges; pass val, test or "
                       "val,test (its training edges have no evaluation negatives)")
    print(f"model {args.checkpoint}: {describe(mf)}", flush=True)
    ds, split, predictor = _link_run(args, mf)
    known = {f.name for f in fields(LinkTrainConfig)}
    cfg = LinkTrainConfig(**{k: v for k, v in mf.train_config.items() if k in known})
    negatives = evaluation_negatives(split, cfg, ds.graph)
    ranks = args.num_ranks or default_num_ranks()
    _prepare_kernels()
    print(f"layer-wise inference on {ranks} rank(s)", flush=True)
    run_args = (mf.model, predictor, split, ds.features, negatives, args.device, cfg.hits_k)
    if ranks == 1:
        result = _eval_link_rank(0, 1, *run_args)
    else:
        from gsplit.launcher import launch

        backend = "gloo" if args.device == "cpu" or not torch.cuda.is_available() else None
        result = launch(_eval_link_rank, ranks, args=run_args, backend=backend)[0]
    k = cfg.hits_k
    for name, (src, _) in (("val", split.val), ("test", split.test)):
        if name not in names:
            continue
        if f"final_{name}_mrr" not in result:
            print(f"{name}: no held-out edges (--edge-split gave none)")
            continue
        print(f"{name} MRR {result[f'final_{name}_mrr']:.4f}  Hits@{k} {result[f'final_{name}_hits@{k}']:.4f}  "
              f"({src.numel()} edges, {cfg.eval_negatives} negatives each, {cfg.shared_negatives} shared)")
    print(f"({result['final_eval_s']:.1f}s)")
    return 0
