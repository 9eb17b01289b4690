"""Open Graph Benchmark node-property datasets (``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M``).

Uses ``ogb.nodeproppred.NodePropPredDataset``, the numpy variant that needs neither PyG nor DGL, and
works around three habits of ogb 1.3.6 that do not fit a library:

* it reloads its processed file with ``torch.load``, which since torch 2.6 defaults to
  ``weights_only=True`` and cannot read that file (a pickle of numpy arrays, protocol 4);
* it asks on stdin (``input()``) whether to re-download when a folder lacks the current
  ``RELEASE_v*.txt`` and before downloads over 1 GB, which blocks or fails without a terminal;
* ``import ogb`` starts threads that ask PyPI whether ogb (and ``outdated``) are outdated, and it
  prints progress.

The fixes are scoped: while ogb runs, the names ``torch``, ``input`` and ``print`` inside ogb's own
modules are shadowed by small stand-ins (``torch.load`` by :func:`load_numpy_pickle`, which reads
ogb's files but runs no code from them; fixed answers instead of prompts; logging instead of print),
and restored afterwards. Nothing outside ogb is touched.

A dataset folder is data a user points gsplit at, so it must not be able to run code: ogb's own
unguarded ``torch.load`` (weights-only off) would run whatever a crafted ``processed/data_processed`` holds.
:func:`load_numpy_pickle` unpickles only containers, numbers, strings and numpy arrays.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import sys
import threading
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from gsplit.datasets.base import Dataset
from gsplit.datasets.chunked import ogb_labels_to_int64
from gsplit.data.graph import Graph

log = logging.getLogger(__name__)

SUPPORTED = ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M")
"""Homogeneous single-label OGB node datasets this loader handles."""
_UNSUPPORTED = {
    "ogbn-mag": "it is heterogeneous (several vertex and edge types)",
    "ogbn-proteins": "it has 112 binary labels per vertex and no vertex features",
}
_MISSING = object()
# ogb's stand-ins are module attributes while it runs: one loader at a time.
_OGB_LOCK = threading.Lock()


def default_root() -> Path:
    """Where datasets are stored: ``$GSPLIT_DATA`` if set, else ``~/.gsplit/datasets``."""
    env = os.environ.get("GSPLIT_DATA")
    return Path(env).expanduser() if env else Path.home() / ".gsplit" / "datasets"


def load_ogb(
    name: str,
    *,
    root: Optional[os.PathLike] = None,
    download: bool = True,
    symmetric: bool = True,
    remove_self_loops: bool = True,
) -> Dataset:
    """Load an OGB node-property dataset with its official split (needs ``pip install gsplit[ogb]``).

    Args:
        name: one of ``ogbn-arxiv``, ``ogbn-products``, ``ogbn-papers100M``.
        root: folder holding OGB dataset folders (``<root>/ogbn_arxiv/...``); default :func:`default_root`.
        download: fetch the dataset when it is not in ``root``; with ``False`` a missing dataset raises
            ``FileNotFoundError`` without touching the network. Downloads never ask for confirmation.
        symmetric: add reverse edges (``ogbn-arxiv`` and ``ogbn-papers100M`` are directed citation
            graphs; GNNs on them are usually trained on the symmetric graph). Repeated edges are dropped.
        remove_self_loops: drop ``v -> v`` edges (GNN layers add their own self path).

    Vertices without a label (most of ``ogbn-papers100M``) get label -1; every split vertex is labelled.

    Example:
        >>> ds = load_ogb("ogbn-arxiv", root="/data/ogb")   # doctest: +SKIP
        >>> ds.num_nodes, ds.num_classes                    # doctest: +SKIP
        (169343, 40)
    """
    if name in _UNSUPPORTED:
        raise ValueError(f"{name} is not supported: {_UNSUPPORTED[name]}; supported OGB datasets: "
                         f"{', '.join(SUPPORTED)}")
    if name not in SUPPORTED:
        raise ValueError(f"unknown OGB dataset {name!r}; supported: {', '.join(SUPPORTED)}")
    ogb_dataset_mod = _import_ogb(name)
    root_path = Path(root).expanduser() if root is not None else default_root()
    dataset_dir = root_path / name.replace("-", "_")
    if not download and not _has_files(dataset_dir, name):
        raise FileNotFoundError(
            f"{name} is not in {dataset_dir} (no processed/data_processed and no raw files) and download=False; "
            f"pass download=True, or unpack OGB's {name} archive so that {dataset_dir}/raw exists")
    root_path.mkdir(parents=True, exist_ok=True)
    # ogb saves its processed file here without creating the folder first
    if dataset_dir.is_dir():
        (dataset_dir / "processed").mkdir(exist_ok=True)

    with _ogb_scoped(dataset_dir):
        try:
            ogb_ds = ogb_dataset_mod.NodePropPredDataset(name=name, root=str(root_path))
            split = ogb_ds.get_idx_split()
        except OSError as e:  # urllib errors are OSErrors
            failure = e
        else:
            failure = None
    if failure is not None:
        if raw_files_missing(dataset_dir) == []:  # what gsplit prepare converts: read it the same way
            log.warning("ogb could not read %s (%s); reading its raw files as gsplit prepare does", dataset_dir,
                        failure)
            return load_ogb_raw(dataset_dir, name=name, symmetric=symmetric, remove_self_loops=remove_self_loops)
        if _has_files(dataset_dir, name):  # the files are there: not the network's fault
            raise RuntimeError(f"could not read {name} under {dataset_dir}: {failure}; the raw files gsplit needs "
                               f"are {', '.join(RAW_FILES)} and split/<kind>/{{train,valid,test}}.csv.gz "
                               f"(missing: {', '.join(raw_files_missing(dataset_dir))})") from failure
        raise RuntimeError(f"could not fetch or read {name} under {dataset_dir}: {failure}; check the network, "
                           f"or place the unpacked dataset there and pass download=False") from failure
    g, raw_labels = ogb_ds[0]
    num_classes = int(ogb_ds.num_classes)

    edge_index = np.asarray(g["edge_index"])
    n = int(g["num_nodes"])
    graph = Graph.from_edges(edge_index[0], edge_index[1], num_nodes=n, symmetric=symmetric,
                             remove_duplicates=True, remove_self_loops=remove_self_loops)
    del edge_index
    if g.get("node_feat") is None:
        raise ValueError(f"{name} under {dataset_dir} has no node features; this loader needs them")
    features = torch.from_numpy(np.ascontiguousarray(g["node_feat"], dtype=np.float32))
    labels = ogb_labels_to_int64(np.asarray(raw_labels), name)
    idx = {k: torch.from_numpy(np.asarray(split[k]).astype(np.int64).reshape(-1)) for k in ("train", "valid", "test")}
    ds = Dataset(graph=graph, features=features, labels=labels, train_idx=idx["train"], val_idx=idx["valid"],
                 test_idx=idx["test"], num_classes=num_classes, name=name,
                 meta={"source": str(dataset_dir), "format": "ogb", "symmetric": symmetric,
                       "remove_self_loops": remove_self_loops,
                       "split": f"official ({ogb_ds.meta_info['split']})"})
    log.info("loaded %r", ds)
    return ds


RAW_FILES = ("raw/edge.csv.gz", "raw/num-node-list.csv.gz", "raw/node-feat.csv.gz", "raw/node-label.csv.gz")
"""The raw files of an unpacked OGB folder that :func:`load_ogb_raw` (and ``gsplit prepare``) read, beside one
``split/<kind>/`` folder."""


def raw_files_missing(dataset_dir: os.PathLike) -> list:
    """What :func:`load_ogb_raw` needs and ``dataset_dir`` lacks (empty: it can be read).

    Example:
        >>> raw_files_missing("/nonexistent/ogbn_arxiv")[:1]
        ['raw/edge.csv.gz']
    """
    d = Path(dataset_dir)
    missing = [f for f in RAW_FILES if not (d / f).is_file()]
    kinds = [k for k in (d / "split").glob("*") if k.is_dir()] if (d / "split").is_dir() else []
    if len(kinds) != 1 or not all((kinds[0] / f"{s}.csv.gz").is_file() for s in ("train", "valid", "test")):
        missing.append("split/<kind>/{train,valid,test}.csv.gz (one split folder)")
    return missing


def load_ogb_raw(dataset_dir: os.PathLike, *, name: Optional[str] = None, symmetric: bool = True,
                 remove_self_loops: bool = True) -> Dataset:
    """An unpacked OGB folder's raw files read the way ``gsplit prepare`` reads them (:func:`convert_ogb`, whose
    parser needs none of ogb's extra files such as ``node_year.csv.gz``), into memory.

    :func:`load_ogb` falls back to it where ogb's own processing fails on a folder that holds
    :data:`RAW_FILES` and a split, so that ``gsplit train`` takes every folder ``gsplit prepare`` converts. The
    conversion goes through a temporary folder that is removed before this returns.

    Example:
        >>> ds = load_ogb_raw("/data/ogb/ogbn_arxiv")    # doctest: +SKIP
    """
    import shutil
    import tempfile

    from gsplit.datasets.chunked import convert_ogb
    from gsplit.datasets.folder import load_folder

    src = Path(dataset_dir).expanduser()
    tmp = Path(tempfile.mkdtemp(prefix="gsplit-ogb-"))
    try:
        convert_ogb(src, tmp / "ds", name=name, symmetric=symmetric, remove_self_loops=remove_self_loops)
        mapped = load_folder(tmp / "ds", mmap=False)
        ds = Dataset(graph=Graph(mapped.graph.indptr.clone(), mapped.graph.indices.clone()),
                     features=mapped.features.clone(), labels=mapped.labels.clone(),
                     train_idx=mapped.train_idx.clone(), val_idx=mapped.val_idx.clone(),
                     test_idx=mapped.test_idx.clone(), num_classes=mapped.num_classes, name=mapped.name,
                     meta={**{k: v for k, v in mapped.meta.items() if k != "folder"}, "source": str(src)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("loaded %r from the raw files in %s", ds, src)
    return ds


def _has_files(dataset_dir: Path, name: str) -> bool:
    """Whether ogb would find the dataset without downloading (mirrors NodePropPredDataset.pre_process)."""
    if (dataset_dir / "processed" / "data_processed").exists():
        return True
    raw = dataset_dir / "raw"
    return (raw / "edge.csv.gz").exists() or (raw / "data.npz").exists()


# ---------------------------------------------------------------------------------- ogb quirks
def _import_ogb(name: str):
    """Import ``ogb.nodeproppred.dataset`` without the PyPI version checks that ``import ogb`` starts.

    ``ogb`` imports ``outdated`` inside ``try/except ImportError`` and, when found, checks PyPI in a
    thread; importing ``outdated`` itself also checks PyPI. Marking ``outdated`` unimportable (a
    ``None`` entry in ``sys.modules``) for the duration of ``import ogb`` skips both; the entry is then
    removed again, so later imports of ``outdated`` elsewhere behave normally.
    """
    if "ogb" not in sys.modules:
        had_outdated = "outdated" in sys.modules
        if not had_outdated:
            sys.modules["outdated"] = None  # type: ignore[assignment]
        try:
            import ogb  # noqa: F401
        except ImportError as e:
            raise ImportError(f"{name} needs the ogb package: pip install gsplit[ogb]") from e
        finally:
            if not had_outdated and sys.modules.get("outdated", _MISSING) is None:
                del sys.modules["outdated"]
    try:
        from ogb.nodeproppred import dataset as ogb_dataset_mod
    except ImportError as e:
        raise ImportError(f"{name} needs the ogb package: pip install gsplit[ogb]") from e
    return ogb_dataset_mod


# What ogb's files may hold: numpy arrays (rebuilt by numpy's own reconstructor) and their dtypes.
_NUMPY_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles containers, numbers, strings and numpy arrays; refuses every other global (no code runs)."""

    def __init__(self, file, source: Path):
        super().__init__(file)
        self._source = source

    def find_class(self, module, name):
        if (module, name) in _NUMPY_GLOBALS or (module == "numpy.dtypes" and name.endswith("DType")):
            import importlib

            return getattr(importlib.import_module(module), name)
        raise ValueError(f"{self._source} holds a pickled reference to {module}.{name}, which an OGB dataset file "
                         f"never does: it may be crafted to run code, so it was not loaded; delete it (ogb rebuilds "
                         f"it from the raw files) or download the dataset again")

    def persistent_load(self, pid):
        raise ValueError(f"{self._source} holds torch tensors, which ogb's numpy files never do; delete it (ogb "
                         f"rebuilds it from the raw files)")


