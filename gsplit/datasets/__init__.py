"""Datasets: synthetic generators, real-graph file loaders and OGB, all returning a :class:`Dataset`.

``load(name, **kwargs)`` picks the loader from the name:

=====================  =============================================================================
``"synthetic"``        power-law graph with planted communities, :func:`make_synthetic`
``"npz:PATH"``         gnn-benchmark CSR ``.npz`` (Cora, CiteSeer), :func:`load_npz`
``"edgelist:PATH"``    CSV/TSV/whitespace edge list, random features and labels, :func:`load_edgelist`
``"ogbn-arxiv"`` etc.  OGB node-property datasets (needs ``gsplit[ogb]``), :func:`load_ogb`
``"folder:PATH"``      a prepared folder of memory-mapped ``.npy`` files, :func:`load_folder`
=====================  =============================================================================
"""

from __future__ import annotations

import inspect

from gsplit.datasets.base import Dataset, planetoid_split, random_split
from gsplit.datasets.files import load_edgelist, load_npz, read_edgelist
from gsplit.datasets.folder import is_folder, load_folder, save_folder
from gsplit.datasets.chunked import ConversionReport, convert_edgelist, convert_ogb
from gsplit.datasets.ogb import SUPPORTED as OGB_DATASETS
from gsplit.datasets.ogb import default_root, load_ogb
from gsplit.datasets.synthetic import make_synthetic, synthetic_graph
from gsplit.data.finite import check_finite
from gsplit.data import precision

NAMES = ("synthetic", "npz:PATH", "edgelist:PATH", "folder:PATH") + OGB_DATASETS
"""The accepted forms of ``load``'s ``name``."""


def _loader(name: str):
    """The loader function for ``name`` and the positional arguments the name itself supplies."""
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a string, got {type(name).__name__}; accepted: {', '.join(NAMES)}")
    if name == "synthetic":
        return make_synthetic, ()
    if name.startswith(("npz:", "edgelist:", "folder:")):
        kind, _, path = name.partition(":")
        if not path:
            raise ValueError(f"dataset name {name!r} has no path after '{kind}:'; write e.g. '{kind}:data/graph.csv'")
        return {"npz": load_npz, "edgelist": load_edgelist, "folder": load_folder}[kind], (path,)
    if name.startswith("ogbn-"):
        return load_ogb, (name,)
    raise ValueError(f"unknown dataset name {name!r}; accepted: {', '.join(NAMES)}")


def option_names(name: str) -> list:
    """The keyword options ``load(name, ...)`` accepts (the CLI checks ``-D`` options against them).

    Example:
        >>> "num_nodes" in option_names("synthetic")
        True
    """
    fn, args = _loader(name)
    return list(inspect.signature(fn).parameters)[len(args):]  # the name already supplied the leading ones


def option_defaults(name: str) -> dict:
    """The default value of each keyword option of ``load(name, ...)`` (options without one are left out);
    the CLI checks the type of ``-D`` values against them before loading.

    Example:
        >>> option_defaults("synthetic")["num_nodes"] > 0
        True
    """
    fn, args = _loader(name)
    params = list(inspect.signature(fn).parameters.values())[len(args):]
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def load(name: str, feature_dtype=None, **kwargs) -> Dataset:
    """Load or generate a dataset by name; keyword arguments go to the loader.

    ``feature_dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"``; default: as loaded) converts the features
    once, in chunks (:func:`gsplit.data.precision.cast_features`: rounded to nearest; float16 refuses values
    beyond its range). A folder already in that dtype stays memory-mapped.

    Names: ``"synthetic"`` (:func:`make_synthetic`), ``"npz:PATH"`` (:func:`load_npz`),
    ``"edgelist:PATH"`` (:func:`load_edgelist`), ``"ogbn-arxiv"``, ``"ogbn-products"``,
    ``"ogbn-papers100M"`` (:func:`load_ogb`), ``"folder:PATH"`` (:func:`load_folder`: memory-mapped).

    Example:
        >>> ds = load("synthetic", num_nodes=5000, seed=1)
        >>> ds.name, ds.num_nodes
        ('synthetic', 5000)
        >>> load("synthetic", num_nodes=5000, seed=1, feature_dtype="bfloat16").features.dtype
        torch.bfloat16
    """
    dtype = None if feature_dtype is None else precision.feature_dtype(feature_dtype)  # a bad name: before loading
    fn, args = _loader(name)
    unknown = sorted(set(kwargs) - set(option_names(name)))
    if unknown:
        raise TypeError(f"load({name!r}) got unexpected option(s) {unknown}; {fn.__name__} accepts {option_names(name)}")
    ds = fn(*args, **kwargs)
    ds.meta.setdefault("load", {"name": name, "options": dict(kwargs)})  # how to load it again (run log, model.pt)
    if dtype is not None and ds.features.dtype != dtype:
        ds.features = precision.cast_features(ds.features, dtype)
        ds.meta["load"]["options"]["feature_dtype"] = precision.dtype_name(dtype)
    return ds


__all__ = [
    "Dataset", "load", "option_names", "option_defaults", "NAMES", "make_synthetic", "synthetic_graph", "load_npz", "load_edgelist",
    "read_edgelist", "load_folder", "save_folder", "is_folder", "convert_edgelist", "convert_ogb",
    "ConversionReport", "load_ogb", "OGB_DATASETS", "default_root", "planetoid_split", "random_split", "check_finite",
]
