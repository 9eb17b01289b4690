"""The self-describing model file: ``model.pt`` holds the weights *and* what built them.

``gsplit train --checkpoint DIR`` writes ``DIR/model.pt``; :func:`load_model` rebuilds the model from the
file alone (no knowledge of the architecture, no training code), and ``gsplit eval`` / ``gsplit predict``
use it. The file is a plain dict of strings, numbers, lists and tensors, so ``torch.load(...,
weights_only=True)`` reads it without running any code from it::

    {"format": "gsplit-model", "version": 1,
     "model": {"name": "sage", "in_feats": 100, "hidden": 128, "num_classes": 47, "num_layers": 3,
               "dropout": 0.5, "heads": 4},              # gsplit.nn.models.build_model(**model)
     "train_config": {...},                              # gsplit.run.trainer.TrainConfig as a dict
     "dataset": {"name": "synthetic", "options": {...}}, # gsplit.datasets.load(name, **options)
     "versions": {"gsplit": ..., "torch": ..., "python": ...},
     "state_dict": {...},
     "state_sha256": "..."}                              # of everything above: a changed file is refused

:func:`load_model` refuses, in one line naming the file: a file whose contents do not hash to
``state_sha256`` (the digest covers the description, the training options, the dataset, the versions
*and* the weights: :func:`file_digest`; a flipped byte inside a tensor or in ``num_nodes``, neither of
which torch's loader notices), a file without the digest or with the weights-only digest of model files
version 1 (unless the caller trusts it: ``trust=True``, ``--trust-model``), one without its ``model``
description or ``state_dict``, a description that cannot build a model (an option ``build_model`` does
not take, a size that is not a positive integer, a model larger than the memory available: checked on
the ``meta`` device, before anything is allocated) and weights that do not fit the model the description
builds (the tensor, its shape in the file and in the model).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

import torch
from torch import nn

__all__ = ["ModelFile", "FORMAT", "versions", "model_file", "save_model", "load_model", "json_safe",
           "state_digest", "file_digest", "check_model_spec"]

FORMAT = "gsplit-model"
"""The ``format`` field of every model file (``model.pt``); :func:`load_model` refuses a file without it."""
VERSION = 2
"""2: ``state_sha256`` covers the whole file (:func:`file_digest`); 1: the weights only (:func:`state_digest`)."""
_MODEL_KEYS = ("name", "in_feats", "hidden", "num_classes", "num_layers", "dropout", "heads")
_SIZES = ("in_feats", "hidden", "num_classes", "num_layers", "heads")


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
    state = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in model.state_dict().items()}
    obj = {"format": FORMAT, "version": VERSION, "model": json_safe(dict(spec)),
           "train_config": json_safe(dict(train_config or {})), "dataset": json_safe(dict(dataset or {})),
           "versions": versions(), "state_dict": state}
    obj["state_sha256"] = file_digest(obj)
    return obj


def file_digest(obj: Dict[str, Any]) -> str:
    """sha256 of a model file's contents: every entry but ``state_sha256`` itself, the weights by
    :func:`state_digest` and the rest (description, options, dataset, versions) as canonical JSON.

    Example:
        >>> a = {"format": FORMAT, "version": 2, "model": {"hidden": 8}, "state_dict": {"w": torch.ones(2)}}
        >>> b = dict(a, model={"hidden": 9})
        >>> file_digest(a) == file_digest(dict(a)) != file_digest(b)
        True
    """
    rest = {k: v for k, v in obj.items() if k not in ("state_dict", "state_sha256")}
    h = hashlib.sha256(b"gsplit-model file digest\0")
    h.update(json.dumps(json_safe(rest), sort_keys=True, separators=(",", ":")).encode())
    h.update(b"\0" + state_digest(obj.get("state_dict") or {}).encode())
    return h.hexdigest()


def check_model_spec(spec: Any, where: str, memory: Optional[int] = None,
                     fix: str = "check the file (a damaged or hand-edited description?)") -> None:
    """Refuse, in one ``ValueError`` naming ``where``, a model description that cannot build its model:
    not exactly ``build_model``'s arguments, a size that is not a positive integer, a dropout outside
    [0, 1), an unknown model, or parameters larger than ``memory`` bytes (default: the host memory
    available now). The model is built on the ``meta`` device to count them: nothing is allocated.
    ``fix`` ends the message: what to do.

    Example:
        >>> spec = dict(name="sage", in_feats=4, hidden=8, num_classes=3, num_layers=2, dropout=0.0, heads=1)
        >>> check_model_spec(spec, "model.pt")
        >>> check_model_spec(dict(spec, num_classes=10**10), "DS/meta.json", memory=2**30)
        Traceback (most recent call last):
        ...
        ValueError: DS/meta.json: a sage model with in_feats 4, hidden 8, 10000000000 classes and 2 layers holds 170000000072 parameters (633.3 GiB), more than the 1.0 GiB of memory available; check the file (a damaged or hand-edited description?)
    """
    from gsplit.nn.models import MODELS, build_model
    from gsplit.runtime.resources import available_memory

    if not isinstance(spec, dict):
        raise ValueError(f"{where}: the model description is a {type(spec).__name__}, not a dict of "
                         f"build_model's arguments; {fix}")
    unknown = sorted(str(k) for k in spec if k not in _MODEL_KEYS)
    missing = [k for k in _MODEL_KEYS if k not in spec]
    if unknown or missing:
        what = "; ".join(x for x in (f"options build_model does not take: {unknown}" if unknown else "",
                                     f"lacks {missing}" if missing else "") if x)
        raise ValueError(f"{where}: its model description {what}; {fix}")
    for key in _SIZES:
        value = spec[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: model option {key} is {value!r}; it must be a positive integer; {fix}")
    dropout = spec["dropout"]
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ValueError(f"{where}: model option dropout is {dropout!r}; it must be a number in [0, 1); {fix}")
    if not isinstance(spec["name"], str) or spec["name"].lower() not in MODELS:
        raise ValueError(f"{where}: model {spec['name']!r} is not one of {sorted(MODELS)}; {fix}")
    try:
        with torch.device("meta"):  # shapes only: a 10**10-class layer costs nothing here
            probe = build_model(spec["name"], spec["in_feats"], spec["hidden"], spec["num_classes"],
                                spec["num_layers"], dropout=spec["dropout"], heads=spec["heads"])
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{where}: its model description {json.dumps(json_safe(spec))} does not build a model "
                         f"({e}); {fix}") from None
    tensors = list(probe.parameters()) + list(probe.buffers())
    count = sum(t.numel() for t in probe.parameters())
    size = sum(t.numel() * t.element_size() for t in tensors)
    limit = available_memory() if memory is None else int(memory)
    if size > limit:
        raise ValueError(f"{where}: a {spec['name']} model with in_feats {spec['in_feats']}, hidden {spec['hidden']}, "
                         f"{spec['num_classes']} classes and {spec['num_layers']} layers holds {count} parameters "
                         f"({size / 2**30:.1f} GiB), more than the {limit / 2**30:.1f} GiB of memory available; {fix}")


def state_digest(state: Dict[str, Any]) -> str:
    """sha256 of a ``state_dict``: every entry's name, dtype, shape and bytes, in name order.

    Example:
        >>> a = {"w": torch.ones(2, 2)}
        >>> state_digest(a) == state_digest({"w": torch.ones(2, 2)}) != state_digest({"w": torch.zeros(2, 2)})
        True
    """
    h = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        h.update(f"{name}\0".encode())
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}\0".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


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
    from gsplit.runtime.io import atomic_write_bytes

    buf = io.BytesIO()
    torch.save(model_file(model, spec, train_config, dataset), buf)
    atomic_write_bytes(path, buf.getvalue())


def load_model(path: Union[str, os.PathLike], trust: bool = False) -> ModelFile:
    """Rebuild the model a :func:`save_model` file describes (weights loaded, eval mode, CPU).

    A folder is read as ``folder/model.pt``. The file must hash to its digest (see the module doc); a file
    without one, with the weights-only digest of version 1, or that does not match (a description edited
    by hand) loads only with ``trust=True`` (``--trust-model``: a file you know the origin of; a warning
    says what was not checked). The description is checked before anything is built, trusted or not. A
    bare ``state_dict`` file (gsplit before the self-describing format) is refused with what to do.

    Example:
        >>> import tempfile, pathlib
        >>> from gsplit.nn.models import build_model
        >>> spec = dict(name="sage", in_feats=4, hidden=8, num_classes=3, num_layers=2, dropout=0.0, heads=1)
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "model.pt"
        >>> save_model(path, build_model(**spec), spec)
        >>> obj = torch.load(path, weights_only=True); obj["dataset"] = {"name": "another"}; torch.save(obj, path)
        >>> load_model(path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: ... has been changed since it was written: its contents do not match the sha256 recorded ...
        >>> load_model(path, trust=True).dataset
        {'name': 'another'}
    """
    import logging

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
    version = obj.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version > VERSION:
        raise ValueError(f"{p} has model-file version {version!r}, newer than this gsplit reads ({VERSION}); "
                         "upgrade gsplit")
    fix = "retrain (`gsplit train --checkpoint DIR` writes DIR/model.pt) or restore the file from a copy"
    trusting = ("pass --trust-model (load_model(..., trust=True)) to load it anyway if you know where it comes from, "
                "then save it again (gsplit.run.model_io.save_model) to give it a digest")
    spec, state = obj.get("model"), obj.get("state_dict")
    if not isinstance(spec, dict) or not isinstance(state, dict):
        what = "'model' (the description of the architecture)" if not isinstance(spec, dict) else "'state_dict'"
        raise ValueError(f"{p} is a gsplit model file without its {what}; it is damaged or was not written by "
                         f"gsplit.run.model_io.save_model: {fix}")
    want = obj.get("state_sha256")
    if version < 2:  # weights-only digest: a changed description would pass it unnoticed
        problem = None if want is None or state_digest(state) == want else "damaged"
        unchecked = "was written by an older gsplit (model-file version 1) whose digest covers the weights only"
    else:
        problem = None if want is None or file_digest(obj) == want else "changed"
        unchecked = "carries no digest (state_sha256)"
    if problem is not None and version < 2:  # the weights it does cover differ: damaged, trusted or not
        raise ValueError(f"{p} is damaged: its weights do not match the sha256 recorded when it was written "
                         f"({str(want)[:16]}...); {fix}")
    if problem is not None:
        if not trust:
            raise ValueError(f"{p} is damaged or has been changed since it was written: its contents do not match "
                             f"the sha256 recorded then ({str(want)[:16]}...); {fix}, or, for a file you edited "
                             f"yourself, {trusting}")
        logging.getLogger(__name__).warning("%s does not match its digest; loading it anyway (trust=True)", p)
    elif want is None or version < 2:
        if not trust:
            raise ValueError(f"{p} {unchecked}, so its description is not checked; {trusting}")
        logging.getLogger(__name__).warning("%s %s; loading it anyway (trust=True)", p, unchecked)
    check_model_spec(spec, p)  # before anything is built, trusted or not
    try:
        model = build_model(spec["name"], spec["in_feats"], spec["hidden"], spec["num_classes"], spec["num_layers"],
                            dropout=spec["dropout"], heads=spec["heads"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{p}: its model description {json.dumps(json_safe(spec))} does not build a model ({e}); "
                         f"{fix}") from None
    mismatch = _state_mismatch(model.state_dict(), state)
    if mismatch:
        raise ValueError(f"{p}: its weights do not fit the model its description builds ({spec['name']}, "
                         f"{spec['num_layers']} layers, in_feats {spec['in_feats']}, hidden {spec['hidden']}, "
                         f"{spec['num_classes']} classes): {mismatch}; the file is inconsistent: {fix}")
    model.load_state_dict(state)
    model.eval()
    return ModelFile(model=model, spec=spec, train_config=obj.get("train_config", {}),
                     dataset=obj.get("dataset", {}), versions=obj.get("versions", {}))


def _state_mismatch(expected: Dict[str, Any], got: Dict[str, Any]) -> str:
    """How ``got`` differs from the model's own ``state_dict`` (names, shapes), in a few words; "" when it fits."""
    problems: List[str] = []
    for name, want in expected.items():
        have = got.get(name)
        if have is None:
            problems.append(f"{name} is missing")
        elif isinstance(want, torch.Tensor) and (not isinstance(have, torch.Tensor) or have.shape != want.shape):
            shape = list(have.shape) if isinstance(have, torch.Tensor) else type(have).__name__
            problems.append(f"{name} has shape {shape} in the file but {list(want.shape)} in the model")
    problems += [f"{name} is not in the model" for name in got if name not in expected]
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


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
