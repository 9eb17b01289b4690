"""What a checkpoint remembers about its run, and whether another run may continue it (``--resume``).

A checkpoint written by the trainer records its run (:func:`run_record`): the training configuration,
the world size, the dataset's fingerprint (a hash of graph, features, labels and split) and the
partition map's. Before any rank starts, ``gsplit train --resume`` compares that record with the new
run (:func:`compare_runs`) and sorts every difference into one of three kinds:

* **kept exact**, allowed and said in one line: another partition map, more or fewer epochs, and (split
  parallelism) another world size with the same global mini-batch (``batch_size x world size``),
  because split parallelism computes the same mini-batches, loss and gradients on any number of ranks
  and any map (up to float rounding). Options that do not touch the steps (evaluation, device, cache,
  prefetch, checkpoint interval, timeouts) change freely;
* **changes the run** (learning rate, fanouts, global mini-batch, dropout, seed, system, --max-iters, --precision,
  another dataset or dataset options): refused, unless ``--resume-anyway`` (then a new learning rate is
  applied to the restored optimiser and said);
* **cannot load** (model kind, hidden size, heads, depth, feature width, classes): refused always.

Example:
    >>> saved = {"config": {"lr": 0.003, "epochs": 3}, "world_size": 2}
    >>> compare_runs(saved, {"config": {"lr": 0.1, "epochs": 5}, "world_size": 2}).refused
    ['--lr 0.003 -> 0.1']
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import torch

__all__ = ["ResumeCheck", "run_record", "dataset_fingerprint", "map_fingerprint", "compare_runs"]

# Options whose change leaves the model unloadable.
_SHAPE = ("model", "hidden", "heads")
# Options whose change makes the remaining steps differ from an uninterrupted run's.
_EXACT = ("lr", "dropout", "seed", "system", "max_iters", "ranks_per_host", "external_hops", "external_fanout")


@dataclass
class ResumeCheck:
    """The differences between a checkpoint's run and the run that wants to continue it."""

    impossible: List[str] = field(default_factory=list)
    """Differences that make the saved model unloadable (refused even with ``--resume-anyway``)."""
    refused: List[str] = field(default_factory=list)
    """Differences that change the remaining steps (refused unless ``--resume-anyway``)."""
    notes: List[str] = field(default_factory=list)
    """Differences that keep the run exact, to be said."""

    def verdict(self, anyway: bool) -> Optional[str]:
        """The one-line reason to refuse, or None when the resume may go on."""
        if self.impossible:
            return (f"the checkpoint's model cannot be loaded into this run: {'; '.join(self.impossible)}; "
                    f"resume with the checkpoint's settings, or pass another --checkpoint folder")
        if self.refused and not anyway:
            return (f"resuming would not continue the saved run: {'; '.join(self.refused)}; resume with the "
                    f"checkpoint's settings, pass --resume-anyway to continue with the new ones, or pass "
                    f"another --checkpoint folder")
        return None


def dataset_fingerprint(dataset) -> str:
    """A hash of everything of ``dataset`` that training reads: graph, features, labels, split, classes.

    Computed once per dataset object (cached on it, and so carried into the ranks).

    Example:
        >>> import gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=500, seed=0)
        >>> dataset_fingerprint(ds) == dataset_fingerprint(gsplit.datasets.load("synthetic", num_nodes=500, seed=0))
        True
    """
    cached = dataset.__dict__.get("_gsplit_fingerprint")
    if cached is None:
        h = hashlib.blake2b(digest_size=16)
        h.update(dataset.graph.fingerprint().encode())
        h.update(np.int64(dataset.num_classes).tobytes())
        for t in (dataset.features, dataset.labels, dataset.train_idx, dataset.val_idx, dataset.test_idx):
            t = t.detach().cpu().contiguous()
            h.update(str((t.dtype, tuple(t.shape))).encode())
            h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")
        cached = h.hexdigest()
        dataset.__dict__["_gsplit_fingerprint"] = cached
    return cached


def map_fingerprint(owner: Optional[torch.Tensor]) -> Optional[str]:
    """A hash of a partition map's assignment (None without a map)."""
    if owner is None:
        return None
    return hashlib.blake2b(owner.to(torch.int64).cpu().numpy().tobytes(), digest_size=16).hexdigest()


