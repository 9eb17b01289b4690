"""Prepared dataset folders: a :class:`Dataset` as ``.npy`` files that every rank memory-maps.

Layout (``save_folder`` writes it, ``load_folder`` / ``load("folder:PATH")`` reads it)::

    PATH/graph/indptr.npy, indices.npy, meta.json   the CSC graph, as :meth:`gsplit.Graph.save` writes it
    PATH/features.npy                                float32 [N, D], or float16, or bfloat16 stored as its bits
                                                     (uint16: numpy has no bfloat16); meta.json's feature_dtype
    PATH/labels.npy                                  int64 [N]
    PATH/train_idx.npy, val_idx.npy, test_idx.npy    int64
    PATH/node_ids.npy, communities.npy               int64 [N], only when the dataset has them
    PATH/meta.json                                   written LAST: sizes, flags, provenance, checks done

Why a folder of ``.npy`` files: ``np.load(mmap_mode="c")`` maps a file without reading it, so loading is
instant, a first epoch reads only the feature rows it samples, and every process of a host that maps
the same file reads it through the same page cache: two ranks hold one copy of the features and the
graph, not one each. The maps are copy-on-write (``"c"``, i.e. ``MAP_PRIVATE``): pages stay shared with
the page cache until a process writes one, and a write never reaches the file, so a rank cannot change
the shared data of another (and ``torch.from_numpy`` accepts the writable array without the warning a
read-only map gives).

A dataset loaded from a folder pickles as its path (:meth:`Dataset.__reduce_ex__`): :func:`gsplit.launch`
hands the ranks the path and each rank maps the files, instead of copying the tensors into shared memory.

The writer checks once what every reader would otherwise check at start (features finite, graph CSC
valid) and records it in ``meta.json`` (``checks``), with a stamp of every array file (size, modification
time, a digest of 64 sampled blocks: :func:`gsplit.runtime.io.file_stamp`). A reader skips those full passes over
files that are still the ones written, so the first epoch does not wait for the whole feature file to be
read; what it always checks costs little next to reading the arrays: the sizes and dtypes, ``indptr``
(starts at 0, never decreases, ends at the edge count: one pass over one entry per vertex), the stamps,
and every id that native code indexes with: the graph's source ids (one chunked min/max pass over the
edges, whatever the stamps say: a stamp restored by hand or copied along with a damaged file must not let
an id out of range reach scipy, the compiled kernels or METIS, which would corrupt memory), the labels and
the splits. The feature scan for NaN/inf runs only for a feature file whose size or sampled blocks differ
from its stamp (a copy keeps them). ``validate=True`` runs every full pass whatever the stamps say.

:func:`convert_edgelist` writes a folder from a text edge list in chunks (:mod:`gsplit.datasets.chunked`),
never holding the edge list and the CSC in memory at once.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np
import torch

from gsplit.datasets.base import Dataset
from gsplit.data.finite import first_non_finite_row, known_finite, mark_finite
from gsplit.data.graph import Graph
from gsplit.data.precision import cast_features, dtype_name, feature_dtype
from gsplit.runtime.io import load_npy, read_meta, stamp_status, write_array_dir

log = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]

FORMAT = "gsplit-dataset"
"""``meta.json``'s ``format`` value for a prepared dataset folder."""
FORMAT_VERSION = 1
"""Version of the layout; a reader refuses a newer one."""

_FIX = "write the folder again (gsplit prepare --dataset-out, or gsplit.datasets.save_folder)"
_SPLITS = ("train_idx", "val_idx", "test_idx")
_OPTIONAL = ("node_ids", "communities")
_MAX_CLASSES = 1 << 16  # more classes than this and than vertices: a damaged meta.json (1e10: a 640 GB layer)


