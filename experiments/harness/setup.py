"""What every experiment sets up: paths, its arguments, its data, partition maps, and arrays for a peer.

gsplit is imported inside the functions that need it, so that a script that only parses its arguments
(``gpu_first_run.py``) runs where gsplit does not import, and the module stays cheap to import.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

REPO = Path(__file__).resolve().parents[2]
"""Root of the repository."""
DATA = REPO.parent / "shared" / "data"
"""The real graphs beside the project (absent on a user's machine: experiments then skip them)."""
RESULTS = REPO / "experiments" / "results"
"""Default output folder."""
DGL_PYTHON = REPO / ".venv-dgl" / "bin" / "python"
"""Interpreter of the DGL venv that ``./dev dgl-env`` builds (DGL 2.1 with torch 2.2)."""
GSPLIT_CLI = [sys.executable, "-m", "gsplit.cli"]
"""The gsplit command line under this interpreter (run from :data:`REPO`: this checkout's gsplit)."""
LABELS = {"cora": "cora", "bio": "bio-pathways"}
"""Labels of the named datasets in tables (synthetic graphs: ``synthetic-Nk``)."""


# ---------------------------------------------------------------------------------------- arguments
class ExperimentParser(argparse.ArgumentParser):
    """An argument parser whose :meth:`add_sized` options take their default from ``--quick``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sized: Dict[str, Tuple[object, object]] = {}

    def add_sized(self, *flags, quick, full, **kwargs) -> argparse.Action:
        """An option whose value, when not given (or given as ``0`` / empty), is ``quick`` with ``--quick`` and
        ``full`` without.

        Example:
            >>> p = make_parser("demo", out=False)
            >>> _ = p.add_sized("--nodes", quick=20_000, full=100_000, type=int)
            >>> _ = p.add_sized("--worlds", quick=[2], full=[2, 4], type=int_list)
            >>> a = p.parse_args(["--quick"]); (a.nodes, a.worlds)
            (20000, [2])
            >>> a = p.parse_args(["--worlds", "4,8"]); (a.nodes, a.worlds)
            (100000, [4, 8])
        """
        action = self.add_argument(*flags, default=None, **kwargs)
        self._sized[action.dest] = (quick, full)
        return action

    def parse_args(self, args=None, namespace=None):  # noqa: D102 - argparse's, with the sized defaults filled in
        ns = super().parse_args(args, namespace)
        for dest, (quick, full) in self._sized.items():
            if not getattr(ns, dest):
                setattr(ns, dest, quick if getattr(ns, "quick", False) else full)
        return ns


def make_parser(description: str, *, name: Optional[str] = None, out: bool = True,
                out_file: Optional[Union[str, Path]] = None, seed: bool = True,
                quick_help: str = "small sizes that finish in minutes on 2 cores") -> ExperimentParser:
    """The arguments every experiment takes: ``--quick``, ``--out`` and ``--seed``.

    ``--out`` is the output folder (default :data:`RESULTS`; the files are named by :func:`report.output_stem`),
    or with ``out_file`` the output file itself (``out_file`` its default; a ``.json`` ending is optional);
    ``out=False`` leaves it out. ``name`` adds ``--name`` (the file name in ``--out``, default ``name``);
    ``seed=False`` leaves ``--seed`` out (a script whose seeds are fixed).

    Example:
        >>> make_parser("demo").parse_args([]).quick, make_parser("demo", name="x").parse_args([]).name
        (False, 'x')
    """
    p = ExperimentParser(description=description)
    p.add_argument("--quick", action="store_true", help=quick_help)
    if out_file is not None:
        p.add_argument("--out", default=str(out_file),
                       help=f"output path: the JSON (and PNG) go to OUT.json (default {out_file})")
    elif out:
        p.add_argument("--out", default=str(RESULTS), help=f"output folder for JSON and PNG (default {RESULTS})")
    if name is not None:
        p.add_argument("--name", default=name, help=f"file name of the JSON (and PNG) in --out (default {name})")
    if seed:
        p.add_argument("--seed", type=int, default=0, help="seed of the data, the sampler, the global order and "
                                                          "the model")
    return p


def int_list(text: Union[str, Sequence[int]]) -> List[int]:
    """Comma-separated integers (empty items skipped); a list passes through.

    Example:
        >>> int_list("15,10,5"), int_list(""), int_list([2, 4])
        ([15, 10, 5], [], [2, 4])
    """
    if not isinstance(text, str):
        return [int(x) for x in text]
    return [int(x) for x in text.split(",") if x.strip()]


def add_dgl_python(p: argparse.ArgumentParser, default: Union[str, Path] = DGL_PYTHON,
                   help: str = "interpreter of the DGL venv (./dev dgl-env builds it)") -> None:
    """``--dgl-python``: the interpreter the DGL peer (``experiments/dgl_*.py``) runs under."""
    p.add_argument("--dgl-python", default=str(default), help=help)


def check_python(path: Union[str, Path], hint: str = "or pass --dgl-python") -> None:
    """Stop with what to do when the DGL venv's interpreter ``path`` does not exist."""
    if not Path(path).exists():
        raise SystemExit(f"{path} does not exist; build the DGL venv with ./dev dgl-env ({hint})")


def scratch(out: Union[str, Path], name: str = "") -> Path:
    """``OUT/scratch/NAME`` (git-ignored), made if absent: exports, maps and logs a script reuses."""
    folder = Path(out) / "scratch" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# ---------------------------------------------------------------------------------------- data
def data_file(name: str, data_dir: Union[str, Path] = DATA) -> Optional[Path]:
    """Path of a file in ``data_dir`` (``../shared/data``), or ``None`` (with a note on stderr) when it is absent."""
    p = Path(data_dir) / name
    if not p.exists():
        print(f"note: {p} is absent; skipping the experiments that need it", file=sys.stderr)
        return None
    return p


def load_named(key: str, num_nodes: int, seed: int = 0, data_dir: Union[str, Path] = DATA, **options):
    """The datasets of the experiments by short name; ``None`` if its file is absent.

    ``synthetic`` is :func:`gsplit.datasets.make_synthetic` with ``num_nodes`` vertices (average degree 15,
    64 features, 8 classes, 60/20/20 split; ``options`` change them); ``bio`` is the bio-pathways PPI graph
    with random features and labels; any other key names ``data_dir/KEY.npz`` (``cora``, ``citeseer``), with
    the Planetoid split (20 per class, 500 val, 1000 test, seed ``seed``).
    """
    from gsplit import datasets

    if key == "synthetic":
        return datasets.load("synthetic", num_nodes=num_nodes, seed=seed, **options)
    if key == "bio":
        p = data_file("bio-pathways-network.csv", data_dir)
        return None if p is None else datasets.load(f"edgelist:{p}", seed=seed)
    p = data_file(f"{key}.npz", data_dir)
    return None if p is None else datasets.load(f"npz:{p}", split="planetoid", split_seed=seed)


def label_of(key: str, num_nodes: int) -> str:
    """A dataset's label in tables: ``synthetic-100k``, ``cora``, ``bio-pathways``."""
    return f"synthetic-{num_nodes // 1000}k" if key == "synthetic" else LABELS.get(key, key)


def announce(label: str, ds, data_info: Optional[dict] = None) -> None:
    """Print one line about a dataset; record its summary in ``data_info[label]``."""
    if data_info is not None:
        data_info[label] = describe_dataset(ds)
    print(f"{label}: {ds.num_nodes:,} vertices, {ds.num_edges:,} edges, {ds.train_idx.numel():,} train", flush=True)


def each_dataset(keys: Union[str, Iterable[str]], num_nodes: int, seed: int, data_info: Optional[dict] = None,
                 data_dir: Union[str, Path] = DATA) -> Iterator[tuple]:
    """Yield ``(key, label, dataset)`` for the (comma-separated) ``keys`` that are present, one loaded at a time.

    Records each dataset's summary in ``data_info[label]`` and prints one line about it.
    """
    for key in [k for k in (keys.split(",") if isinstance(keys, str) else keys) if k]:
        ds = load_named(key, num_nodes, seed, data_dir)
        if ds is None:
            print(f"{key}: data not found, skipped", flush=True)
            continue
        label = label_of(key, num_nodes)
        announce(label, ds, data_info)
        yield key, label, ds
        del ds  # before the next one loads


def describe_dataset(ds) -> dict:
    """A JSON-ready summary of a dataset."""
    return {"name": ds.name, "num_nodes": ds.num_nodes, "num_edges": ds.num_edges, "feature_dim": ds.feature_dim,
            "num_classes": ds.num_classes, "train": int(ds.train_idx.numel()), "val": int(ds.val_idx.numel()),
            "test": int(ds.test_idx.numel()), "split": ds.meta.get("split"),
            "random_features": bool(ds.synthetic_features)}


# ---------------------------------------------------------------------------------------- partition maps
def make_map(ds, world: int, method: str, fanouts: Sequence[int], batch_size: int, seed: int = 0,
             presample_epochs: int = 10, weights=None) -> tuple:
    """Partition ``ds`` for ``world`` ranks with ``method`` (``batch_size`` per rank, as the loaders take it);
    returns the map, its timings and the weights. A thin wrapper of :func:`gsplit.prepare_partition`, the
    same code ``gsplit prepare`` runs; ``weights`` from an earlier call (same world and sampler) skip
    pre-sampling.
    """
    import gsplit

    prepared = gsplit.prepare_partition(ds, world, fanouts, batch_size, method, seed, presample_epochs,
                                        stats_batches=0, weights=weights)
    r = prepared.report
    return prepared.pmap, {"method": method, "world": world, "presample_s": r["presample_s"],
                           "partition_s": r["partition_s"], "presample_epochs": r["presample_epochs"]}, \
        (prepared.weights if prepared.weights is not None else weights)


# ---------------------------------------------------------------------------------------- arrays for a peer
def export_arrays(folder: Union[str, Path], arrays: Dict[str, object], meta: Optional[dict] = None) -> Path:
    """Write every tensor of ``arrays`` as ``folder/NAME.npy``, the files a DGL peer reads (``harness.peer``).

    With ``meta``, ``meta.json`` is written last (it marks a complete export) and an export whose
    ``meta.json`` equals ``meta`` is reused as it is.
    """
    import numpy as np

    folder = Path(folder)
    if meta is not None and (folder / "meta.json").exists() and json.loads((folder / "meta.json").read_text()) == meta:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for name, t in arrays.items():
        np.save(folder / f"{name}.npy", t.cpu().numpy() if hasattr(t, "cpu") else np.asarray(t))
    if meta is not None:
        (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    return folder
