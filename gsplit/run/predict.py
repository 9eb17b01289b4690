"""Reuse a trained model: accuracy or predictions for any vertex set, by split-parallel layer-wise inference.

Behind ``gsplit eval`` and ``gsplit predict``. The model comes from its self-describing file
(:mod:`gsplit.run.model_io`), so nothing about the architecture needs to be known; every rank computes
the final layer of the vertices it owns (:func:`gsplit.layerwise_inference`, contiguous ranges of
vertex ids: any split gives the same numbers), and the answers are summed over ranks.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Dict, Optional, Union

import torch

from gsplit.minibatch.inference import accuracy, gather_rows, layerwise_inference
from gsplit.run.model_io import load_model

__all__ = ["EvalResult", "evaluate_model", "check_model_fits"]

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """What :func:`evaluate_model` computed (on rank 0)."""

    accuracy: Dict[str, float]
    """``name -> accuracy`` of each vertex set given (e.g. ``{"test": 0.87}``)."""
    predictions: Optional[torch.Tensor]
    """``[len(predict_ids), num_classes]`` model outputs (logits) of ``predict_ids``, or None."""
    seconds: float
    """Wall time of the inference and the counts."""


_SAME_DATASET = ("evaluate it on the dataset it was trained on (gsplit eval reloads it from model.pt when --dataset "
                 "is left out)")


def check_model_fits(spec: dict, dataset, warn: bool = True) -> None:
    """Refuse a dataset the model cannot run on (feature width, fewer classes than the labels use); with
    ``warn``, log a warning for a model with more classes than the dataset (made for another dataset?).

    Example:
        >>> import gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=300, feature_dim=8, num_classes=3)
        >>> check_model_fits({"in_feats": 8, "num_classes": 8}, ds)   # logs the warning, runs
        >>> check_model_fits({"in_feats": 4, "num_classes": 3}, ds)
        Traceback (most recent call last):
        ...
        ValueError: the model takes 4 input features but dataset 'synthetic' has 8; evaluate it on the dataset it was trained on (gsplit eval reloads it from model.pt when --dataset is left out)
    """
    feats = int(dataset.features.shape[1])
    if int(spec["in_feats"]) != feats:
        raise ValueError(f"the model takes {spec['in_feats']} input features but dataset {dataset.name!r} has {feats}; "
                         + _SAME_DATASET)
    if dataset.labels is None:
        return
    if int(spec["num_classes"]) < int(dataset.num_classes):
        raise ValueError(f"the model predicts {spec['num_classes']} classes but dataset {dataset.name!r} has "
                         f"{dataset.num_classes}; " + _SAME_DATASET)
    if warn and int(spec["num_classes"]) > int(dataset.num_classes):
        log.warning("the model predicts %d classes but dataset %r has %d: it was probably trained on another "
                    "dataset, and predictions of the classes the dataset lacks count as wrong; %s",
                    int(spec["num_classes"]), dataset.name, int(dataset.num_classes), _SAME_DATASET)


def _rank(rank: int, world_size: int, model_path: str, dataset, id_sets: Dict[str, torch.Tensor],
          predict_ids: Optional[torch.Tensor], device: str, batch_size: int, trust: bool = False):
    import time

    from gsplit.launcher import resolve_device

    t0 = time.perf_counter()
    dev = resolve_device(device)
    mf = load_model(model_path, trust=trust)
    model = mf.model.to(dev)
    graph = dataset.graph.to(dev) if dev.type == "cuda" else dataset.graph
    result = layerwise_inference(model, graph, dataset.features, batch_size=batch_size, device=dev,
                                 buffer_device="cpu")
    accs = {name: accuracy(result, dataset.labels, ids) for name, ids in id_sets.items() if ids.numel()}
    preds = gather_rows(result, predict_ids).cpu() if predict_ids is not None else None
    return EvalResult(accuracy=accs, predictions=preds if rank == 0 else None, seconds=time.perf_counter() - t0)


def evaluate_model(model_path: Union[str, os.PathLike], dataset, id_sets: Dict[str, torch.Tensor],
                   predict_ids: Optional[torch.Tensor] = None, num_ranks: int = 1, device: str = "auto",
                   batch_size: int = 4096, trust: bool = False, **launch_options) -> EvalResult:
    """Accuracy of the saved model on each vertex set of ``id_sets`` and/or its outputs for ``predict_ids``.

    ``num_ranks > 1`` starts that many ranks with :func:`gsplit.launch` (GPUs, else CPU processes) and
    splits the inference between them. ``trust``: :func:`gsplit.run.model_io.load_model`'s (a file without a
    digest, or one that does not match it).

    Example:
        >>> import tempfile, pathlib, gsplit
        >>> from gsplit.run.model_io import save_model
        >>> from gsplit.nn.models import build_model
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=0)
        >>> spec = dict(name="sage", in_feats=ds.feature_dim, hidden=8, num_classes=ds.num_classes, num_layers=2,
        ...             dropout=0.0, heads=1)
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.pt"
        >>> save_model(path, build_model(**spec), spec)
        >>> res = evaluate_model(path, ds, {"test": ds.test_idx}, predict_ids=torch.tensor([0, 5]), device="cpu")
        >>> 0 <= res.accuracy["test"] <= 1, tuple(res.predictions.shape)
        (True, (2, 8))
    """
    check_model_fits(load_model(model_path, trust=trust).spec, dataset)
    args = (os.fspath(model_path), dataset, id_sets, predict_ids, device, int(batch_size), bool(trust))
    if num_ranks <= 1:
        return _rank(0, 1, *args)
    from gsplit.launcher import launch

    backend = "gloo" if device == "cpu" else None
    return launch(_rank, num_ranks, args=args, backend=backend, **launch_options)[0]