@dataclass(frozen=True)
class FolderSource:
    """Where a :class:`Dataset` was mapped from, and the tensors it then held (set by :func:`load_folder`).

    While the dataset still holds exactly those tensors it pickles as ``path``; once a field is replaced
    (e.g. features normalised into a new tensor) it pickles its tensors as usual.
    """

    path: str
    """The folder, absolute."""
    mmap: bool
    """Whether the arrays were memory-mapped (``load_folder``'s ``mmap``)."""
    tensors: Tuple[Any, ...]
    """The graph, features, labels and split tensors as loaded, compared by identity."""

    def matches(self, ds: Dataset) -> bool:
        """True when ``ds`` still holds the very objects it was loaded with."""
        return all(a is b for a, b in zip(self.tensors, _identity(ds)))

    def reduce(self, ds: Dataset) -> Tuple[Any, ...]:
        """``ds`` pickled as this folder (:meth:`Dataset.__reduce_ex__`): :func:`reopen` maps it again where it is
        unpickled."""
        return reopen, (self.path, self.mmap, ds.name, ds.meta)


def _identity(ds: Dataset) -> Tuple[Any, ...]:
    return (ds.graph, ds.features, ds.labels, ds.train_idx, ds.val_idx, ds.test_idx, ds.node_ids, ds.communities)


def save_folder(dataset: Dataset, path: PathLike) -> Path:
    """Write ``dataset`` as a prepared folder at ``path`` (see the module doc); returns the folder.

    Checks the graph (one pass) and the features (chunked, one pass) first and records both checks in
    ``meta.json``, so that readers skip them. ``meta.json`` lands last: a folder without it is an
    interrupted write, which :func:`load_folder` reports.

    Example:
        >>> import tempfile, gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=500, seed=0)
        >>> d = save_folder(ds, tempfile.mkdtemp() + "/ds")
        >>> load_folder(d).num_edges == ds.num_edges
        True
    """
    out = Path(path)
    dataset.graph.validate()
    bad = None if known_finite(dataset.features) else first_non_finite_row(dataset.features)
    if bad is not None:
        raise ValueError(f"features row {bad} holds NaN or inf; clean the features before saving the dataset")
    meta_path = out / "meta.json"
    if meta_path.exists():  # the old metadata must not describe the new arrays if this write dies midway
        meta_path.unlink()
    dataset.graph.save(out / "graph")
    arrays = {"features.npy": features_array(dataset.features), "labels.npy": _numpy(dataset.labels)}
    arrays.update({f"{k}.npy": _numpy(getattr(dataset, k)) for k in _SPLITS})
    arrays.update({f"{k}.npy": _numpy(getattr(dataset, k)) for k in _OPTIONAL if getattr(dataset, k) is not None})
    write_array_dir(out, arrays, folder_meta(dataset.graph, dataset.features, dataset.name, dataset.num_classes,
                                             dataset.synthetic_features, dataset.synthetic_labels,
                                             [k for k in _OPTIONAL if getattr(dataset, k) is not None],
                                             {k: v for k, v in dataset.meta.items() if k != "load"}),
                    default=str, stamp=True)
    log.info("wrote %r to %s", dataset, out)
    return out


def folder_meta(graph: Graph, features, name: str, num_classes: int, synthetic_features: bool,
                synthetic_labels: bool, optional: list, provenance: Dict[str, Any]) -> Dict[str, Any]:
    """The ``meta.json`` of a prepared folder whose writer checked the graph and the features."""
    return {"format": FORMAT, "version": FORMAT_VERSION, "name": name, "num_nodes": graph.num_nodes,
            "num_edges": graph.num_edges, "feature_dim": int(features.shape[1]),
            "feature_dtype": dtype_name(features.dtype), "num_classes": int(num_classes),
            "synthetic_features": bool(synthetic_features), "synthetic_labels": bool(synthetic_labels),
            "optional": list(optional), "checks": {"graph_valid": True, "features_finite": True},
            "meta": provenance}


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def features_array(features: torch.Tensor) -> np.ndarray:
    """``features`` as the array ``features.npy`` holds: bfloat16 as its bits (uint16), other dtypes as they are."""
    if features.dtype == torch.bfloat16:
        return features.detach().cpu().view(torch.int16).numpy().view(np.uint16)
    return _numpy(features)


