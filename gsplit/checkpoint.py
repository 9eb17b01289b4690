"""Training checkpoints: model, optimiser, counters and RNG states, saved atomically with a ``latest`` pointer.

A checkpoint directory holds one folder per saved step (``step-000000123/``: ``state.pt``, then
``meta.json`` last) and a ``latest`` file naming the newest complete one, replaced atomically after that
folder is complete. A crash at any moment therefore leaves ``latest`` pointing at a complete checkpoint
(the previous one, or none before the first): :func:`load_checkpoint` never reads half a save. Older
step folders beyond ``keep`` are removed after the pointer moves.

``counters`` is a plain dict of what a resume needs besides the tensors: epoch, iteration within the
epoch, global step, sampler and dropout step counters, ... It is stored as given (ints, floats,
strings, lists, dicts and tensors), and loaded with ``torch.load(weights_only=True)``: no pickled code runs.

Example:
    >>> import tempfile
    >>> model = torch.nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> d = tempfile.mkdtemp()
    >>> _ = save_checkpoint(d, model.state_dict(), opt.state_dict(), {"epoch": 1, "iteration": 7})
    >>> ck = load_checkpoint(d)
    >>> ck.counters["iteration"], torch.equal(ck.model["weight"], model.weight.detach())
    (7, True)
"""

from __future__ import annotations

import logging
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np
import torch

from gsplit.io import atomic_file, atomic_write_bytes, atomic_write_json, read_meta

log = logging.getLogger(__name__)

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state"]

_FORMAT = "gsplit-checkpoint"
_STEP_DIR = re.compile(r"^step-(\d{9,})$")
_LATEST = "latest"


@dataclass
class Checkpoint:
    """One loaded checkpoint."""

    step: int
    """The global step it was saved at (names its folder)."""
    model: Dict[str, Any]
    """The model's ``state_dict``."""
    optimizer: Optional[Dict[str, Any]]
    """The optimiser's ``state_dict`` (None if none was saved)."""
    counters: Dict[str, Any]
    """Epoch, iteration, step counters ... as passed to :func:`save_checkpoint`."""
    rng: Optional[Dict[str, Any]]
    """RNG states from :func:`rng_state` (None if none were saved); restore with :func:`set_rng_state`."""
    path: Path
    """The step folder it was read from."""


def rng_state() -> Dict[str, Any]:
    """The states of Python's, NumPy's, torch's CPU and (when present) CUDA generators, as tensors and plain data.

    NumPy's state tuple is stored as plain values and a tensor so that it loads with ``weights_only=True``.
    """
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos),
                                                    int(has_gauss), float(cached)],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore generators saved by :func:`rng_state` (CUDA only when both sides have it)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _step_dirs(directory: Path):
    out = []
    if directory.is_dir():
        for p in directory.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir():
                out.append((int(m.group(1)), p))
    return sorted(out)


def save_checkpoint(directory: Union[str, Path], model: Dict[str, Any], optimizer: Optional[Dict[str, Any]],
                    counters: Dict[str, Any], rng: Optional[Dict[str, Any]] = None, step: Optional[int] = None,
                    keep: int = 2) -> Path:
    """Save a checkpoint into ``directory`` and point ``latest`` at it; returns its step folder.

    Args:
        directory: the checkpoint directory (created when absent).
        model: the model's ``state_dict()`` (tensors are saved on their device; load with ``map_location``).
        optimizer: the optimiser's ``state_dict()``, or None.
        counters: plain data a resume needs (epoch, iteration, step counters ...).
        rng: generator states, e.g. :func:`rng_state` (None: not saved).
        step: global step naming the folder; default ``counters["step"]``, else one past the newest saved.
        keep: how many step folders to keep (older ones are removed after the pointer moved); >= 1.
    """
    if keep < 1:
        raise ValueError(f"keep={keep}; keep at least the checkpoint just written (keep >= 1)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    existing = _step_dirs(directory)
    if step is None:
        step = int(counters["step"]) if "step" in counters else (existing[-1][0] + 1 if existing else 0)
    step = int(step)
    if step < 0:
        raise ValueError(f"step={step}; checkpoint steps are >= 0")
    folder = directory / f"step-{step:09d}"
    if folder.exists():  # re-saving a step (e.g. after a resume): replace it whole
        meta = folder / "meta.json"
        if meta.exists():
            meta.unlink()
    folder.mkdir(exist_ok=True)
    payload = {"model": model, "optimizer": optimizer, "counters": dict(counters), "rng": rng}
    with atomic_file(folder / "state.pt") as f:
        torch.save(payload, f)
    atomic_write_json(folder / "meta.json", {"format": _FORMAT, "version": 1, "step": step,
                                             "counters": {k: v for k, v in counters.items()
                                                          if isinstance(v, (int, float, str, bool))}})
    atomic_write_bytes(directory / _LATEST, folder.name + "\n")  # the checkpoint exists from here on
    # keep the newest `keep` up to this step; folders past it belong to a run this one resumed from before
    survivors = {p for s, p in _step_dirs(directory) if s <= step}
    survivors = set(sorted(survivors)[-keep:])
    for _, old in _step_dirs(directory):
        if old not in survivors:
            shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint at step %d written to %s", step, folder)
    return folder


def load_checkpoint(directory: Union[str, Path], map_location: Union[str, torch.device, None] = "cpu"
                    ) -> Optional[Checkpoint]:
    """The checkpoint ``latest`` points at in ``directory``; None when there is none yet.

    Raises a one-line ``ValueError`` naming the file when ``latest`` points at a missing or incomplete
    folder or ``state.pt`` cannot be read.
    """
    directory = Path(directory)
    pointer = directory / _LATEST
    if not pointer.exists():
        if _step_dirs(directory):
            log.warning("%s has step folders but no %r pointer: the first save was interrupted; starting afresh",
                        directory, _LATEST)
        return None
    name = pointer.read_text().strip()
    m = _STEP_DIR.match(name)
    if not m:
        raise ValueError(f"{pointer} holds {name[:40]!r}, not a step folder name; delete it to start afresh")
    folder = directory / name
    fix = f"point {pointer} at an older step folder, or delete it to start afresh"
    meta = read_meta(folder, ["format", "step"], "checkpoint", fix, written_first=["state.pt"])
    if meta["format"] != _FORMAT or int(meta["step"]) != int(m.group(1)):
        raise ValueError(f"{folder / 'meta.json'} does not describe checkpoint {name}; {fix}")
    try:
        payload = torch.load(folder / "state.pt", map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user-facing problem
        raise ValueError(f"{folder / 'state.pt'} cannot be read ({type(e).__name__}: {str(e)[:200]}); {fix}") from None
    missing = [k for k in ("model", "optimizer", "counters", "rng") if k not in payload]
    if missing:
        raise ValueError(f"{folder / 'state.pt'} lacks {missing}; {fix}")
    return Checkpoint(int(meta["step"]), payload["model"], payload["optimizer"], payload["counters"],
                      payload["rng"], folder)


def describe(directory: Union[str, Path]) -> str:
    """One line about the checkpoints in ``directory`` (for logs and the CLI)."""
    directory = Path(directory)
    steps = [s for s, _ in _step_dirs(directory)]
    pointer = directory / _LATEST
    latest = pointer.read_text().strip() if pointer.exists() else None
    return f"{directory}: {len(steps)} step folder(s) {steps}, latest -> {latest}"

