"""Training checkpoints: model, optimiser, counters and RNG states, saved atomically with a ``latest`` pointer.

A checkpoint directory holds one folder per saved step (``step-000000123/``: ``state.pt``, then
``meta.json`` last) and a ``latest`` file naming the newest complete one, replaced atomically after that
folder is complete. A crash at any moment therefore leaves ``latest`` pointing at a complete checkpoint
(the previous one, or none before the first): :func:`load_checkpoint` never reads half a save. Older
step folders beyond ``keep`` are removed after the pointer moves; nothing else is ever removed except
step folders without ``meta.json`` (interrupted saves) and the ``.*.tmp`` files of interrupted writes.

``meta.json`` holds the sha256 of ``state.pt`` (checked before it is unpickled, so a flipped byte is a
one-line error, not a silently wrong model) and ``run``: what the caller says about the run that wrote it
(the trainer stores its configuration and the dataset's and partition map's fingerprints; see
:mod:`gsplit.run.resume`). :class:`CheckpointLock` makes one process the only writer of a directory.

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

import errno
import hashlib
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np
import torch

from gsplit.runtime.io import atomic_file, atomic_write_bytes, atomic_write_json, read_meta

log = logging.getLogger(__name__)

__all__ = ["Checkpoint", "CheckpointLock", "save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state",
           "prepare_checkpoint_dir", "remove_leftovers"]

_FORMAT = "gsplit-checkpoint"
_STEP_DIR = re.compile(r"^step-(\d{9,})$")
_LATEST = "latest"
_LOCK = ".lock"
_TMP = re.compile(r"^\..+\.tmp$")  # what gsplit.runtime.io.atomic_file leaves when its writer dies


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
    run: Dict[str, Any] = field(default_factory=dict)
    """What the writer recorded about its run (``save_checkpoint(run=...)``; empty for older checkpoints)."""


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _complete(folder: Path) -> bool:
    return (folder / "meta.json").is_file() and (folder / "state.pt").is_file()


def remove_leftovers(directory: Union[str, Path]) -> int:
    """Remove what interrupted saves left in ``directory``: ``.*.tmp`` files and step folders without
    ``meta.json`` that ``latest`` does not name; returns how many were removed.

    Call it only as the directory's writer (holding its :class:`CheckpointLock`): another writer's
    temporary file would look the same.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    pointer = directory / _LATEST
    latest = pointer.read_text().strip() if pointer.is_file() else None
    removed = 0
    for folder in [directory] + [p for _, p in _step_dirs(directory)]:
        for f in folder.iterdir():
            if _TMP.match(f.name) and f.is_file():
                f.unlink(missing_ok=True)
                removed += 1
    for _, folder in _step_dirs(directory):
        if folder.name != latest and not (folder / "meta.json").exists():
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    if removed:
        log.info("removed %d leftover(s) of interrupted saves in %s", removed, directory)
    return removed


class CheckpointLock:
    """An exclusive lock on a checkpoint directory: one writer at a time.

    ``fcntl.flock`` on ``DIR/.lock``: the kernel releases it when the holder exits, however it ends
    (SIGKILL included), so a crashed run never leaves the folder locked. The lock file stays; it holds
    the pid of the last holder, for the message a second writer gets. A no-op where ``fcntl`` is absent.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> with CheckpointLock(d):
        ...     pass
    """

    def __init__(self, directory: Union[str, Path]):
        self.directory = Path(directory)
        """The checkpoint directory (must exist)."""
        self._fd: Optional[int] = None

    def acquire(self) -> "CheckpointLock":
        """Take the lock or raise a one-line ``ValueError`` naming the process that holds it."""
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return self
        path = self.directory / _LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise ValueError(f"checkpoint folder {self.directory} is in use by another gsplit run (pid {holder} "
                                 f"holds {path}); wait for it to end, or pass another --checkpoint folder") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "CheckpointLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def prepare_checkpoint_dir(directory: Union[str, Path], probe: bool = True) -> Path:
    """Create ``directory`` and make sure files can be written and renamed in it, before any work.

    Raises a one-line ``ValueError`` (a file in the way, a read-only file system, no permission).
    ``probe=False`` skips the test write (ranks that only read, while the writer cleans up ``.*.tmp``).
    """
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise ValueError(f"--checkpoint {d} is a file, not a folder; pass a folder path (it is created if absent)")
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)  # a checkpoint is private (the umask applies elsewhere)
        if probe:
            test_file = d / f".write-test.{os.getpid()}.tmp"
            atomic_write_bytes(test_file, b"ok", private=True)
            test_file.unlink(missing_ok=True)
    except OSError as e:
        raise ValueError(f"cannot write checkpoints into {d} ({e.strerror or e}); pass a folder on a writable "
                         f"file system with free space") from None
    return d


