"""The self-describing model file: ``model.pt`` holds the weights *and* what built them.

``gsplit train --checkpoint DIR`` writes ``DIR/model.pt``; :func:`load_model` rebuilds the model from the
file alone (no knowledge of the architecture, no training code), and ``gsplit eval`` / ``gsplit predict``
use it. The file is a plain dict of strings, numbers, lists and tensors, so ``torch.load(...,
weights_only=True)`` reads it without running any code from it::

    {"format": "gsplit-model", "version": 1,
     "model": {"name": "sage", "in_feats": 100, "hidden": 128, "num_classes": 47, "num_layers": 3,
               "dropout": 0.5, "heads": 4},              # gsplit.nn.models.build_model(**model)
     "train_config": {...},                              # gsplit.trainer.TrainConfig as a dict
     "dataset": {"name": "synthetic", "options": {...}}, # gsplit.datasets.load(name, **options)
     "versions": {"gsplit": ..., "torch": ..., "python": ...},
     "state_dict": {...}}
"""

from __future__ import annotations

import io
import json
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

import torch
from torch import nn

__all__ = ["ModelFile", "FORMAT", "versions", "model_file", "save_model", "load_model", "json_safe"]

FORMAT = "gsplit-model"
"""The ``format`` field of every model file (``model.pt``); :func:`load_model` refuses a file without it."""
VERSION = 1
_MODEL_KEYS = ("name", "in_feats", "hidden", "num_classes", "num_layers", "dropout", "heads")


def versions() -> Dict[str, str]:
    """The versions a run depends on (for the run log and the model file).

    Example:
        >>> {"gsplit", "torch", "python"} <= set(versions())
        True
    """
    import numpy

    import gsplit

    return {"gsplit": str(gsplit.__version__), "torch": str(torch.__version__), "numpy": str(numpy.__version__),
            "python": platform.python_version(), "platform": platform.platform(),
            "cuda": str(torch.version.cuda), "argv": " ".join(sys.argv)}


def json_safe(value: Any) -> Any:
    """``value`` with anything JSON cannot hold (paths, numpy numbers, tensors) turned into plain values.

    Example:
        >>> from pathlib import Path
        >>> json_safe({"root": Path("/data"), "n": torch.tensor(3)})
        {'root': '/data', 'n': 3}
    """
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    return os.fspath(value) if isinstance(value, os.PathLike) else repr(value)


@dataclass
class ModelFile:
    """What :func:`load_model` returns: the rebuilt model and the description it came with."""

    model: nn.Module
    """The model, weights loaded, in eval mode, on the CPU."""
    spec: Dict[str, Any]
    """``build_model``'s arguments (``name``, ``in_feats``, ``hidden``, ``num_classes``, ...)."""
    train_config: Dict[str, Any]
    """The training options (``TrainConfig`` as a dict: fanouts, batch size, seed, lr, ...)."""
    dataset: Dict[str, Any]
    """``{"name": ..., "options": {...}}``: ``gsplit.datasets.load(name, **options)`` reloads the data."""
    versions: Dict[str, str]
    """gsplit, torch, python, ... of the run that wrote the file."""


def model_file(model: nn.Module, spec: Dict[str, Any], train_config: Optional[dict] = None,
               dataset: Optional[dict] = None) -> Dict[str, Any]:
    """The dict :func:`save_model` writes (see the module docstring)."""
    missing = [k for k in _MODEL_KEYS if k not in spec]
    if missing:
        raise ValueError(f"the model spec lacks {missing}; give every argument of gsplit.nn.models.build_model")
    return {"format": FORMAT, "version": VERSION, "model": json_safe(dict(spec)),
            "train_config": json_safe(dict(train_config or {})), "dataset": json_safe(dict(dataset or {})),
            "versions": versions(), "state_dict": {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                                                   for k, v in model.state_dict().items()}}


def save_model(path: Union[str, os.PathLike], model: nn.Module, spec: Dict[str, Any],
               train_config: Optional[dict] = None, dataset: Optional[dict] = None) -> None:
    """Write the self-describing model file atomically (a crash leaves the old file or the new one).

    Example:
        >>> import tempfile, pathlib
        >>> from gsplit.nn.models import build_model
        >>> spec = dict(name="sage", in_feats=4, hidden=8, num_classes=3, num_layers=2, dropout=0.0, heads=1)
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.pt"
        >>> save_model(path, build_model(**spec), spec, dataset={"name": "synthetic", "options": {"num_nodes": 300}})
        >>> loaded = load_model(path)
        >>> type(loaded.model).__name__, loaded.dataset["options"]["num_nodes"]
        ('SAGE', 300)
    """
    from gsplit.io import atomic_write_bytes

    buf = io.BytesIO()
    torch.save(model_file(model, spec, train_config, dataset), buf)
    atomic_write_bytes(path, buf.getvalue())


def load_model(path: Union[str, os.PathLike]) -> ModelFile:
    """Rebuild the model a :func:`save_model` file describes (weights loaded, eval mode, CPU).

    A folder is read as ``folder/model.pt``. A bare ``state_dict`` file (gsplit before the
    self-describing format) is refused with what to do.
    """
    from gsplit.nn.models import build_model

    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "model.pt")
    if not os.path.exists(p):
        raise FileNotFoundError(f"{p} does not exist; pass the --checkpoint folder of a finished `gsplit train` run "
                                "(it writes model.pt at the end) or the model file itself")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # not a torch file, truncated, or holding objects other than plain data
        raise ValueError(f"{p} is not a readable gsplit model file ({type(e).__name__}: {e})") from e
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ValueError(f"{p} is a bare state_dict or another file, not a self-describing gsplit model (format "
                         f"{FORMAT!r}); retrain with this gsplit (`gsplit train --checkpoint DIR`), or build the model "
                         "yourself and load_state_dict it")
    if int(obj.get("version", 0)) > VERSION:
        raise ValueError(f"{p} has model-file version {obj['version']}, newer than this gsplit reads ({VERSION}); "
                         "upgrade gsplit")
    spec = obj["model"]
    model = build_model(spec["name"], spec["in_feats"], spec["hidden"], spec["num_classes"], spec["num_layers"],
                        dropout=spec["dropout"], heads=spec["heads"])
    model.load_state_dict(obj["state_dict"])
    model.eval()
    return ModelFile(model=model, spec=spec, train_config=obj.get("train_config", {}),
                     dataset=obj.get("dataset", {}), versions=obj.get("versions", {}))


def describe(mf: ModelFile) -> str:
    """One line about a loaded model file (for the CLI).

    Example:
        >>> describe(ModelFile(nn.Linear(1, 1), {"name": "sage", "num_layers": 2, "hidden": 8}, {}, {"name": "x"},
        ...                    {"gsplit": "0.1.0"}))
        'sage, 2 layers, hidden 8, trained on x {} with gsplit 0.1.0'
    """
    return (f"{mf.spec.get('name')}, {mf.spec.get('num_layers')} layers, hidden {mf.spec.get('hidden')}, trained on "
            f"{mf.dataset.get('name')} {json.dumps(mf.dataset.get('options', {}))} with gsplit "
            f"{mf.versions.get('gsplit')}")