def run_record(config: Dict[str, Any], world_size: int, dataset=None, owner: Optional[torch.Tensor] = None
               ) -> Dict[str, Any]:
    """What a checkpoint stores about its run: ``config`` (``asdict(TrainConfig)``), world size, and the
    dataset's and map's fingerprints when given (the CLI compares parts of it before it has them all)."""
    record: Dict[str, Any] = {"config": dict(config), "world_size": int(world_size)}
    if dataset is not None:
        record["dataset"] = {"name": dataset.name, "fingerprint": dataset_fingerprint(dataset),
                             "num_nodes": int(dataset.graph.num_nodes), "feature_dim": int(dataset.features.shape[1]),
                             "num_classes": int(dataset.num_classes)}
    if owner is not None:
        record["partition"] = {"fingerprint": map_fingerprint(owner)}
    return record


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def compare_runs(saved: Dict[str, Any], current: Dict[str, Any]) -> ResumeCheck:
    """Sort the differences between a checkpoint's run record and the current one (see the module doc).

    Sections missing on either side (``dataset``, ``partition``) are not compared.
    """
    out = ResumeCheck()
    old, new = saved.get("config", {}), current.get("config", {})
    for key in _SHAPE:
        if key in old and key in new and old[key] != new[key]:
            out.impossible.append(f"{_flag(key)} {old[key]} -> {new[key]}")
    if "fanouts" in old and "fanouts" in new:
        if len(old["fanouts"]) != len(new["fanouts"]):
            out.impossible.append(f"{len(old['fanouts'])} layers -> {len(new['fanouts'])} (--fanouts "
                                  f"{','.join(map(str, old['fanouts']))} -> {','.join(map(str, new['fanouts']))})")
        elif list(old["fanouts"]) != list(new["fanouts"]):
            out.refused.append(f"--fanouts {','.join(map(str, old['fanouts']))} -> {','.join(map(str, new['fanouts']))}")
    for key in _EXACT:
        if key in old and key in new and old[key] != new[key]:
            out.refused.append(f"{_flag(key)} {old[key]} -> {new[key]}")
    if new.get("precision", "fp32") != old.get("precision", "fp32"):  # older records: float32 runs
        out.refused.append(f"--precision {old.get('precision', 'fp32')} -> {new.get('precision', 'fp32')} (other "
                           f"roundings; fp16's loss scale would start afresh)")
    ws_old, ws_new = saved.get("world_size"), current.get("world_size")
    bs_old, bs_new = old.get("batch_size"), new.get("batch_size")
    if None not in (ws_old, ws_new, bs_old, bs_new) and (ws_old, bs_old) != (ws_new, bs_new):
        split = new.get("system", "split") == "split" and old.get("system", "split") == "split"
        what = f"{ws_old} rank(s) x --batch-size {bs_old} -> {ws_new} x {bs_new}"
        if split and ws_old * bs_old == ws_new * bs_new:
            out.notes.append(f"{what}: the same global mini-batch of {ws_new * bs_new}, so the same steps "
                             f"(split parallelism does not depend on the world size, up to float rounding)")
        elif split:
            out.refused.append(f"{what} (global mini-batch {ws_old * bs_old} -> {ws_new * bs_new}; batch size is "
                               f"per rank)")
        else:
            out.refused.append(f"{what} (data parallelism's steps depend on the world size)")
    if "epochs" in old and "epochs" in new and old["epochs"] != new["epochs"]:
        out.notes.append(f"--epochs {old['epochs']} -> {new['epochs']}: the run continues to epoch {new['epochs']}")
    d_old, d_new = saved.get("dataset"), current.get("dataset")
    if d_old and d_new:
        for key, what in (("feature_dim", "feature width"), ("num_classes", "classes")):
            if d_old.get(key) != d_new.get(key):
                out.impossible.append(f"dataset {what} {d_old.get(key)} -> {d_new.get(key)}")
        if not out.impossible and d_old.get("fingerprint") != d_new.get("fingerprint"):
            out.refused.append(f"another dataset ({d_old.get('name')}, {d_old.get('num_nodes')} vertices, fingerprint "
                               f"{str(d_old.get('fingerprint'))[:12]} -> {d_new.get('name')}, {d_new.get('num_nodes')} "
                               f"vertices, {str(d_new.get('fingerprint'))[:12]}: other -D options?)")
    p_old, p_new = saved.get("partition"), current.get("partition")
    if p_old and p_new and p_old.get("fingerprint") != p_new.get("fingerprint"):
        out.notes.append("another partition map: the same steps (any map computes the same mini-batches, up to "
                         "float rounding)")
    return out