def features_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The tensor of a ``features.npy`` array (:func:`features_array`'s inverse; no copy, a map stays a map)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def cast_folder_features(path: PathLike, dtype) -> Path:
    """Rewrite the features of the prepared folder ``path`` in ``dtype`` (``"bfloat16"``, ``"float16"``,
    ``"float32"``), chunked, and record it (and the new file's stamp) in ``meta.json``; returns the folder.

    Used after the chunked converters, which write float32. Values beyond float16's range are refused (one
    ``ValueError`` naming the row) before anything is written.

    Example:
        >>> import tempfile, gsplit
        >>> d = save_folder(gsplit.datasets.load("synthetic", num_nodes=300, seed=0), tempfile.mkdtemp() + "/ds")
        >>> load_folder(cast_folder_features(d, "bfloat16")).features.dtype
        torch.bfloat16
    """
    p = Path(path)
    dtype = feature_dtype(dtype)
    ds = load_folder(p)
    if ds.features.dtype == dtype:
        return p
    out = cast_features(ds.features, dtype)  # checks the range first; memory: the new table (half the old)
    meta = read_meta(p, ["format"], "dataset folder", _FIX)
    del ds
    write_array_dir(p, {"features.npy": features_array(out)}, {**meta, "feature_dtype": dtype_name(dtype)},
                    default=str, stamp=True)
    return p


def is_folder(path: PathLike) -> bool:
    """True when ``path`` holds a prepared dataset folder (its ``meta.json`` names the format)."""
    try:
        return read_meta(path, ["format"], "dataset folder", _FIX).get("format") == FORMAT
    except (FileNotFoundError, ValueError):
        return False


def load_folder(path: PathLike, mmap: bool = True, validate: Optional[bool] = None) -> Dataset:
    """Open a prepared dataset folder; with ``mmap=True`` (default) every array is memory-mapped.

    ``validate=None`` (default) skips the scan for NaN/inf that the writer recorded in ``meta.json`` as done
    when the feature file is still the one it wrote (see the module doc: its stamp); ``True`` runs it
    anyway, ``False`` skips it for a folder you trust. Sizes, dtypes, ``indptr``, the graph's ids, label
    ranges and the splits are always checked, whatever ``validate`` says: native code indexes with them.
    A problem is one ``ValueError`` naming the file.

    Example:
        >>> ds = load_folder("prepared/papers100M")     # doctest: +SKIP
        >>> ds.features.is_shared()                      # doctest: +SKIP
        False
    """
    p = Path(path).expanduser().resolve()
    meta = read_meta(p, ["format", "version", "num_nodes", "num_edges", "feature_dim", "num_classes"],
                     "dataset folder", _FIX, written_first=("graph", "features.npy", "labels.npy"))  # graph/ first
    if meta["format"] != FORMAT:
        raise ValueError(f"{p / 'meta.json'} has format {meta['format']!r}, expected {FORMAT!r}; pass a folder "
                         f"written by gsplit prepare --dataset-out")
    if int(meta["version"]) > FORMAT_VERSION:
        raise ValueError(f"{p} was written by a newer gsplit (format version {meta['version']} > {FORMAT_VERSION}); "
                         f"upgrade gsplit to read it")
    for key in ("num_nodes", "num_edges", "feature_dim"):  # JSON numbers: 1e10 is a float
        if isinstance(meta[key], bool) or not isinstance(meta[key], int) or meta[key] < 0:
            raise ValueError(f"{p / 'meta.json'}: {key} is {meta[key]!r}, not a non-negative integer; {_FIX}")
    checks = meta.get("checks", {})
    n, dim = int(meta["num_nodes"]), int(meta["feature_dim"])
    classes, most = meta["num_classes"], max(n, _MAX_CLASSES)
    if type(classes) is not int or not 1 <= classes <= most:  # the model gets one output per class: bound it
        raise ValueError(f"{p / 'meta.json'}: num_classes={classes!r} must be an integer from 1 to {most} (no more "
                         f"classes than vertices, or {_MAX_CLASSES}); {_FIX}")
    features_state = stamp_status(p, "features.npy", meta.get("files"))
    if features_state == "changed":  # a copy keeps its sampled blocks: trusted
        log.info("%s: features.npy is not as written: scanning it for NaN/inf", p)
    graph = Graph.load(p / "graph", mmap=mmap)  # checks every id, stamped or not: a bad one corrupts memory
    if graph.num_nodes != n or graph.num_edges != int(meta["num_edges"]):
        raise ValueError(f"{p / 'graph'} holds {graph.num_nodes} vertices and {graph.num_edges} edges but "
                         f"{p / 'meta.json'} says {n} and {meta['num_edges']}; {_FIX}")

    def array(name: str, kind: str, ndim: int, length: Optional[int]) -> torch.Tensor:
        return torch.from_numpy(load_npy(p / f"{name}.npy", _FIX, kind=kind, ndim=ndim, length=length, mmap=mmap))

    try:
        stored = feature_dtype(meta.get("feature_dtype", "float32"))
    except ValueError as e:
        raise ValueError(f"{p / 'meta.json'}: {e}; {_FIX}") from None
    raw = load_npy(p / "features.npy", _FIX, kind="fu", ndim=2, length=n, mmap=mmap)  # the dtype: below
    expected = np.dtype(np.uint16 if stored == torch.bfloat16 else str(stored).replace("torch.", ""))
    if raw.dtype != expected or raw.shape[1] != dim:
        raise ValueError(f"{p / 'features.npy'} holds {raw.dtype} of width {raw.shape[1]}; meta.json's feature_dtype "
                         f"{dtype_name(stored)} and feature_dim expect {expected} of width {dim}; {_FIX}")
    features = features_tensor(raw, stored)
    if validate is False or (validate is None and checks.get("features_finite", False)
                             and features_state != "changed"):
        mark_finite(features)  # the writer scanned it: Dataset and the loaders skip their full pass
    fields = {k: array(k, "iu", 1, None).to(torch.int64) for k in _SPLITS}
    fields.update({k: array(k, "iu", 1, n).to(torch.int64) for k in meta.get("optional", []) if k in _OPTIONAL})
    try:
        ds = Dataset(graph=graph, features=features, labels=array("labels", "iu", 1, n).to(torch.int64),
                     num_classes=int(meta["num_classes"]), name=str(meta.get("name", p.name)),
                     synthetic_features=bool(meta.get("synthetic_features", False)),
                     synthetic_labels=bool(meta.get("synthetic_labels", False)),
                     meta={**meta.get("meta", {}), "folder": str(p)}, **fields)
    except ValueError as e:  # Dataset names the field (labels, train_idx, ...): say which file holds it
        raise ValueError(f"{_file_of(str(e), p)}: {e} ({_FIX})") from None
    ds.__dict__["_folder_source"] = FolderSource(str(p), bool(mmap), _identity(ds))
    log.info("mapped %r from %s", ds, p)
    return ds


def _file_of(message: str, folder: Path) -> Path:
    """The file of ``folder`` whose field a :meth:`Dataset.validate` message names first (else ``meta.json``:
    ``num_classes`` comes from there)."""
    fields = ("labels", "features", "num_classes") + _SPLITS + _OPTIONAL
    found = [(message.find(f), f) for f in fields if f in message]
    if not found:
        return folder
    name = min(found)[1]
    return folder / ("meta.json" if name == "num_classes" else f"{name}.npy")


def reopen(path: str, mmap: bool, name: str, meta: Dict[str, Any]) -> Dataset:
    """Unpickling a folder-backed :class:`Dataset`: map the folder again (in the receiving process)."""
    ds = load_folder(path, mmap=mmap)
    ds.name, ds.meta = name, meta
    return ds