def save_checkpoint(directory: Union[str, Path], model: Dict[str, Any], optimizer: Optional[Dict[str, Any]],
                    counters: Dict[str, Any], rng: Optional[Dict[str, Any]] = None, step: Optional[int] = None,
                    keep: int = 2, run: Optional[Dict[str, Any]] = None) -> Path:
    """Save a checkpoint into ``directory`` and point ``latest`` at it; returns its step folder.

    Args:
        directory: the checkpoint directory (created when absent).
        model: the model's ``state_dict()`` (tensors are saved on their device; load with ``map_location``).
        optimizer: the optimiser's ``state_dict()``, or None.
        counters: plain data a resume needs (epoch, iteration, step counters ...).
        rng: generator states, e.g. :func:`rng_state` (None: not saved).
        step: global step naming the folder; default ``counters["step"]``, else one past the newest saved.
        keep: how many complete step folders to keep (older ones are removed after the pointer moved); >= 1.
        run: JSON-able description of the run (configuration, fingerprints) stored in ``meta.json``.
    """
    if keep < 1:
        raise ValueError(f"keep={keep}; keep at least the checkpoint just written (keep >= 1)")
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, as every file written below
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
        for f in folder.iterdir():  # temporary files of an interrupted save of this step
            if _TMP.match(f.name):
                f.unlink(missing_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    payload = {"model": model, "optimizer": optimizer, "counters": dict(counters), "rng": rng}
    with atomic_file(folder / "state.pt", private=True) as f:
        torch.save(payload, f)
    atomic_write_json(folder / "meta.json", {"format": _FORMAT, "version": 2, "step": step,
                                             "files": {"state.pt": _sha256(folder / "state.pt")},
                                             "counters": {k: v for k, v in counters.items()
                                                          if isinstance(v, (int, float, str, bool))},
                                             "run": dict(run or {})}, private=True)
    atomic_write_bytes(directory / _LATEST, folder.name + "\n", private=True)  # the checkpoint exists from here on
    # Keep the newest `keep` complete folders up to this step. Folders past it are the abandoned future of
    # the timeline this run resumed from: `latest` moved back past them, this save superseded them.
    complete = [p for s, p in _step_dirs(directory) if s <= step and (p == folder or _complete(p))]
    survivors = set(complete[-keep:])
    for s, old in _step_dirs(directory):
        if old not in survivors:
            shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint at step %d written to %s", step, folder)
    return folder


def latest_step(directory: Union[str, Path]) -> Optional[str]:
    """The step folder name ``latest`` holds in ``directory`` (None when there is no pointer)."""
    pointer = Path(directory) / _LATEST
    return pointer.read_text().strip() if pointer.is_file() else None


def load_checkpoint(directory: Union[str, Path], map_location: Union[str, torch.device, None] = "cpu",
                    state: bool = True) -> Optional[Checkpoint]:
    """The checkpoint ``latest`` points at in ``directory``; None when there is none yet.

    ``state=False`` reads and checks only ``meta.json`` (the returned ``model``/``optimizer``/``rng``
    are then None). Raises a one-line ``ValueError`` naming the file when ``latest`` points at a missing
    or incomplete folder (and names the newest complete one), or ``state.pt`` does not match its
    checksum or cannot be read. Nothing is ever unpickled beyond tensors and plain data.
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
    older = [p.name for s, p in _step_dirs(directory) if p != folder and _complete(p)]
    fix = (f"point it at the newest complete one ({older[-1]}): echo {older[-1]} > {pointer}" if older else
           f"delete {pointer} to start afresh")
    if not folder.is_dir():
        raise ValueError(f"{pointer} names {name}, which does not exist; {fix}")
    meta = read_meta(folder, ["format", "step"], "checkpoint", fix, written_first=["state.pt"])
    if meta["format"] != _FORMAT or int(meta["step"]) != int(m.group(1)):
        raise ValueError(f"{folder / 'meta.json'} does not describe checkpoint {name}; {fix}")
    run = meta.get("run") if isinstance(meta.get("run"), dict) else {}
    if not state:
        return Checkpoint(int(meta["step"]), None, None, dict(meta.get("counters", {})), None, folder, run)
    want = (meta.get("files") or {}).get("state.pt")
    if want is not None:
        if not (folder / "state.pt").is_file():
            raise ValueError(f"{folder / 'state.pt'} is missing; {fix}")
        got = _sha256(folder / "state.pt")
        if got != want:
            raise ValueError(f"{folder / 'state.pt'} is damaged: its sha256 is {got[:16]}..., {folder / 'meta.json'} "
                             f"recorded {want[:16]}...; {fix}")
    try:
        payload = torch.load(folder / "state.pt", map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user-facing problem
        why = " ".join(str(e).split())[:200]
        raise ValueError(f"{folder / 'state.pt'} cannot be read ({type(e).__name__}: {why}); {fix}") from None
    missing = [k for k in ("model", "optimizer", "counters", "rng") if not isinstance(payload, dict) or k not in payload]
    if missing:
        raise ValueError(f"{folder / 'state.pt'} lacks {missing}; {fix}")
    return Checkpoint(int(meta["step"]), payload["model"], payload["optimizer"], payload["counters"],
                      payload["rng"], folder, run)


def describe(directory: Union[str, Path]) -> str:
    """One line about the checkpoints in ``directory`` (for logs and the CLI)."""
    directory = Path(directory)
    steps = [s for s, _ in _step_dirs(directory)]
    return f"{directory}: {len(steps)} step folder(s) {steps}, latest -> {latest_step(directory)}"