def load_numpy_pickle(path: os.PathLike):
    """Read a file ogb wrote with ``torch.save`` (numpy arrays in dicts and lists) without running any code.

    Torch's weights-only loader cannot read these files (pickle protocol 4 frames); this reads the zip's
    ``data.pkl`` with an unpickler that only rebuilds numpy arrays, and raises a one-line ``ValueError``
    naming the file for anything else.
    """
    p = Path(path)
    if not zipfile.is_zipfile(p):
        raise ValueError(f"{p} is not a file ogb writes (not a torch zip archive); delete it so that ogb rebuilds it")
    with zipfile.ZipFile(p) as z:
        names = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(names) != 1:
            raise ValueError(f"{p} has no single data.pkl; delete it so that ogb rebuilds it")
        data = z.read(names[0])
    try:
        return _NumpyOnlyUnpickler(io.BytesIO(data), p).load()
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file, whatever the unpickler trips on
        raise ValueError(f"{p} cannot be read ({type(e).__name__}: {e}); delete it so that ogb rebuilds it") from None


class _TorchForOgb:
    """Stands in for ``torch`` inside ogb: forwards everything, but ``load`` is :func:`load_numpy_pickle`
    (ogb pickles numpy arrays with protocol 4, which torch's weights-only unpickler cannot read, and
    switching the weights-only guard off would run any code a crafted file holds)."""

    def __init__(self, dataset_dir: Path):
        self._dir = dataset_dir.resolve()

    def __getattr__(self, attr):
        return getattr(torch, attr)

    def load(self, f, *args, **kwargs):
        del args, kwargs  # map_location and friends mean nothing for numpy arrays
        return load_numpy_pickle(f)


def _log_print(*args, **kwargs):
    log.info("ogb: %s", " ".join(str(a) for a in args).strip())


def _keep_existing_files(prompt: str = "") -> str:
    log.warning("ogb reports a newer release of this dataset than the files on disk (no RELEASE_v*.txt); "
                "using the files as they are. Delete the dataset folder to fetch the current release.")
    return "n"


def _confirm_download(prompt: str = "") -> str:
    log.warning("ogb: %s -> proceeding (download=True)", prompt.strip())
    return "y"


@contextlib.contextmanager
def _ogb_scoped(dataset_dir: Path):
    """Shadow ``torch``, ``input`` and ``print`` inside ogb's modules while ogb runs; restore after."""
    import ogb.io.read_graph_raw as raw_mod
    import ogb.nodeproppred.dataset as ds_mod
    import ogb.utils.url as url_mod

    patches = [
        (ds_mod, "torch", _TorchForOgb(dataset_dir)),
        (ds_mod, "input", _keep_existing_files),  # the only prompt there: "update the dataset now?"
        (ds_mod, "print", _log_print),
        (url_mod, "input", _confirm_download),    # the only prompt there: "download N GB?"
        (url_mod, "print", _log_print),
        (raw_mod, "print", _log_print),
    ]
    with _OGB_LOCK:
        saved = [(mod, attr, mod.__dict__.get(attr, _MISSING)) for mod, attr, _ in patches]
        for mod, attr, value in patches:
            setattr(mod, attr, value)
        try:
            yield
        finally:
            for mod, attr, old in saved:
                if old is _MISSING:
                    delattr(mod, attr)
                else:
                    setattr(mod, attr, old)
